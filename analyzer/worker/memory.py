"""glibc malloc settings for a worker that allocates large tensors on many threads.

Activations of a batch are often larger than glibc's mmap threshold (128 KiB to 32 MiB, adapted
only for the main arena), so on instance threads every allocation became an mmap and every free
a munmap: each inference paid fresh page faults. Measured on tiny_cnn (batch 8, one core): the
model ran ~1.6x slower on a runner thread than in a plain loop until these limits were raised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_LIMIT = 1 << 30  # keep blocks up to 1 GiB in the heap; give memory back above 1 GiB free


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds; a no-op (False) on other C libraries."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, _LIMIT) == 1 and mallopt(M_TRIM_THRESHOLD, _LIMIT) == 1)
    if not ok:
        log.info("mallopt refused the worker's malloc thresholds")
    return ok


def release_free_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's malloc_trim; False elsewhere).

    The thresholds above keep up to 1 GiB free in each of glibc's per-thread arenas, and every
    load runs on new threads: a failed load that made 100 MiB of warm-up inputs left 100 MiB
    more in the worker each time (six loads: 42 MiB to 559 MiB). Called once a model version
    is unloaded, so what a model used goes back when it goes."""
    gc.collect()  # tensors held only by reference cycles (an exception's frames) go first
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))
