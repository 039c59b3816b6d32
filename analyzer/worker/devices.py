"""Which accelerators this worker can use; answers 0 cleanly on CPU-only machines."""

from __future__ import annotations

import functools
import os


@functools.cache
def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library, no device: a CPU machine
        return 0


def cpu_count() -> int:
    """CPUs this process may run on (honours taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
