"""Quick search: a hill climb over instance count, max_batch_size, queue delay and concurrency.

Each state is one config at one concurrency, measured once. From the model's own config at MA's
starting concurrency (2 x max_batch_size x instances), the climb measures every neighbour one step
away along each axis (instance count +-1, max_batch_size x2 / /2, the next queue delay of the
space, concurrency x2 / /2), moves to the best that improves the score by more than `min_gain`,
and stops at a state no neighbour beats. The top configs then get a full concurrency sweep that
ends on MA's plateau rule -- not after four points, MA's regression.

Against MA's quick mode: queue delay and concurrency are climbed too, instead of concurrency
being fixed by formula; the final sweep is not cut short.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from analyzer.search.base import Outcome, SearchLimits, SearchPoint, WalkStrategy
from analyzer.search.space import SearchSpace, load_levels, manual_axes


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
        return score_of(outcome) if outcome.ok else None

    def _walk(self) -> Generator[SearchPoint, None, None]:
        # the model's own config first, over the concurrency levels around MA's formula
        start = self._start()
        yield from self._measure(self._trial({}, self.levels[start.concurrency_index]))
        current, current_score = start, (yield from self._evaluate(start))
        while current_score is not None:
            best, best_score = None, current_score
            for neighbour in self._neighbours(current):
                score = yield from self._evaluate(neighbour)
                if score is not None and score > best_score + abs(best_score) * self.min_gain:
                    best, best_score = neighbour, score
            if best is None:
                break
            current, current_score = best, best_score
        yield from self._final_sweeps()

    def _chosen(self) -> list[str]:
        """The configs whose load is swept at the end: the best few, and the default."""
        ranked = sorted(self.best_by_config, key=self.best_by_config.__getitem__, reverse=True)
        chosen = ranked[: self.top_configs]
        if "{}" not in chosen:
            chosen.append("{}")  # the default config gets its sweep too: the baseline
        return chosen

    def _final_sweeps(self) -> Generator[SearchPoint, None, None]:
        if self.limits.sweep_disable:  # MA's concurrency_sweep_disable
            return
        sweep = self.sweep
        for params_json in self._chosen():
            seen: list[float] = []
            for level in self.levels:
                trial = SearchPoint(params_json, self.load, level, self.batch)
                outcome = yield from self._measure(trial)
                if not outcome.ok:
                    break
                seen.append(outcome.throughput)
                if self.limits.early_exit and outcome.breaks_latency_limit:
                    break
                if not self.fixed_load and sweep.plateaued(seen):
                    break


def score_of(outcome: Outcome) -> float:
    """The profiler's objective score when it sent one; throughput otherwise. A point that breaks
    a constraint ranks below every point that meets them."""
    score = outcome.objective
    return score if outcome.satisfies_constraints else score - 1e6
