"""The capacity plan: how many replicas of each measured config serve a target load under a
latency budget, what they hold in all, and what they cost.

Why: the question after a profile is "how many replicas for N QPS under a p99 of X ms, and what
does that cost?", which a ranked table does not answer. For each config the plan takes its
measured point with the most throughput whose p99 is within the budget (one replica's capacity),
and sizes the fleet with the stated headroom: replicas = ceil(target x (1 + headroom) /
capacity). A replica holds what the profile measured for one worker: its instances, its GPUs (the
GPUs its point was measured on, for KIND_GPU), its cores (the worker's measured CPU use, rounded
up to whole cores) and its memory (host RSS, plus GPU memory). Costs are per GPU-hour and per
core-hour; without prices configs rank by GPUs, then cores, then replicas.

`conservative` sizes a finalist of the final comparison by the low end of its throughput's 95%
interval, and holds its p99 to the budget by the high end of that interval: a fleet planned on a
lucky measurement would miss its target. Configs measured once have no interval: they keep their
point, the row says so, and they rank after the finalists.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analyzer.results.together import SEPARATOR

PLAN_FILE = "plan.json"  # in EXPORT_PATH/results, beside profile_results.json


@dataclass(frozen=True)
class PlanSettings:
    target_qps: float
    latency_budget_ms: float | None = None
    max_replicas: int | None = None
    headroom_pct: float = 20.0
    cost_per_gpu_hour: float | None = None
    cost_per_cpu_hour: float | None = None
    conservative: bool = False

    @property
    def priced(self) -> bool:
        return self.cost_per_gpu_hour is not None or self.cost_per_cpu_hour is not None


@dataclass
class PlanRow:
    """One config's fleet for the target, or why it cannot serve it."""

    model: str
    config: str
    feasible: bool
    note: str = ""
    load: str = ""
    throughput: float = 0.0  # one replica's, at the point chosen
    p99_ms: float = 0.0
    replicas: int = 0
    instances: int = 0  # in all, over the replicas
    gpus: int = 0
    cores: int = 0
    memory_mb: float = 0.0
    gpu_memory_mb: float = 0.0
    cost_per_hour: float | None = None
    cost_per_million: float | None = None
    shortfall_pct: float = 0.0  # of the target, for a config that cannot reach it
    interval: bool = False  # sized from its final-comparison interval (conservative)
    per_replica: dict[str, float] = field(default_factory=dict)
    # models profiled together: each model's share of the replica's summed infer/s at the point
    # chosen; the replicas serve the target in that mix
    mix: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_model(model: dict[str, Any], settings: PlanSettings, cores_default: int) -> list[PlanRow]:
    """Every measured config of a results file's model, cheapest feasible first."""
    rows = [_row(model["name"], config, settings, cores_default)
            for config in model["configs"] if config["measurements"]]  # fmt: skip
    return sorted(rows, key=lambda r: _order(r, settings))


def _order(row: PlanRow, settings: PlanSettings) -> tuple[Any, ...]:
    """Feasible first; when conservative, those sized from an interval before those measured
    once (a single point would otherwise win on its luck); then by cost."""
    if not row.feasible:
        return (2, row.shortfall_pct, row.config)
    first = 0 if row.interval or not settings.conservative else 1
    if settings.priced:
        return (first, row.cost_per_hour or 0.0, row.replicas, row.config)
    return (first, row.gpus, row.cores, row.replicas, row.config)


