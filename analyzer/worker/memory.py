"""glibc malloc settings for a worker that allocates large tensors on many threads.

Activations of a batch are often larger than glibc's mmap threshold (128 KiB to 32 MiB, adapted
only for the main arena), so on instance threads every allocation became an mmap and every free
a munmap: each inference paid fresh page faults. Measured on tiny_cnn (batch 8, one core): the
model ran ~1.6x slower on a runner thread than in a plain loop until these limits were raised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
