"""Prometheus text on the metrics port, with Triton's metric names and label sets.

Written by hand rather than with prometheus_client: perf_analyzer's `--collect-metrics` parser wants
plain decimal numbers and Triton's exact names (no `_total`/`_created` suffixes).
"""

from __future__ import annotations

import psutil

from analyzer.worker.model import ModelVersion

_MODEL_COUNTERS = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests"),
    ("nv_inference_count", "counter", "Number of inferences performed"),
    ("nv_inference_exec_count", "counter", "Number of model executions"),
    ("nv_inference_request_duration_us", "counter", "Cumulative request duration in microseconds"),
    ("nv_inference_queue_duration_us", "counter", "Cumulative queuing duration in microseconds"),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute infer duration in microseconds",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative compute output duration in microseconds",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Pending requests awaiting execution per model",
    ),
)


def _model_values(model: ModelVersion) -> list[int]:
    s = model.stats.as_dict()
    d = s["inference_stats"]
    return [
        d["success"]["count"],
        d["fail"]["count"],
        s["inference_count"],
        s["execution_count"],
        (d["success"]["ns"] + d["fail"]["ns"]) // 1000,
        d["queue"]["ns"] // 1000,
        d["compute_input"]["ns"] // 1000,
        d["compute_infer"]["ns"] // 1000,
        d["compute_output"]["ns"] // 1000,
        model.scheduler.pending,
    ]


def render_metrics(models: list[ModelVersion]) -> str:
    lines: list[str] = []
    values = {id(m): _model_values(m) for m in models}
    for i, (name, kind, help_text) in enumerate(_MODEL_COUNTERS):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m in models:
            lines.append(f'{name}{{model="{m.name}",version="{m.version}"}} {values[id(m)][i]}')
    lines.extend(_cpu_lines())
    lines.extend(_gpu_lines())
    return "\n".join(lines) + "\n"


def _cpu_lines() -> list[str]:
    mem = psutil.virtual_memory()
    util = psutil.cpu_percent(interval=None) / 100.0
    return [
        "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]",
        "# TYPE nv_cpu_utilization gauge",
        f"nv_cpu_utilization {util:.6f}",
        "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_total_bytes gauge",
        f"nv_cpu_memory_total_bytes {mem.total}",
        "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        f"nv_cpu_memory_used_bytes {mem.total - mem.available}",
    ]


_GPU_GAUGES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    (
        "nv_energy_consumption",
        "counter",
        "GPU energy consumption in joules since the server started",
    ),
)


def _gpu_lines() -> list[str]:
    """nv_gpu_* per GPU through NVML; nothing at all on a machine without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        rows = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            power = _try(lambda h=handle: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            limit = _try(lambda h=handle: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            energy = _try(lambda h=handle: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)
            rows.append((uuid, [util, mem.total, mem.used, power, limit, energy]))
        lines = []
        for i, (name, kind, help_text) in enumerate(_GPU_GAUGES):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for uuid, vals in rows:
                lines.append(f'{name}{{gpu_uuid="{uuid}"}} {vals[i]:.6f}')
        return lines
    finally:
        pynvml.nvmlShutdown()


def _try(fn) -> float:
    try:
        return float(fn())
    except Exception:
        return 0.0
