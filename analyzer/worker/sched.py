"""Which of the worker's threads the CPU scheduler favours when they share a core.

The event loop (HTTP, gRPC, metrics of the same loop) parses and answers requests; the instance
threads run the models. On a core that both need (a one-core worker, or more busy threads than
cores), Linux lets a thread that wakes up preempt the one running: every arriving request then
interrupted the model mid-batch, costing two context switches and the model's cache. Measured on
tiny_cnn at client batch 1 under the dynamic batcher, one core: the instance thread needed 930 µs
of CPU per sample against 770 µs offline. As SCHED_BATCH the loop still gets its fair share of
the core, but waits for the model's time slice to end (or the model to block) instead of
preempting it; an idle core runs it at once, so an unloaded worker answers as fast as before.

Threads inherit their creator's policy, so whatever the loop thread starts after this (executor
threads, and through them instance threads and python-model stubs) sets SCHED_OTHER back for
itself with `normal_policy()`.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def _set(policy_name: str) -> bool:
    policy = getattr(os, policy_name, None)
    setter = getattr(os, "sched_setscheduler", None)
    if policy is None or setter is None:
        return False  # not Linux: the scheduler's defaults stay
    try:
        setter(0, policy, os.sched_param(0))  # 0: the calling thread
    except OSError as err:  # e.g. a seccomp profile that forbids it
        log.debug("cannot set %s on this thread: %s", policy_name, err)
        return False
    return True


def batch_policy() -> bool:
    """The calling thread (the event loop) stops preempting threads on wake-up."""
    return _set("SCHED_BATCH")


def normal_policy() -> bool:
    """The calling thread gets the default policy back (model threads, stub spawner)."""
    return _set("SCHED_OTHER")

