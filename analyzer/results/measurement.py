"""One measured point of one config, as stored in the checkpoint and read by ranking and reports.

Flat, JSON-friendly, in MA's units (ms, MB, W, %), keyed by MA's metric tags so objectives and
constraints name the same things the CSV columns show.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.loadgen.measure import PerfPoint


@dataclass
class Measurement:
    model: str
    config_name: str
    load: str  # concurrency | request_rate
    value: int
    batch_size: int
    metrics: dict[str, float]  # MA tags: perf_throughput, perf_latency_p99 (ms), ...
    gpus: list[dict[str, Any]] = field(default_factory=list)  # per GPU: uuid, memory, util, power
    stable: bool = True
    client_saturated: bool = False
    client_bound: bool = False  # the client, not the server, set this point (see PerfPoint)
    warnings: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    taken_at: float = 0.0  # unix time
    host: str = ""  # the process that measured it (hostname:pid), for studies shared by many

    def metric(self, tag: str) -> float | None:
        if tag == "perf_latency":
            tag = "perf_latency_p99"
        return self.metrics.get(tag)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Measurement:
        return Measurement(**data)


def from_point(
    point: PerfPoint, model: str, config_name: str, load: str, value: int, taken_at: float
) -> Measurement:
    ms = 1000.0
    metrics: dict[str, float] = {
        "perf_throughput": point.throughput,
        "perf_latency_avg": point.latency_avg_us / ms,
        "perf_latency_p50": point.p50_us / ms,
        "perf_latency_p90": point.p90_us / ms,
        "perf_latency_p95": point.p95_us / ms,
        "perf_latency_p99": point.p99_us / ms,
        "perf_client_send_recv": (point.client_send_us + point.client_recv_us) / ms,
        "perf_client_response_wait": point.network_us / ms,
        "achieved_request_rate": point.sent_rate,
        "client_cpu_pct": point.client_cpu_pct,
        "client_cpu_wait_pct": point.client_wait_pct,
        "effective_concurrency": point.effective_concurrency,
    }
    if point.ci_throughput_pct is not None:  # window-to-window variation: 95% CI half-width, %
        metrics["perf_throughput_ci_pct"] = point.ci_throughput_pct
    if point.server is not None:
        s = point.server
        metrics.update(
            perf_server_queue=s.queue_us / ms,
            perf_server_compute_input=s.compute_input_us / ms,
            perf_server_compute_infer=s.compute_infer_us / ms,
            perf_server_compute_output=s.compute_output_us / ms,
            server_avg_batch=s.avg_batch,
        )
    gpus: list[dict[str, Any]] = []
    gpu = point.monitors.get("gpu")
    if gpu is not None and gpu.available and gpu.gpus:
        metrics.update(
            gpu_used_memory=gpu.memory_used_mb,
            gpu_utilization=gpu.utilization_pct,
            gpu_power_usage=gpu.power_w,
        )
        gpus = [
            {"uuid": g.uuid, "name": g.name, "gpu_used_memory": g.memory_used_max_mb,
             "gpu_total_memory": g.memory_total_mb, "gpu_utilization": g.utilization_pct,
             "gpu_power_usage": g.power_w or 0.0}
            for g in gpu.gpus
        ]  # fmt: skip
        metrics["gpu_free_memory"] = sum(
            g["gpu_total_memory"] - g["gpu_used_memory"] for g in gpus
        )
    cpu = point.monitors.get("cpu")
    if cpu is not None and cpu.available and cpu.samples:
        metrics.update(cpu_used_ram=cpu.rss_max_mb, cpu_utilization=cpu.cpu_pct)
    return Measurement(
        model=model,
        config_name=config_name,
        load=load,
        value=value,
        batch_size=point.batch_size,
        metrics=metrics,
        gpus=gpus,
        stable=point.stable,
        client_saturated=point.client_saturated,
        client_bound=point.client_bound,
        warnings=list(point.warnings),
        errors=dict(point.errors),
        wall_s=point.wall_s,
        taken_at=taken_at,
    )
