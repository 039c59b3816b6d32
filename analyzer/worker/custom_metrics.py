"""Metrics that python models define (`pb_utils.MetricFamily` / `Metric`), served on the metrics
port after Triton's own families, as Triton serves a model's custom metrics.

As in Triton, a family is known by its name across the whole worker: a second family of the same
name and kind is the same family (the first description stays), of another kind an error. Two
metrics of one family with the same labels are one series. Each model process's families and
metrics are released when it ends (a model's unload), and a series or family that nobody holds
leaves the scrape. Models are the operator's code, yet their families, series, labels and
buckets are bounded, so that a model in a loop cannot grow the worker or its scrape without end.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

KINDS = ("counter", "gauge", "histogram")
MAX_FAMILIES = 256
MAX_SERIES = 10_000  # all families together
MAX_LABELS = 32  # per metric
MAX_BUCKETS = 256  # per histogram
MAX_TEXT = 1024  # characters of a name, a description, a label name or value
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = ("nv_inference_", "nv_cpu_", "nv_gpu_", "nv_energy_")  # Triton's own families

Labels = tuple[tuple[str, str], ...]


class CustomMetricError(ValueError):
    """A model's metric call that cannot be honoured; the sentence goes back to the model."""


@dataclass(slots=True)
class _Series:
    labels: Labels
    buckets: tuple[float, ...] | None  # a histogram's upper bounds, increasing
    value: float = 0.0  # a counter's or gauge's value
    counts: list[int] = field(default_factory=list)  # a histogram's count per bucket (+Inf last)
    total: float = 0.0  # a histogram's sum
    refs: int = 0


@dataclass(slots=True)
class _Family:
    name: str
    kind: str
    description: str
    refs: int = 0
    series: dict[Labels, _Series] = field(default_factory=dict)


class CustomMetrics:
    """The worker's custom metric families; every call is thread-safe (a model's calls come from
    the threads that read its process's channel, scrapes from the metrics thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._family_handles: dict[int, _Family] = {}
        self._metric_handles: dict[int, tuple[_Family, _Series]] = {}
        self._series = 0
        self._ids = itertools.count(1)

    # ---- a model's calls ------------------------------------------------------------------------
    def family(self, name: Any, description: Any, kind: Any) -> int:
        """A handle on family `name`, made if it is new."""
        if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_TEXT:
            raise CustomMetricError(f"metric family name {name!r} is not a Prometheus metric "
                                    "name ([a-zA-Z_:][a-zA-Z0-9_:]*)")  # fmt: skip
        if not isinstance(description, str) or len(description) > MAX_TEXT:
            raise CustomMetricError(f"metric family '{name}': the description must be a string "
                                    f"of at most {MAX_TEXT} characters")  # fmt: skip
        if kind not in KINDS:
            raise CustomMetricError(f"metric family '{name}': unknown kind {kind!r}")
        if name.startswith(_RESERVED):
            raise CustomMetricError(f"metric family name '{name}' is in the worker's own "
                                    f"namespace ({', '.join(_RESERVED)}...)")  # fmt: skip
        with self._lock:
            family = self._families.get(name)
            if family is None:
                if len(self._families) >= MAX_FAMILIES:
                    raise CustomMetricError(f"cannot add metric family '{name}': the worker "
                                            f"holds {MAX_FAMILIES} already")  # fmt: skip
                family = self._families[name] = _Family(name, kind, description)
            elif family.kind != kind:
                raise CustomMetricError(f"metric family '{name}' exists as a {family.kind}; "
                                        f"it cannot be made a {kind}")  # fmt: skip
            family.refs += 1
            handle = next(self._ids)
            self._family_handles[handle] = family
            return handle

    def metric(self, family_handle: int, labels: Any, buckets: Any) -> int:
        """A handle on the series of `labels` in a family, made if it is new."""
        with self._lock:
            family = self._family_handles.get(family_handle)
        if family is None:
            raise CustomMetricError("the metric's family was deleted")
        key = _labels(family.name, labels)
        bounds = _buckets(family, buckets)
        with self._lock:
            series = family.series.get(key)
            if series is None:
                if self._series >= MAX_SERIES:
                    raise CustomMetricError(f"cannot add a metric to family '{family.name}': "
                                            f"the worker holds {MAX_SERIES} already")  # fmt: skip
                series = family.series[key] = _Series(key, bounds)
                if bounds is not None:
                    series.counts = [0] * (len(bounds) + 1)
                self._series += 1
            elif series.buckets != bounds:
                raise CustomMetricError(f"metric family '{family.name}' has a metric with these "
                                        "labels and other buckets")  # fmt: skip
            series.refs += 1
            handle = next(self._ids)
            self._metric_handles[handle] = (family, series)
            return handle

    def apply(self, handle: int, op: str, value: float) -> None:
        """increment / set / observe; the model's process checked the kind and the value."""
        with self._lock:
            held = self._metric_handles.get(handle)
            if held is None:
                return
            family, series = held
            if op == "increment" and family.kind != "histogram":
                if family.kind == "gauge" or value >= 0:
                    series.value += value
            elif op == "set" and family.kind == "gauge":
                series.value = value
            elif op == "observe" and series.buckets is not None and not math.isnan(value):
                series.counts[bisect_left(series.buckets, value)] += 1
                series.total += value

    def value(self, handle: int) -> float:
        with self._lock:
            held = self._metric_handles.get(handle)
        if held is None:
            raise CustomMetricError("the metric was deleted")
        if held[0].kind == "histogram":
            raise CustomMetricError("value() is not supported for histogram metrics")
        return held[1].value

    def release_metric(self, handle: int) -> None:
        with self._lock:
            held = self._metric_handles.pop(handle, None)
            if held is None:
                return
            family, series = held
            series.refs -= 1
            if series.refs <= 0 and family.series.get(series.labels) is series:
                del family.series[series.labels]
                self._series -= 1

    def release_family(self, handle: int) -> None:
        """A family nobody holds leaves, with its metrics (Triton's rule: delete a family after
        its metrics; handles on them stop working)."""
        with self._lock:
            family = self._family_handles.pop(handle, None)
            if family is None:
                return
            family.refs -= 1
            if family.refs > 0:
                return
            if self._families.get(family.name) is family:
                del self._families[family.name]
            self._series -= len(family.series)
            family.series.clear()
            for metric, (owner, _) in list(self._metric_handles.items()):
                if owner is family:
                    del self._metric_handles[metric]

    # ---- the scrape ----------------------------------------------------------------------------
    def lines(self) -> list[str]:
        with self._lock:
            families = [(f.name, f.kind, f.description, [_copy(s) for s in f.series.values()])
                        for f in self._families.values() if f.series]  # fmt: skip
        out: list[str] = []
        for name, kind, description, series in families:
            out.append(f"# HELP {name} {_help(description)}")
            out.append(f"# TYPE {name} {kind}")
            for s in series:
                labels = _render(s.labels)
                braced = f"{{{labels}}}" if labels else ""  # none at all without labels
                if s.buckets is None:
                    out.append(f"{name}{braced} {_number(s.value)}")
                    continue
                running = 0
                sep = "," if labels else ""
                for bound, count in zip((*s.buckets, math.inf), s.counts, strict=True):
                    running += count
                    le = "+Inf" if bound == math.inf else _number(bound)
                    out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
                out.append(f"{name}_sum{braced} {_number(s.total)}")
                out.append(f"{name}_count{braced} {running}")
        return out


