"""The server-side latency breakdown over a window, from two statistics-API snapshots.

Triton's accounting: queue.count equals success.count, compute_* counts exclude cache hits, and
every request of a batch carries the whole batch's durations. The averages are per request, as
perf_analyzer prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServerBreakdown:
    """Per-request averages in microseconds over one measurement window."""

    success_count: int
    inference_count: int
    execution_count: int
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    # an ensemble's steps, each model's own breakdown over the same window (perf_analyzer's
    # "Composing models")
    composing: dict[str, ServerBreakdown] = field(default_factory=dict)
    version: str = ""  # the version that served the window

    @property
    def overhead_us(self) -> float:
        """Time in the server outside queue and compute: protocol handling, (de)serialization."""
        parts = self.queue_us + self.compute_input_us + self.compute_infer_us
        return max(0.0, self.request_us - parts - self.compute_output_us)

    @property
    def avg_batch(self) -> float:
        return self.inference_count / self.execution_count if self.execution_count else 0.0


def _stat(entry: dict[str, Any], name: str) -> tuple[int, int]:
    item = entry.get("inference_stats", {}).get(name, {})
    return int(item.get("count", 0) or 0), int(item.get("ns", 0) or 0)


def _entries(stats: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    return {
        str(e.get("version", "")): e for e in stats.get("model_stats", []) if e.get("name") == model
    }


def stats_delta(
    before: dict[str, Any], after: dict[str, Any], model: str, version: str = ""
) -> ServerBreakdown | None:
    """The breakdown of the version that served the window (the one whose success count grew)."""
    old, new = _entries(before, model), _entries(after, model)
    candidates = [v for v in new if not version or v == version]
    best, best_growth = None, 0
    for v in candidates:
        growth = _stat(new[v], "success")[0] - _stat(old.get(v, {}), "success")[0]
        if growth > best_growth:
            best, best_growth = v, growth
    if best is None:
        return None
    a, b = old.get(best, {}), new[best]

    def delta(name: str) -> tuple[int, int]:
        (c0, n0), (c1, n1) = _stat(a, name), _stat(b, name)
        return c1 - c0, n1 - n0

    def per(name: str) -> float:
        count, ns = delta(name)
        return ns / count / 1000.0 if count > 0 else 0.0

    success, success_ns = delta("success")
    queue_count, queue_ns = delta("queue")
    return ServerBreakdown(
        success_count=success,
        inference_count=int(b.get("inference_count", 0)) - int(a.get("inference_count", 0)),
        execution_count=int(b.get("execution_count", 0)) - int(a.get("execution_count", 0)),
        request_us=success_ns / success / 1000.0,
        queue_us=queue_ns / max(1, queue_count) / 1000.0,
        compute_input_us=per("compute_input"),
        compute_infer_us=per("compute_infer"),
        compute_output_us=per("compute_output"),
        version=best,
    )


def composing_models(config: dict[str, Any]) -> list[str]:
    """The models an ensemble's steps call (from its config JSON), each once; [] otherwise."""
    if config.get("platform") != "ensemble":
        return []
    names: list[str] = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", []):
        name = step.get("model_name")
        if name and name not in names:
            names.append(name)
    return names


def with_composing(breakdown: ServerBreakdown | None, before: dict[str, Any],
                   after: dict[str, Any], models: list[str]) -> ServerBreakdown | None:  # fmt: skip
    """`breakdown` with each composing model's own over the same two snapshots."""
    if breakdown is None:
        return None
    for model in models:
        part = stats_delta(before, after, model)
        if part is not None:
            breakdown.composing[model] = part
    return breakdown
