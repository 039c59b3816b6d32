"""Every metric a point can carry, defined once: its MA tag, CSV header, unit, direction, digits,
whether it is a memory metric, and where its value comes from in a measured point.

The objective/constraint directions, the inference and GPU CSV columns, the memory tags and the
keys `from_point` stores are all derived from `METRICS`, so a new metric is one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings read this table too; they need no load generator
    from analyzer.loadgen.measure import PerfPoint

Source = Callable[["PerfPoint"], "float | None"]
_MS = 1000.0  # the load generator reports µs; MA's tables are in ms


@dataclass(frozen=True)
class Metric:
    tag: str  # MA's name: objectives, constraints and *_output_fields use it
    header: str = ""  # CSV column (MA's words); "" = no column
    unit: str = "ms"
    higher_is_better: bool | None = None  # None: not an objective or constraint
    digits: int = 3  # CSV rounding
    memory: bool = False  # measured per variant on a fresh worker (see the profiler)
    gpu_table: bool = False  # a column of metrics-model-gpu.csv / metrics-server-only.csv too
    source: Source | None = None  # None: derived elsewhere (an alias, a sum over GPUs)


def _server(field: str, scale: float = _MS) -> Source:
    return lambda p: None if p.server is None else getattr(p.server, field) / scale


def _monitor(monitor: str, readings: str, field: str) -> Source:
    """A monitor's summary field, when that monitor had readings (`readings`) for the point."""

    def get(p: PerfPoint) -> float | None:
        summary = p.monitors.get(monitor)
        if summary is None or not summary.available or not getattr(summary, readings):
            return None
        value: float | None = getattr(summary, field)
        return value

    return get


def _gpu(field: str) -> Source:
    return _monitor("gpu", "gpus", field)


def _cpu(field: str) -> Source:
    return _monitor("cpu", "samples", field)


METRICS: tuple[Metric, ...] = (
    Metric("perf_throughput", "Throughput (infer/sec)", "infer/s", True, 1,
           source=lambda p: p.throughput),
    Metric("perf_latency_avg", "Avg Latency (ms)", higher_is_better=False,
           source=lambda p: p.latency_avg_us / _MS),
    Metric("perf_latency_p50", "p50 Latency (ms)", higher_is_better=False,
           source=lambda p: p.p50_us / _MS),
    Metric("perf_latency_p90", "p90 Latency (ms)", higher_is_better=False,
           source=lambda p: p.p90_us / _MS),
    Metric("perf_latency_p95", "p95 Latency (ms)", higher_is_better=False,
           source=lambda p: p.p95_us / _MS),
    Metric("perf_latency_p99", "p99 Latency (ms)", higher_is_better=False,
           source=lambda p: p.p99_us / _MS),
    Metric("perf_latency", higher_is_better=False),  # MA's alias of p99 (Measurement.metric)
    Metric("perf_server_queue", "Server Queue time (ms)", higher_is_better=False,
           source=_server("queue_us")),
    Metric("perf_server_compute_input", "Server Compute Input time (ms)", higher_is_better=False,
           source=_server("compute_input_us")),
    Metric("perf_server_compute_infer", "Server Compute Infer time (ms)", higher_is_better=False,
           source=_server("compute_infer_us")),
    Metric("perf_server_compute_output", "Server Compute Output time (ms)",
           higher_is_better=False, source=_server("compute_output_us")),
    Metric("perf_client_send_recv", "Client Send/Recv (ms)", higher_is_better=False,
           source=lambda p: (p.client_send_us + p.client_recv_us) / _MS),
    Metric("perf_client_response_wait", "Response Wait Time (ms)", higher_is_better=False,
           source=lambda p: p.network_us / _MS),
    Metric("gpu_used_memory", "GPU Memory Usage (MB)", "MB", False, 1, memory=True,
           gpu_table=True, source=_gpu("memory_used_mb")),
    Metric("gpu_free_memory", "", "MB", True, memory=True),  # summed over GPUs in from_point
    Metric("gpu_utilization", "GPU Utilization (%)", "%", True, 1, gpu_table=True,
           source=_gpu("utilization_pct")),
    Metric("gpu_power_usage", "GPU Power Usage (W)", "W", False, 1, gpu_table=True,
           source=_gpu("power_w")),
    Metric("cpu_used_ram", "RAM Usage (MB)", "MB", False, 1, memory=True,
           source=_cpu("rss_max_mb")),
    Metric("cpu_available_ram", "", "MB", True, memory=True),  # MA's tag; not measured
    # ours, after MA's
    Metric("server_avg_batch", "Server Avg Batch", "", digits=2, source=_server("avg_batch", 1)),
    Metric("cpu_utilization", "Server CPU Utilization (%)", "%", digits=1,
           source=_cpu("cpu_pct")),
    Metric("perf_throughput_ci_pct", "Throughput 95% CI (+/- %)", "%", digits=1,
           source=lambda p: p.ci_throughput_pct),  # window-to-window variation
    Metric("achieved_request_rate", "", "req/s", source=lambda p: p.sent_rate),
    Metric("effective_concurrency", "Effective Concurrency", "", digits=2,
           source=lambda p: p.effective_concurrency),
    Metric("client_cpu_pct", "Client CPU (%)", "%", digits=1, source=lambda p: p.client_cpu_pct),
    Metric("client_cpu_wait_pct", "Client CPU Wait (%)", "%", digits=1,
           source=lambda p: p.client_wait_pct),
)  # fmt: skip

BY_TAG = {m.tag: m for m in METRICS}
# objective/constraint tags -> True when larger is better
DIRECTIONS: dict[str, bool] = {
    m.tag: m.higher_is_better for m in METRICS if m.higher_is_better is not None
}
MEMORY_TAGS = frozenset(m.tag for m in METRICS if m.memory)

# The columns of each CSV that are not metrics: what a row describes (MA's tags, then ours).
# `*_output_fields` may name these and the metrics with a column in that table.
ROW_TAGS = (
    "model_name", "batch_size", "concurrency", "request_rate", "model_config_path",
    "instance_group", "max_batch_size", "satisfies_constraints", "max_queue_delay_microseconds",
    "stable", "client_saturated", "client_bound",
)  # fmt: skip
GPU_ROW_TAGS = ("model_name", "gpu_uuid", "batch_size", "concurrency", "request_rate",
                "model_config_path", "instance_group", "satisfies_constraints")  # fmt: skip
OUTPUT_FIELDS = {  # setting -> the tags its table has
    "inference_output_fields": frozenset(ROW_TAGS) | {m.tag for m in METRICS if m.header},
    "gpu_output_fields": frozenset(GPU_ROW_TAGS) | {m.tag for m in METRICS if m.gpu_table},
    "server_output_fields": frozenset(GPU_ROW_TAGS) | {m.tag for m in METRICS if m.gpu_table},
}


def base_tag(tag: str) -> str:
    """The metric of a tag; models profiled together are ranked on tags "<model>:<metric>"."""
    return tag.rpartition(":")[2]


def direction(tag: str) -> bool:
    """True when a larger value of `tag` (a metric or "<model>:<metric>") is better."""
    return DIRECTIONS.get(base_tag(tag), True)


def unit(tag: str) -> str:
    metric = BY_TAG.get(base_tag(tag))
    return metric.unit if metric is not None else "ms"


def point_metrics(point: PerfPoint) -> dict[str, float]:
    """The point's value of every metric it has (a metric whose source has nothing is left out)."""
    out: dict[str, float] = {}
    for metric in METRICS:
        if metric.source is not None and (value := metric.source(point)) is not None:
            out[metric.tag] = value
    return out