def _copy(series: _Series) -> _Series:
    return _Series(series.labels, series.buckets, series.value, list(series.counts), series.total)


def _labels(family: str, labels: Any) -> Labels:
    if labels is None:
        return ()
    if not isinstance(labels, dict):
        raise CustomMetricError(f"metric family '{family}': labels must be a dictionary")
    if len(labels) > MAX_LABELS:
        raise CustomMetricError(f"metric family '{family}': {len(labels)} labels, at most "
                                f"{MAX_LABELS}")  # fmt: skip
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.fullmatch(key) or key.startswith("__") \
                or len(key) > MAX_TEXT:  # fmt: skip
            raise CustomMetricError(f"metric family '{family}': label name {key!r} is not a "
                                    "Prometheus label name")  # fmt: skip
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise CustomMetricError(f"metric family '{family}': label '{key}' must have a "
                                    f"string value of at most {MAX_TEXT} characters")  # fmt: skip
    return tuple(sorted(labels.items()))


def _buckets(family: _Family, buckets: Any) -> tuple[float, ...] | None:
    if family.kind != "histogram":
        if buckets is not None:
            raise CustomMetricError(f"metric family '{family.name}' is a {family.kind}: a "
                                    "metric of it takes no buckets")  # fmt: skip
        return None
    if not isinstance(buckets, list | tuple) or not buckets:
        raise CustomMetricError(f"histogram family '{family.name}': a metric needs a list of "
                                "bucket bounds")  # fmt: skip
    if len(buckets) > MAX_BUCKETS:
        raise CustomMetricError(f"histogram family '{family.name}': {len(buckets)} buckets, at "
                                f"most {MAX_BUCKETS}")  # fmt: skip
    try:
        bounds = tuple(float(b) for b in buckets)
    except (TypeError, ValueError):
        raise CustomMetricError(f"histogram family '{family.name}': bucket bounds must be "
                                "numbers") from None  # fmt: skip
    if any(not math.isfinite(b) for b in bounds) or any(
            a >= b for a, b in zip(bounds, bounds[1:], strict=False)):  # fmt: skip
        raise CustomMetricError(f"histogram family '{family.name}': bucket bounds must be "
                                f"finite and increasing, got {list(buckets)}")  # fmt: skip
    return bounds


def escape_label(value: str) -> str:
    """A label value in the Prometheus text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _render(labels: Labels) -> str:
    return ",".join(f'{key}="{escape_label(value)}"' for key, value in labels)


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


REGISTRY = CustomMetrics()  # the worker's: its python models' metrics, scraped with the rest
