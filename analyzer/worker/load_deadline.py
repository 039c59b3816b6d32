"""How long the model load running on this thread may still take: serve's
--model-load-timeout-secs.

Triton waits for a model's own load code as long as it runs (a python model's initialize() may
load weights for minutes), so by default nothing here limits a load. An operator, or a profile
that starts the worker, may set a limit: a load then fails once it runs out, with one sentence
that names the model, the limit and what was still running, and the python model's process is
stopped, so a hung initialize() holds neither the load request nor the machine.

A load runs on one thread from start to end (an ensemble's composing models load on the same
thread, inside its deadline), so the deadline is the thread's: what waits on the model's code
during a load (the python backend's calls, the warm-up) asks `remaining()` for its wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

FLAG = "--model-load-timeout-secs"


class LoadTimeout(ValueError):
    """A model load ran past its deadline (a ValueError: the load request's answer is a 400,
    as for any model that failed to load)."""


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic()
    model: str
    seconds: float


_local = threading.local()


def _current() -> _Deadline | None:
    current: _Deadline | None = getattr(_local, "current", None)
    return current


@contextmanager
def load_deadline(model: str, seconds: float) -> Iterator[None]:
    """Loads inside this one (an ensemble's composing models) keep the earlier deadline;
    seconds <= 0: no limit of its own."""
    outer = _current()
    if seconds > 0:
        mine = _Deadline(time.monotonic() + seconds, model, seconds)
        if outer is None or mine.at < outer.at:
            _local.current = mine
    try:
        yield
    finally:
        _local.current = outer


def remaining() -> float | None:
    """Seconds left to this thread's load; None: no limit."""
    current = _current()
    return None if current is None else max(0.0, current.at - time.monotonic())


def expired(what: str) -> LoadTimeout:
    """The error for a load whose deadline ran out while `what` (e.g. "instance add_0_0's
    initialize() was still running") held it."""
    current = _current()
    if current is None:  # a caller's timeout that was not the load's: say what ran out
        return LoadTimeout(f"{what} (timed out)")
    return LoadTimeout(f"model '{current.model}' did not finish loading within "
                       f"{current.seconds:g} s ({FLAG}): {what}")  # fmt: skip
