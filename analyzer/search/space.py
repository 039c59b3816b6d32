"""A search space read from `search_spaces/*.yaml`: how to walk between the configured caps.

The caps (run_config_search_{min,max}_*) come from the profile settings; the file says which values
lie between them (powers of two, linear steps, listed delays) and when a walk stops early.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.config.yaml_file import YamlFileError, read_user_yaml
from analyzer.errors import AnalyzerError

if TYPE_CHECKING:
    from analyzer.search.base import SearchLimits

# the repository's top-level search_spaces/, shipped in the wheel as the package's data (in the
# source tree analyzer/search_spaces is a link to it), so an installed copy finds it too
SPACES = Path(str(files("analyzer") / "search_spaces"))
DEFAULT_SPACE = SPACES / "default.yaml"


class SearchSpaceError(AnalyzerError):
    """The search space file is unusable; the message names the file and key."""


@dataclass
class Sweep:
    scale: str = "powers_of_two"
    step: int = 1
    plateau_window: int = 4
    plateau_min_gain: float = 0.05

    def plateaued(self, seen: list[float]) -> bool:
        """MA's rule: the best of the last `plateau_window` points is at most `plateau_min_gain`
        above the first of them."""
        if len(seen) < self.plateau_window:
            return False
        recent = seen[-self.plateau_window :]
        return recent[0] > 0 and (max(recent) - recent[0]) / recent[0] <= self.plateau_min_gain

    def values(self, low: int, high: int) -> list[int]:
        if self.scale == "linear":
            return list(range(low, high + 1, self.step))
        out, value = [], 1
        while value < low:
            value *= 2
        while value <= high:
            out.append(value)
            value *= 2
        if not out or out[0] != low:
            out.insert(0, low)  # the lower cap itself is always measured (MA does the same)
        return out


@dataclass
class SearchSpace:
    source: str
    max_batch_size: Sweep = field(default_factory=Sweep)
    stop_when_not_better: bool = True
    instance_count: Sweep = field(default_factory=lambda: Sweep(scale="linear"))
    queue_delays_us: list[int] = field(default_factory=lambda: [0])
    concurrency: Sweep = field(default_factory=Sweep)
    request_rate: Sweep = field(default_factory=Sweep)


_KEYS = {"max_batch_size", "instance_count", "dynamic_batching", "concurrency", "request_rate"}
_SWEEP_KEYS = {"scale", "step", "plateau_window", "plateau_min_gain",
               "stop_when_not_better_than_all_smaller"}  # fmt: skip


def _sweep(data: Any, key: str, source: str, default: Sweep) -> tuple[Sweep, dict[str, Any]]:
    if data is None:
        return default, {}
    if not isinstance(data, dict) or set(data) - _SWEEP_KEYS:
        raise SearchSpaceError(
            f"{source}: '{key}' is {data!r}; keys: {', '.join(sorted(_SWEEP_KEYS))}"
        )
    sweep = Sweep(
        scale=str(data.get("scale", default.scale)),
        step=data.get("step", default.step),
        plateau_window=data.get("plateau_window", default.plateau_window),
        plateau_min_gain=data.get("plateau_min_gain", default.plateau_min_gain),
    )
    if sweep.scale not in ("powers_of_two", "linear"):
        raise SearchSpaceError(
            f"{source}: '{key}.scale' is {sweep.scale!r}; expected powers_of_two or linear"
        )
    for name in ("step", "plateau_window"):
        value = getattr(sweep, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SearchSpaceError(f"{source}: '{key}.{name}' is {value!r}; expected an int >= 1")
    gain = sweep.plateau_min_gain
    if isinstance(gain, bool) or not isinstance(gain, int | float) or gain < 0:
        raise SearchSpaceError(
            f"{source}: '{key}.plateau_min_gain' is {gain!r}; expected a number >= 0"
        )
    return sweep, data


def load_search_space(path: str | Path | None = None) -> SearchSpace:
    path = Path(path) if path else DEFAULT_SPACE
    source = str(path)
    try:
        data = read_user_yaml(path, "search space")
    except YamlFileError as err:
        raise SearchSpaceError(str(err)) from None
    if not isinstance(data, dict):
        raise SearchSpaceError(f"search space '{path}' must be a mapping of settings (keys: "
                               f"{sorted(_KEYS)})")  # fmt: skip
    if set(data) - _KEYS:
        unknown = sorted(set(data) - _KEYS)
        raise SearchSpaceError(f"{source}: key '{unknown[0]}' is unknown; keys: {sorted(_KEYS)}")
    space = SearchSpace(source)
    space.max_batch_size, raw = _sweep(data.get("max_batch_size"), "max_batch_size", source,
                                       space.max_batch_size)  # fmt: skip
    space.stop_when_not_better = bool(raw.get("stop_when_not_better_than_all_smaller", True))
    space.instance_count, _ = _sweep(data.get("instance_count"), "instance_count", source,
                                     space.instance_count)  # fmt: skip
    space.concurrency, _ = _sweep(data.get("concurrency"), "concurrency", source, space.concurrency)
    space.request_rate, _ = _sweep(data.get("request_rate"), "request_rate", source,
                                   space.request_rate)  # fmt: skip
    batching = data.get("dynamic_batching") or {}
    delays = batching.get("max_queue_delay_microseconds", [0]) if isinstance(batching, dict) else 0
    if (
        not isinstance(delays, list)
        or not delays
        or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in delays)
    ):
        raise SearchSpaceError(
            f"{source}: 'dynamic_batching.max_queue_delay_microseconds' is {delays!r}; "
            "expected a list of whole microseconds >= 0"
        )
    space.queue_delays_us = sorted(set(delays))
    return space


def load_levels(space: SearchSpace, limits: SearchLimits) -> tuple[str, list[int], Sweep | None]:
    """The load a search sweeps -- "concurrency" or "request_rate" -- its levels in order, and
    the sweep that made them (None for values the user fixed, which are all measured)."""
    if limits.request_rate:
        return "request_rate", list(limits.request_rate), None
    if limits.request_rate_search and limits.search_disable:
        return "request_rate", [1], None  # MA's one point with the search off
    if limits.concurrency:
        return "concurrency", list(limits.concurrency), None
    if limits.request_rate_search:
        sweep = space.request_rate
        return "request_rate", sweep.values(limits.min_request_rate, limits.max_request_rate), sweep
    sweep = space.concurrency
    return "concurrency", sweep.values(limits.min_concurrency, limits.max_concurrency), sweep


def manual_axes(manual: dict[str, Any]) -> tuple[list[int] | None, list[int] | None,
                                                 list[int] | None]:  # fmt: skip
    """The instance counts, max_batch_sizes and queue delays model_config_parameters lists (None
    where it lists none): MA's optuna mode searches these values instead of the space's."""

    def ints(value: Any) -> list[int] | None:
        if value is None:
            return None
        items = value if isinstance(value, list) else [value]
        return sorted({int(v) for v in items})

    group = manual.get("instance_group")
    first = group[0] if isinstance(group, list) and group else group
    while isinstance(first, list) and first:  # MA's normalised form nests one more list
        first = first[0]
    counts = ints(first.get("count")) if isinstance(first, dict) else None
    batching = manual.get("dynamic_batching")
    if isinstance(batching, list) and batching:
        batching = batching[0]
    delays = ints(batching.get("max_queue_delay_microseconds")) \
        if isinstance(batching, dict) else None  # fmt: skip
    return counts, ints(manual.get("max_batch_size")), delays
