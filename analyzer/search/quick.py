"""Quick search: a hill climb over instance count, max_batch_size, queue delay and concurrency.

Each state is one config at one concurrency, measured once. From the model's own config at MA's
starting concurrency (2 x max_batch_size x instances), the climb measures every neighbour one step
away along each axis (instance count +-1, max_batch_size x2 / /2, the next queue delay of the
space, concurrency x2 / /2), moves to the best that improves the score by more than `min_gain`,
and stops at a state no neighbour beats. Scores are weighted sums of logs (Ranker.score), so the
gain is added to the score, not multiplied: a 1% gain is log(1.01) whatever the throughput's size.

A single climb ends at the first config no neighbour beats by 1%, and one-second points differ
by several % between minutes: on a flat top it stops wherever the noise stopped it. So before
the sweeps it looks around: every config whose best point lies within LOOK_BAND of the leader's,
among the `top_configs` best, has its neighbours measured at its best load, and the climb goes on
from any that beats the leader. The top configs then get a concurrency sweep outward from their
best measured load (up while a level gains, down while one stays within the plateau gain), which
finds the same best load as an ascending sweep from concurrency 1 with about half the points.

Against MA's quick mode: queue delay and concurrency are climbed too, instead of concurrency
being fixed by formula; the top of the climb is looked around; the final sweep ends on the
plateau rule, not after four points.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from analyzer.search.base import Outcome, SearchLimits, SearchPoint, WalkStrategy
from analyzer.search.space import SearchSpace, load_levels, manual_axes

# configs whose best point lies within this of the leader's are looked around: twice the ~5% that
# one-second points of one config move between minutes on a shared 2-core VM (BENCHMARKS.md)
LOOK_BAND = 0.10
# at most this many configs per top config are looked around: on a wide flat top each look can
# bring a new config into the top few (in 800 simulated runs on tiny_cnn's space it never bound)
LOOK_LIMIT = 2


@dataclass(frozen=True)
class State:
    instances: int
    batch_index: int  # index into the max_batch_size values
    delay_index: int  # index into the queue delays
    concurrency_index: int  # index into the concurrency values


class QuickSearch(WalkStrategy):
    def __init__(
        self, space: SearchSpace, limits: SearchLimits, top_configs: int = 3,
        min_gain: float = 0.01,
    ) -> None:  # fmt: skip
        super().__init__()
        self.space = space
        self.limits = limits
        self.top_configs = top_configs
        self.min_gain = min_gain
        self.counts = space.instance_count.values(limits.min_instance_count,
                                                  limits.max_instance_count)  # fmt: skip
        self.sizes = space.max_batch_size.values(limits.min_model_batch_size,
                                                 limits.max_model_batch_size)  # fmt: skip
        self.delays = space.queue_delays_us
        counts, sizes, delays = manual_axes(limits.manual)  # model_config_parameters' values
        self.listed_counts, self.listed_sizes = counts is not None, sizes is not None
        self.counts, self.sizes = counts or self.counts, sizes or self.sizes
        self.delays = delays or self.delays
        # the load climbed: concurrency, or request rate (request_rate given, or its search)
        self.load, self.levels, sweep = load_levels(space, limits)
        self.fixed_load = sweep is None  # values the user gave: all measured in the sweeps
        self.sweep = sweep or space.concurrency
        self.batch = min(limits.batch_sizes)
        self.asked: dict[SearchPoint, Outcome] = {}
        self.best_by_config: dict[str, float] = {}
        self.scored: dict[Any, float] = {}  # climb state -> its score (states the walk measured)

    def _told(self, trial: SearchPoint, outcome: Outcome) -> None:
        self.asked[trial] = outcome
        if outcome.ok:
            score = score_of(outcome)
            key = trial.params_json
            self.best_by_config[key] = max(self.best_by_config.get(key, score), score)

    # ---- the walk ------------------------------------------------------------------------------
    def _params(self, state: State) -> dict[str, Any]:
        if self.limits.own_max_batch_size <= 0:
            return {"instance_count": state.instances}
        mbs = self.sizes[state.batch_index]
        delay = self.delays[state.delay_index] if mbs > 1 else self.delays[0]
        return {"instance_count": state.instances, "max_batch_size": mbs,
                "max_queue_delay_microseconds": delay}  # fmt: skip

    def _trial(self, params: dict[str, Any], concurrency: int) -> SearchPoint:
        return SearchPoint.make(params, self.load, concurrency, self.batch)

    def _measure(self, trial: SearchPoint) -> Generator[SearchPoint, None, Outcome]:
        if trial not in self.asked:
            yield trial
        return self.asked[trial]

    def _start(self) -> State:
        count = self.counts[0]
        size = 0
        if self.limits.own_max_batch_size > 0:
            own = min(self.limits.own_max_batch_size, self.sizes[-1])
            size = max(i for i, s in enumerate(self.sizes) if s <= max(own, self.sizes[0]))
        mbs = self.sizes[size] if self.limits.own_max_batch_size > 0 else 1
        return State(count, size, 0, self._start_level(2 * mbs * count))

    def _start_level(self, formula: int) -> int:
        """The load level a climb starts at: MA's quick-mode concurrency formula; a request
        rate has no such formula, so the middle of its levels."""
        if self.load == "request_rate":
            return len(self.levels) // 2
        return min(range(len(self.levels)), key=lambda i: abs(self.levels[i] - formula))

    def _neighbours(self, s: State) -> list[State]:
        out = []
        i = self.counts.index(s.instances)
        for j in (i - 1, i + 1):
            if 0 <= j < len(self.counts):
                out.append(State(self.counts[j], s.batch_index, s.delay_index, s.concurrency_index))
        if self.limits.own_max_batch_size > 0:
            for b in (s.batch_index - 1, s.batch_index + 1):
                if 0 <= b < len(self.sizes):
                    out.append(State(s.instances, b, s.delay_index, s.concurrency_index))
            if self.sizes[s.batch_index] > 1:
                for d in (s.delay_index - 1, s.delay_index + 1):
                    if 0 <= d < len(self.delays):
                        out.append(State(s.instances, s.batch_index, d, s.concurrency_index))
        for c in (s.concurrency_index - 1, s.concurrency_index + 1):
            if 0 <= c < len(self.levels):
                out.append(State(s.instances, s.batch_index, s.delay_index, c))
        return out

    def _evaluate(self, state: State) -> Generator[SearchPoint, None, float | None]:
        outcome = yield from self._measure(
            self._trial(self._params(state), self.levels[state.concurrency_index]))
        if not outcome.ok:
            return None
        self.scored[state] = score_of(outcome)
        return self.scored[state]

    def _beats(self, score: float, than: float) -> bool:
        """Whether `score` is better than `than` by more than min_gain (log scores: additive)."""
        return score > than + math.log1p(self.min_gain)

    def _climb(self, current: State, score: float | None) -> Generator[SearchPoint, None, None]:
        while score is not None:
            best, best_score = None, score
            for neighbour in self._neighbours(current):
                found = yield from self._evaluate(neighbour)
                if found is not None and self._beats(found, best_score):
                    best, best_score = neighbour, found
            if best is None:
                return
            current, score = best, best_score

    def _config_bests(self) -> list[tuple[State, float]]:
        """Each config the walk measured, at its best-scoring load, best first."""
        bests: dict[str, tuple[State, float]] = {}
        for state, score in self.scored.items():
            key = json.dumps(self._params(state), sort_keys=True)
            if key not in bests or score > bests[key][1]:
                bests[key] = (state, score)
        return sorted(bests.values(), key=lambda item: item[1], reverse=True)

    def _look_around(self) -> Generator[SearchPoint, None, None]:
        """Measures the neighbours (same load) of the top configs near the leader, once each;
        climbs on from any that beats the leader, then looks again around the new top."""
        looked: set[State] = set()
        while len(looked) < LOOK_LIMIT * self.top_configs:  # bounded on a wide flat top
            ranked = self._config_bests()
            if not ranked:
                return
            lead = ranked[0][1]
            floor = lead - math.log1p(LOOK_BAND)
            todo = [state for state, score in ranked[: self.top_configs]
                    if score >= floor and state not in looked]  # fmt: skip
            if not todo:
                return
            state = todo[0]
            looked.add(state)
            for neighbour in self._neighbours(state):
                if neighbour.concurrency_index != state.concurrency_index:
                    continue
                found = yield from self._evaluate(neighbour)
                if found is not None and self._beats(found, lead):
                    yield from self._climb(neighbour, found)
                    break

    def _walk(self) -> Generator[SearchPoint, None, None]:
        # the model's own config first, over the concurrency levels around MA's formula
        start = self._start()
        yield from self._measure(self._trial({}, self.levels[start.concurrency_index]))
        yield from self._climb(start, (yield from self._evaluate(start)))
        yield from self._look_around()
        yield from self._final_sweeps()

    def _chosen(self) -> list[str]:
        """The configs whose load is swept at the end: the best few, and the default."""
        ranked = sorted(self.best_by_config, key=self.best_by_config.__getitem__, reverse=True)
        chosen = ranked[: self.top_configs]
        if "{}" not in chosen:
            chosen.append("{}")  # the default config gets its sweep too: the baseline
        return chosen

    def _final_sweeps(self) -> Generator[SearchPoint, None, None]:
        """Each chosen config's best load, found outward from the best level the walk measured:
        up while a level beats the best throughput so far by the plateau gain and still meets
        the constraints, then down while a level meeting them stays within that gain of the best
        (a latency constraint may put the best load lower). Ascending sweeps from concurrency 1
        measured about twice as many points for the same best loads. Fixed load values are all
        measured, as asked. None with MA's concurrency_sweep_disable."""
        if self.limits.sweep_disable:
            return
        for params_json in self._chosen():
            if self.fixed_load:
                for index in range(len(self.levels)):
                    outcome = yield from self._measure(self._trial_at(params_json, index))
                    if not outcome.ok or (self.limits.early_exit and outcome.breaks_latency_limit):
                        break
                continue
            yield from self._sweep_outward(params_json)

    def _sweep_outward(self, params_json: str) -> Generator[SearchPoint, None, None]:
        gain = self.sweep.plateau_min_gain
        known = {t.value: o for t, o in self.asked.items() if o.ok
                 and t.params_json == params_json and t.batch_size == self.batch
                 and t.value in self.levels}  # fmt: skip
        start = (self.levels.index(max(known, key=lambda v: score_of(known[v]))) if known
                 else self._start().concurrency_index)  # fmt: skip
        top: float | None = None  # the best throughput of a point meeting the constraints
        for index in range(start, len(self.levels)):  # up
            outcome = yield from self._measure(self._trial_at(params_json, index))
            if not outcome.ok or not outcome.satisfies_constraints:
                break  # more load only adds latency
            better = top is None or outcome.throughput > top * (1.0 + gain)
            top = max(top or 0.0, outcome.throughput)
            if not better:
                break
        for index in range(start - 1, -1, -1):  # down
            outcome = yield from self._measure(self._trial_at(params_json, index))
            if not outcome.ok:
                break
            if outcome.satisfies_constraints:
                if top is not None and outcome.throughput < top * (1.0 - gain):
                    break  # falling: less load only lowers it further
                top = max(top or 0.0, outcome.throughput)

    def _trial_at(self, params_json: str, index: int) -> SearchPoint:
        return SearchPoint(params_json, self.load, self.levels[index], self.batch)


def score_of(outcome: Outcome) -> float:
    """The profiler's objective score (a weighted sum of logs) when it sent one; the log of the
    throughput otherwise, on the same scale. A point that breaks a constraint ranks below every
    point that meets them."""
    score = outcome.score if outcome.score is not None else math.log(max(outcome.throughput, 1e-9))
    return score if outcome.satisfies_constraints else score - 1e6
