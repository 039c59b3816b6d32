"""Brute-force search: the default config, then every variant of the space, each over a load sweep.

Order and early stops follow NVIDIA Model Analyzer's brute mode, plus the queue delay dimension:
for each instance count, max_batch_size doubles from the lower cap, every queue delay is tried at
each max_batch_size (delays only matter when a batch can hold two requests), and the doubling stops
once the best throughput at a max_batch_size no longer beats every smaller one. Each variant's load
sweep (powers of two) stops on MA's plateau rule, or -- with early exit -- at the first point
that breaks a latency limit. MA's early_exit_enable also stops fixed load values and client batch
sizes on the plateau rule, and a manual search's larger max_batch_size values once one does not
beat the smaller ones. After the search, MA's binary search refines the load of the top configs
at their constraint boundary.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator
from typing import Any

from analyzer.search.base import Outcome, SearchLimits, SearchPoint, WalkStrategy
from analyzer.search.space import SearchSpace, load_levels


def expand_manual(value: Any) -> list[Any]:
    """MA's model_config_parameters: a list of scalars (or of lists) is a choice; a list of
    mappings is one structured value (e.g. instance_group) whose insides may hold choices."""
    if isinstance(value, dict):
        keys = list(value)
        options = [expand_manual(value[k]) for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*options)]
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return [list(combo) for combo in itertools.product(*(expand_manual(v) for v in value))]
        choices: list[Any] = []
        for choice in value:  # a choice that is a list of mappings (MA's instance_group as a
            # list of lists) may hold choices inside, as MA expands them
            if isinstance(choice, list) and choice and all(isinstance(v, dict) for v in choice):
                choices.extend(expand_manual(choice))
            else:
                choices.append(choice)
        return choices
    return [value]


class BruteSearch(WalkStrategy):
    def __init__(self, space: SearchSpace, limits: SearchLimits, top_configs: int = 3) -> None:
        super().__init__()
        self.space = space
        self.limits = limits
        self.top_configs = top_configs
        # every point told, by (config, client batch size) and load value
        self.told: dict[tuple[str, int], dict[int, Outcome]] = {}

    def _told(self, trial: SearchPoint, outcome: Outcome) -> None:
        self.told.setdefault((trial.params_json, trial.batch_size), {})[trial.value] = outcome

    def _walk(self) -> Generator[SearchPoint, None, None]:
        yield from self._variants()
        yield from self._boundary_searches()

    def _variants(self) -> Generator[SearchPoint, None, None]:
        limits = self.limits
        yield from self._sweep({}, limits.own_max_batch_size)
        if limits.manual:
            yield from self._manual(expand_manual(limits.manual))
            return
        if limits.search_disable:
            return
        counts = self.space.instance_count.values(
            limits.min_instance_count, limits.max_instance_count
        )
        for count in counts:
            if limits.own_max_batch_size <= 0:  # no batching: only the instance count varies
                yield from self._sweep({"instance_count": count}, 0)
                continue
            chain: list[float] = []
            sizes = self.space.max_batch_size.values(
                limits.min_model_batch_size, limits.max_model_batch_size
            )
            for mbs in sizes:
                delays = self.space.queue_delays_us if mbs > 1 else self.space.queue_delays_us[:1]
                best = 0.0
                for delay in delays:
                    params = {"instance_count": count, "max_batch_size": mbs,
                              "max_queue_delay_microseconds": delay}  # fmt: skip
                    best = max(best, (yield from self._sweep(params, mbs)))
                if best <= 0:
                    break  # every delay failed at this size: larger ones will not load either
                chain.append(best)
                if self.space.stop_when_not_better and any(best <= t for t in chain[:-1]):
                    break

    def _manual(self, options: list[dict[str, Any]]) -> Generator[SearchPoint, None, None]:
        """MA's manual search (model_config_parameters), in its order. With early_exit_enable,
        as MA: among options that differ only in max_batch_size, larger ones are skipped once
        one fails or does not beat every smaller one."""
        chains: dict[str, list[float]] = {}
        stopped: set[str] = set()
        for option in options:
            mbs = int(option.get("max_batch_size", self.limits.own_max_batch_size))
            rest = json.dumps({k: v for k, v in option.items() if k != "max_batch_size"},
                              sort_keys=True)  # fmt: skip
            if rest in stopped:
                continue
            best = yield from self._sweep(option, mbs)
            chain = chains.setdefault(rest, [])
            if self.limits.early_exit and (best <= 0 or any(best <= b for b in chain)):
                stopped.add(rest)
            chain.append(best)

    def _sweep(
        self, params: dict[str, Any], max_batch_size: int
    ) -> Generator[SearchPoint, None, float]:
        """Every client batch size, each over the load sweep; returns the best throughput seen
        (0 when the variant failed). As MA: a swept load stops on the plateau rule, and so do
        fixed load values and the client batch sizes with early_exit_enable (or, for the batch
        sizes, when the load is swept); with early exit a sweep also stops at the first point
        that breaks a latency limit."""
        load, values, sweep = load_levels(self.space, self.limits)
        early = self.limits.early_exit
        plateau = sweep is not None or early  # fixed values stop on it only with early exit
        rule = sweep or (self.space.request_rate if load == "request_rate"
                         else self.space.concurrency)  # fmt: skip
        best = 0.0
        by_batch: list[float] = []
        for batch in self.limits.batch_sizes:
            if max_batch_size > 0 and batch > max_batch_size:
                continue  # the server would refuse it
            if max_batch_size <= 0 and batch > 1:
                continue
            seen: list[float] = []
            for value in values:
                yield SearchPoint.make(params, load, value, batch)
                outcome = self._last
                assert outcome is not None
                if not outcome.ok:
                    return best
                seen.append(outcome.throughput)
                best = max(best, outcome.throughput)
                if early and outcome.breaks_latency_limit:
                    break
                if plateau and rule.plateaued(seen):
                    break
            by_batch.append(max(seen))
            if plateau and rule.plateaued(by_batch):
                break  # MA: no larger client batch once throughput stops growing with it
        return best

    def _boundary_searches(self) -> Generator[SearchPoint, None, None]:
        """MA's binary search after brute mode: for the top configs and the default, where a
        sweep went from a point that meets the constraints to one that does not (or began with
        one that does not), the load between the two is bisected in at most
        `binary_search_steps` points, so the best load within the constraints is found between
        two powers of two. Not with fixed load values (MA's rule)."""
        limits = self.limits
        if limits.binary_search_steps <= 0 or limits.concurrency or limits.request_rate:
            return
        load = load_levels(self.space, self.limits)[0]
        best: dict[str, float] = {}
        for (params_json, _), points in self.told.items():
            for outcome in points.values():
                if outcome.ok and outcome.satisfies_constraints:
                    best[params_json] = max(best.get(params_json, outcome.objective),
                                            outcome.objective)  # fmt: skip
        chosen = sorted(best, key=best.__getitem__, reverse=True)[: self.top_configs]
        chosen += [] if "{}" in chosen else ["{}"]
        for (params_json, batch), points in list(self.told.items()):
            if params_json not in chosen:
                continue
            bounds = _failure_boundary(points)
            if bounds is None:
                continue
            passing, failing = bounds
            for _ in range(limits.binary_search_steps):
                value = int((passing + failing) / 2)
                if value <= passing or value >= failing or value in points:
                    break
                yield SearchPoint(params_json, load, value, batch)
                last = self._last
                assert last is not None
                if not last.ok:
                    break
                if last.satisfies_constraints:
                    passing = value
                else:
                    failing = value


def _failure_boundary(points: dict[int, Outcome]) -> tuple[int, int] | None:
    """(the last load that meets the constraints, the next that does not) of one sweep; (0,
    the first) when its first point already fails; None when no point of it fails."""
    values = sorted(v for v, o in points.items() if o.ok)
    for low, high in zip(values, values[1:], strict=False):
        if points[low].satisfies_constraints and not points[high].satisfies_constraints:
            return low, high
    if values and not points[values[0]].satisfies_constraints:
        return 0, values[0]
    return None
