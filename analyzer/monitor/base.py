"""A sampler polls one resource on its own thread and summarises any window of its samples.

Lifecycle: `start()` once per session, `summary(t0, t1)` for each measurement window (times on
the CLOCK_MONOTONIC ns clock the load generator uses), `stop()` at the end. Sampling runs
continuously, so windows cost nothing extra and a summary never waits for the next sample.
"""

from __future__ import annotations

import bisect
import threading
import time
from abc import ABC, abstractmethod
from typing import Any


class Sampler(ABC):
    """Base of the GPU and CPU samplers: a daemon thread appending (t_ns, sample) pairs."""

    name = "sampler"

    def __init__(self, interval_s: float = 0.1, keep: int = 100_000) -> None:
        self.interval_s = interval_s
        self.keep = keep
        self.samples: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._thread is not None or not self.available():
            return
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic_ns()
            sample = self.sample()
            if sample is not None:
                with self._lock:
                    self.samples.append((t, sample))
                    if len(self.samples) > self.keep:
                        del self.samples[: len(self.samples) - self.keep]
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.close()

    def window(self, t0: int, t1: int) -> list[Any]:
        return [s for _, s in self.timed(t0, t1)[1]]

    def timed(self, t0: int, t1: int) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
        """(the last (t_ns, sample) before t0, as a list of at most one; those in [t0, t1])."""
        with self._lock:
            first = bisect.bisect_left(self.samples, t0, key=lambda pair: pair[0])
            last = bisect.bisect_right(self.samples, t1, key=lambda pair: pair[0])
            return self.samples[max(0, first - 1):first], self.samples[first:last]

    def available(self) -> bool:
        """False when the resource cannot be sampled here; summary() then says why."""
        return True

    @abstractmethod
    def sample(self) -> Any:
        """One reading, or None when nothing could be read this time."""

    @abstractmethod
    def summary(self, t0: int, t1: int) -> Any:
        """A record summarising the samples taken in [t0, t1]."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the resource's handles."""
