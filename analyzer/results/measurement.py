"""One measured point of one config, as stored in the checkpoint and read by ranking and reports.

Flat, JSON-friendly, in MA's units (ms, MB, W, %), keyed by MA's metric tags so objectives and
constraints name the same things the CSV columns show.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.loadgen.measure import PerfPoint
from analyzer.metrics import point_metrics

if TYPE_CHECKING:
    from analyzer.search.ledger import SharedPoint


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
        if tag.endswith("perf_latency") and tag.rpartition(":")[2] == "perf_latency":
            tag += "_p99"  # MA's alias, also as "<model>:perf_latency" (models profiled together)
        return self.metrics.get(tag)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Measurement:
        return Measurement(**data)


def from_shared(point: SharedPoint, config_name: str) -> Measurement:
    """A point another process of a shared study measured, as a measurement of `config_name`
    (this run's name for its config)."""
    measurement = Measurement.from_dict(point.measurement)
    measurement.config_name = config_name
    measurement.host = measurement.host or point.host
    return measurement


def from_point(
    point: PerfPoint, model: str, config_name: str, load: str, value: int, taken_at: float
) -> Measurement:
    metrics = point_metrics(point)
    gpus: list[dict[str, Any]] = []
    gpu = point.monitors.get("gpu")
    if gpu is not None and gpu.available and gpu.gpus:
        gpus = [
            {"uuid": g.uuid, "name": g.name, "gpu_used_memory": g.memory_used_max_mb,
             "gpu_total_memory": g.memory_total_mb, "gpu_utilization": g.utilization_pct,
             "gpu_power_usage": g.power_w or 0.0}
            for g in gpu.gpus
        ]  # fmt: skip
        metrics["gpu_free_memory"] = sum(
            g["gpu_total_memory"] - g["gpu_used_memory"] for g in gpus
        )
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