def _row(model: str, config: dict[str, Any], s: PlanSettings, cores_default: int) -> PlanRow:
    row = PlanRow(model, config["name"], False)
    points = list(config["measurements"])
    if config.get("best"):
        points.append(config["best"])  # a finalist's mean over its final rounds
    budget = s.latency_budget_ms
    within = [p for p in points if budget is None or p["metrics"]["perf_latency_p99"] <= budget]
    if not within:
        lowest = min(p["metrics"]["perf_latency_p99"] for p in points)
        row.note = f"no point within the {budget:g} ms budget (lowest p99 {lowest:.1f} ms)"
        row.shortfall_pct = 100.0
        return row
    point = max(within, key=lambda p: p["metrics"]["perf_throughput"])
    metrics = point["metrics"]
    row.throughput = metrics["perf_throughput"]
    row.p99_ms = metrics["perf_latency_p99"]
    row.mix = _mix(model, metrics)
    final = config.get("final_comparison") or {}
    if s.conservative and final.get("perf_throughput") and config.get("best"):
        point, metrics = config["best"], config["best"]["metrics"]
        row.throughput = final["perf_throughput"]["low"]
        row.p99_ms = final["perf_latency_p99"]["high"]
        row.interval = True
        if budget is not None and row.p99_ms > budget:
            row.note = (f"the p99 interval reaches {row.p99_ms:.1f} ms, over the {budget:g} ms "
                        "budget")  # fmt: skip
            row.shortfall_pct = 100.0
            return row
    elif s.conservative:
        row.note = "measured once: no interval, sized from its point"
    value = f"{point['value']:g}"
    row.load = f"concurrency {value}" if point["load"] == "concurrency" else f"{value} req/s"
    description = config["description"]
    on_gpu = "GPU" in str(description.get("instance_group", ""))
    per = {
        "instances": float(description.get("instance_count") or 1),
        "gpus": float(max(len(point.get("gpus") or []), 1) if on_gpu else 0),
        "cores": float(max(1, math.ceil(metrics["cpu_utilization"] / 100.0))
                       if metrics.get("cpu_utilization") else cores_default),
        "memory_mb": float(metrics.get("cpu_used_ram") or 0.0),
        "gpu_memory_mb": float(sum(g.get("gpu_used_memory", 0.0) for g in point.get("gpus") or [])),
    }  # fmt: skip
    row.per_replica = per
    needed = s.target_qps * (1 + s.headroom_pct / 100.0)
    replicas = max(1, math.ceil(needed / row.throughput)) if row.throughput > 0 else 0
    if replicas == 0 or (s.max_replicas and replicas > s.max_replicas):
        most = s.max_replicas or 0
        reach = most * row.throughput / (1 + s.headroom_pct / 100.0)
        row.shortfall_pct = 100.0 * max(0.0, 1 - reach / s.target_qps)
        row.note = (f"{most} replica(s) serve {reach:.0f} infer/s with {s.headroom_pct:g}% "
                    f"headroom: {row.shortfall_pct:.0f}% short of {s.target_qps:g}")  # fmt: skip
        return row
    row.feasible = True
    row.replicas = replicas
    row.instances = int(per["instances"] * replicas)
    row.gpus = int(per["gpus"] * replicas)
    row.cores = int(per["cores"] * replicas)
    row.memory_mb = per["memory_mb"] * replicas
    row.gpu_memory_mb = per["gpu_memory_mb"] * replicas
    if s.priced:
        row.cost_per_hour = (row.gpus * (s.cost_per_gpu_hour or 0.0)
                             + row.cores * (s.cost_per_cpu_hour or 0.0))  # fmt: skip
        row.cost_per_million = row.cost_per_hour / (s.target_qps * 3600) * 1e6
    return row


def _mix(model: str, metrics: dict[str, float]) -> dict[str, float]:
    """A joint config's ("a,b") models' shares of its summed throughput, from their own
    "<model>:perf_throughput"; empty for a model profiled alone."""
    parts = model.split(SEPARATOR)
    keys = {m: f"{m}:perf_throughput" for m in parts}
    if len(parts) < 2 or any(k not in metrics for k in keys.values()):
        return {}
    total = sum(metrics[k] for k in keys.values())
    return {m: metrics[k] / total for m, k in keys.items()} if total > 0 else {}


def mix_text(rows: list[dict[str, Any]]) -> str:
    """One sentence for a joint profile's plan: what its infer/s and replicas mean."""
    first = next((r for r in rows if r.get("mix")), None)
    if first is None:
        return ""
    shares = ", ".join(f"{m} {100 * share:.0f}%" for m, share in first["mix"].items())
    return (f"profiled together: each replica serves every model, its infer/s is their sum, and "
            f"the target is sized in the mix measured ({shares} for {first['config']}); another "
            "mix needs its own profile")


def plan_document(results: dict[str, Any], settings: PlanSettings,
                  models: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """plan.json: the settings and, per model, its rows (cheapest feasible first)."""
    cores_default = _worker_cores(results)
    out: dict[str, Any] = {"format": "model-analyzer capacity plan", "version": 1,
                           "settings": asdict(settings), "models": {}}  # fmt: skip
    for model in results["models"]:
        if models and model["name"] not in models:
            continue
        rows = plan_model(model, settings, cores_default)
        out["models"][model["name"]] = [r.as_dict() for r in rows]
    return out


def plan_path(export_path: Path) -> Path:
    return export_path / "results" / PLAN_FILE


def read_plan(export_path: Path) -> dict[str, Any] | None:
    """The run's plan.json (`model-analyzer plan`), or None when no plan was made."""
    try:
        document: dict[str, Any] = json.loads(plan_path(export_path).read_text())
    except (OSError, ValueError):
        return None
    return document


def _worker_cores(results: dict[str, Any]) -> int:
    """Cores a replica gets when no CPU use was measured: the profile's worker's CPU set."""
    cpus = (results.get("cpu_placement") or {}).get("worker_cpus") or ""
    count = 0
    for part in str(cpus).split(","):
        if "-" in part:
            low, _, high = part.partition("-")
            whole = (low + high).isascii() and low.isdigit() and high.isdigit()
            count += int(high) - int(low) + 1 if whole else 0
        elif part.strip().isascii() and part.strip().isdigit():
            count += 1
    return count or int((results.get("machine") or {}).get("cpu_count") or 1)
