"""Ranking configs by weighted objectives under constraints.

MA compares two measurements by the weighted sum of their relative differences per objective
(weights normalised to 1). We use the log ratio instead of the difference over the mean: the same
to first order, but it makes the comparison a score (a total order), so sorting is consistent.
Each config is represented by its best point that satisfies every constraint; configs with no such
point rank after all that have one, each by its best point overall.
A config re-measured in the final comparison (`analyzer.results.finals`) is represented by the
mean of its rounds instead, and the finalists rank before the configs known from one search point.
A finalist that left the race ran fewer rounds; it ranks by its difference to the leader paired
over the rounds both ran, not by its own mean (a drifting machine moves a mean of fewer rounds).

With several objectives searched as such (optuna_objectives: e.g. throughput vs p99 latency vs GPU
memory) there is no single best; the configs with a point on the Pareto front -- no other point
meeting the constraints is at least as good on every objective and better on one -- rank before
the dominated ones (finalists first within each group), each group by the weighted score. A
finalist's point on that front is the mean of its rounds too: the default config, always a
finalist, may be dominated there, and then it ranks after the front.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.metrics import base_tag, direction, unit
from analyzer.results.finals import Comparison, FinalResult
from analyzer.results.measurement import Measurement

if TYPE_CHECKING:
    from analyzer.results.outcome import ProfileOutcome


@dataclass
class ConfigResult:
    """One config of one model: what it set, where it lives, what it measured, how it ranked."""

    model: str
    name: str
    params: dict[str, Any]
    description: dict[str, Any]
    config_text: str
    path: str
    is_default: bool = False
    measurements: list[Measurement] = field(default_factory=list)
    error: str = ""  # the config failed to load or serve: the worker's reason
    best: Measurement | None = None
    satisfies: bool = False
    violations: list[str] = field(default_factory=list)
    score: float = 0.0
    rank: int = 0
    pareto: bool = False  # a point of it is on the Pareto front of the multi-objective search
    final: FinalResult | None = None  # its rounds in the final comparison, when it was in it
    # a BLS variant's composing models: (name it calls, variant folder) served under that name
    # before it is loaded
    serve_first: list[tuple[str, str]] = field(default_factory=list)
    # models profiled together: each model's variant, (model, variant folder, its config text),
    # all loaded at once and measured side by side (results/together.py)
    together: list[tuple[str, str, str]] = field(default_factory=list)


class Ranker:
    def __init__(self, objectives: dict[str, float], constraints: dict[str, dict[str, float]],
                 pareto: tuple[str, ...] | list[str] = ()) -> None:  # fmt: skip
        total = sum(objectives.values()) or 1.0
        self.weights = {tag: w / total for tag, w in objectives.items()}
        self.constraints = constraints
        self.pareto = tuple(pareto)

    def violations(self, m: Measurement) -> list[str]:
        out = []
        for tag, bounds in self.constraints.items():
            value = m.metric(tag)
            if value is None:
                continue  # e.g. a GPU limit on a CPU-only run: nothing to violate
            if "min" in bounds and value < bounds["min"]:
                out.append(f"{tag} {value:.4g} {unit(tag)} < min {bounds['min']:g}")
            if "max" in bounds and value > bounds["max"]:
                out.append(f"{tag} {value:.4g} {unit(tag)} > max {bounds['max']:g}")
        return out

    def constraint_values(self, m: Measurement) -> dict[str, float]:
        """Each bound as a relative excess (<= 0 when met), the form Optuna's constraints take."""
        out = {}
        for tag, bounds in self.constraints.items():
            value = m.metric(tag)
            if value is None:
                continue
            if "max" in bounds:
                out[f"{tag}.max"] = (value - bounds["max"]) / max(abs(bounds["max"]), 1e-9)
            if "min" in bounds:
                out[f"{tag}.min"] = (bounds["min"] - value) / max(abs(bounds["min"]), 1e-9)
        return out

    def breaks_latency_limit(self, m: Measurement) -> bool:
        return any(
            "max" in b and base_tag(tag).startswith("perf_latency")
            and (m.metric(tag) or 0) > b["max"]
            for tag, b in self.constraints.items()
        )

    def score(self, m: Measurement, tags: set[str] | None = None) -> float:
        total = 0.0
        for tag, weight in self.weights.items():
            if tags is not None and tag not in tags:
                continue
            value = m.metric(tag)
            if value is None:
                continue
            sign = 1.0 if direction(tag) else -1.0
            total += weight * sign * math.log(max(value, 1e-9))
        return total

    def rank(self, results: list[ConfigResult]) -> list[ConfigResult]:
        """Sets best/satisfies/score/rank on each result; returns them best first (failed last)."""
        measured = [r for r in results if r.measurements]
        everywhere = None
        for r in measured:
            for m in r.measurements:
                present = {t for t in self.weights if m.metric(t) is not None}
                everywhere = present if everywhere is None else everywhere & present
        tags = everywhere or set()
        for r in measured:
            points = self.evidence(r)
            passing = [m for m in points if not self.violations(m)]
            pool = passing or points
            r.best = max(pool, key=lambda m: self.score(m, tags))
            r.satisfies = bool(passing)
            r.violations = [] if passing else self.violations(r.best)
            r.score = self.score(r.best, tags)
        front = self.pareto_front([m for r in measured for m in self.evidence(r)])
        for r in measured:
            r.pareto = any(id(m) in front for m in self.evidence(r))
        value = self._drift_free(measured)
        ordered = sorted(measured, key=lambda r: (not r.satisfies, not r.pareto, r.final is None,
                                                  -value.get(id(r), r.score)))  # fmt: skip
        failed = [r for r in results if not r.measurements]
        for i, r in enumerate(ordered, 1):
            r.rank = i
        return ordered + failed

    @staticmethod
    def _drift_free(measured: list[ConfigResult]) -> dict[int, float]:
        """Scores of the finalists that left the race, by the leader's score plus their paired
        difference to it over the rounds both ran: their own mean is over fewer, earlier rounds,
        which a drifting machine makes higher or lower than the finishers' (empty until the
        comparison has concluded)."""
        leader = next((r for r in measured if r.final is not None and not r.final.left_race
                       and r.final.tied and r.final.vs_leader is None), None)  # fmt: skip
        if leader is None:
            return {}
        return {id(r): leader.score + r.final.vs_leader.estimate for r in measured
                if r.final is not None and r.final.left_race
                and r.final.vs_leader is not None}  # fmt: skip

    @staticmethod
    def evidence(r: ConfigResult) -> list[Measurement]:
        """What a config is judged by: a finalist by the mean of its side-by-side rounds, any
        other by its search points."""
        return [r.final.combined] if r.final is not None else r.measurements

    def dominated_finalists(self, finals: dict[str, FinalResult]) -> set[str]:
        """With Pareto objectives, the finalists another finalist's rounds beat on every one of
        them (at least as good on each, better on one): none of these is recommended."""
        if not self.pareto:
            return set()
        front = self.pareto_front([f.combined for f in finals.values()])
        return {name for name, f in finals.items() if id(f.combined) not in front
                and any(f.combined.metric(t) is not None for t in self.pareto)}  # fmt: skip

    def pareto_front(self, points: list[Measurement]) -> set[int]:
        """ids of the measurements on the Pareto front of the `pareto` objectives, among the
        points that meet the constraints (all points when none does)."""
        tags = [t for t in self.pareto
                if any(m.metric(t) is not None for m in points)]  # fmt: skip
        if not tags:
            return set()
        feasible = [m for m in points if not self.violations(m)] or points
        signs = [1.0 if direction(t) else -1.0 for t in tags]
        vectors = {id(m): [s * (m.metric(t) or 0.0) for s, t in zip(signs, tags, strict=True)]
                   for m in feasible if all(m.metric(t) is not None for t in tags)}  # fmt: skip

        def dominated(a: list[float]) -> bool:
            return any(all(x >= y for x, y in zip(b, a, strict=True)) and b != a
                       for b in vectors.values())  # fmt: skip

        return {key for key, v in vectors.items() if not dominated(v)}


