"""Which accelerators this worker can use; answers 0 cleanly on CPU-only machines."""

from __future__ import annotations

import functools
import os

from analyzer.monitor.nvml import Nvml


@functools.cache
def gpu_count() -> int:
    with Nvml.open() as nvml:  # no driver, no library, no device: 0, a CPU machine
        return len(nvml.devices)


def cpu_count() -> int:
    """CPUs this process may run on (honours taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
