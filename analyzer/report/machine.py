"""What a result was measured on: CPU, memory, GPUs and driver, and the software versions."""

from __future__ import annotations

import functools
import os
import platform
from importlib import metadata
from typing import Any

import psutil

from analyzer.monitor.nvml import Nvml


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> tuple[list[dict[str, Any]], str]:
    """The GPUs and the driver version, or no GPUs and the reason."""
    with Nvml.open() as nvml:
        if not nvml.devices:
            return [], nvml.reason
        gpus = [{"index": d.index, "name": d.name, "uuid": d.uuid,
                 "memory_total_mb": nvml.memory(d)[1] / 2**20} for d in nvml.devices]  # fmt: skip
        return gpus, nvml.driver_version()


@functools.cache
def machine_info() -> dict[str, Any]:
    gpus, driver = _gpus()
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": len(os.sched_getaffinity(0)),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus,
        "gpu_driver": driver if gpus else "",
        "gpu_note": "" if gpus else driver,
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("model-analyzer", "torch", "onnxruntime",
                                              "tritonclient", "numpy", "nvidia-ml-py")},
    }  # fmt: skip