def recommended_first(
    ranked: list[ConfigResult], comparison: Comparison | None
) -> list[ConfigResult]:
    """The final comparison's recommendation (the cheapest of those tied with the leader) first."""
    chosen = comparison.recommended if comparison is not None else ""
    if not chosen or not ranked or ranked[0].name == chosen:
        return ranked
    first = next((r for r in ranked if r.name == chosen), None)
    if first is None:
        return ranked
    ordered = [first] + [r for r in ranked if r is not first]
    for i, r in enumerate(ordered, 1):
        if r.measurements:
            r.rank = i
    return ordered


def top_across_models(outcome: ProfileOutcome) -> list[ConfigResult]:
    """MA's num_top_model_configs: the best configs of all models in one ranking (meaningful
    when the models share their objectives). Each model's configs keep its own order (its
    recommendation first, a finalist that left the race placed by its paired difference), and
    the models' lists are merged by score: a bare sort by score could list a config above the
    one its own model's side-by-side rounds put ahead of it."""
    queues = [[r for r in m.results if r.best is not None] for m in outcome.models]
    chosen: list[ConfigResult] = []
    while len(chosen) < outcome.config.num_top_model_configs and any(queues):
        head = min((q for q in queues if q), key=lambda q: (not q[0].satisfies, -q[0].score))
        chosen.append(head.pop(0))
    return chosen
