"""What a search strategy proposes and what it is told back (Optuna's ask/tell shape).

Lifecycle: the profiler calls `ask()` for the next SearchPoint -- a model-config variant (as the
fields it changes) and one load point on it. (Named apart from `optuna.Trial`, which the optuna
strategy also handles.) It builds the variant, loads it, measures the point and calls
`tell(trial, outcome)` before asking again; `ask()` returning None ends the search for that model.
Strategies are pure: they never launch, load or measure anything themselves.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analyzer.search.ledger import SharedPoint


@dataclass(frozen=True)
class SearchPoint:
    """One point to measure: `params` are the config fields the variant sets ({} = the model's own
    config), `load` is "concurrency" or "request_rate" with its `value`, at client `batch_size`."""

    params_json: str
    load: str
    value: int
    batch_size: int = 1

    @staticmethod
    def make(params: dict[str, Any], load: str, value: int, batch_size: int = 1) -> SearchPoint:
        return SearchPoint(json.dumps(params, sort_keys=True), load, value, batch_size)

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = json.loads(self.params_json)
        return params


@dataclass
class SearchLimits:
    """The caps and fixed values of one model's search (from the profile settings)."""

    own_max_batch_size: int  # the model's own max_batch_size; 0 = no batching
    min_model_batch_size: int = 1
    max_model_batch_size: int = 128
    min_instance_count: int = 1
    max_instance_count: int = 5
    min_concurrency: int = 1
    max_concurrency: int = 1024
    min_request_rate: int = 16
    max_request_rate: int = 8192
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    concurrency: list[int] = field(default_factory=list)  # fixed values: no sweep
    request_rate: list[int] = field(default_factory=list)
    request_rate_search: bool = False
    search_disable: bool = False
    early_exit: bool = False
    manual: dict[str, Any] = field(default_factory=dict)  # model_config_parameters
    sweep_disable: bool = False  # MA's concurrency_sweep_disable: no final sweeps (quick, optuna)
    concurrency_formula: bool = False  # MA's use_concurrency_formula (optuna)
    binary_search_steps: int = 5  # MA's run_config_search_max_binary_search_steps (brute)


@dataclass
class Outcome:
    """What the measurement of a SearchPoint told: `ok` False when the variant failed to load or
    serve (the strategy moves on to another variant); throughput in infer/s; whether the point
    broke a latency limit (sweeps may stop there). The profiler adds its objective score, the
    point's metrics and constraint values, and the stored point and config a shared study keeps."""

    ok: bool
    throughput: float = 0.0
    breaks_latency_limit: bool = False
    satisfies_constraints: bool = True
    score: float | None = None  # the objectives' weighted score; None: throughput decides
    metrics: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)  # optuna's constraint values
    measurement: dict[str, Any] | None = None  # the point as stored (shared studies)
    config: dict[str, Any] | None = None  # the variant's description and config text
    error: str = ""  # why a failed point failed

    @property
    def objective(self) -> float:
        return self.throughput if self.score is None else self.score


class SearchStrategy(ABC):
    @abstractmethod
    def ask(self) -> SearchPoint | None:
        """The next point to measure, or None when the search is over."""

    @abstractmethod
    def tell(self, trial: SearchPoint, outcome: Outcome) -> None:
        """The result of the last trial asked."""

    def close(self) -> None:  # noqa: B027 - most strategies hold nothing
        """Give back what the search holds (a shared study's claims and heartbeats)."""

    def shared_points(self) -> list[SharedPoint]:
        """Points other processes sharing this search's study measured; none for most."""
        return []


class WalkStrategy(SearchStrategy):
    """A strategy written as one generator: `_walk()` yields trials and reads `self._last` (the
    outcome told for the trial it just yielded) to decide what comes next."""

    def __init__(self) -> None:
        self._last: Outcome | None = None
        self._pending: SearchPoint | None = None
        self._steps: Generator[SearchPoint, None, None] | None = None

    @abstractmethod
    def _walk(self) -> Generator[SearchPoint, None, None]: ...

    def _told(self, trial: SearchPoint, outcome: Outcome) -> None:  # noqa: B027 - optional hook
        """Bookkeeping of subclasses, called by tell()."""

    def ask(self) -> SearchPoint | None:
        if self._pending is None:
            if self._steps is None:
                self._steps = self._walk()
            try:
                self._pending = next(self._steps)
            except StopIteration:
                return None
        return self._pending

    def tell(self, trial: SearchPoint, outcome: Outcome) -> None:
        if trial != self._pending:
            raise RuntimeError("tell() must answer the trial that ask() returned")
        self._last, self._pending = outcome, None
        self._told(trial, outcome)
