"""CPU sampler over psutil: RSS and CPU use of a process tree (the worker and its children).

Python-backend instances are child processes of the worker, so the tree is what the model costs.
CPU is in percent of one core (200 = two cores busy), like `top`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from analyzer.monitor.base import Sampler


@dataclass
class CpuReading:
    rss_mb: float
    cpu_time_s: float  # user + system of every process in the tree (ended children excluded)
    processes: int


@dataclass
class CpuSummary:
    available: bool
    reason: str = ""
    cpu_pct: float = 0.0  # mean over the window, 100 = one core
    rss_mb: float = 0.0  # mean
    rss_max_mb: float = 0.0
    processes: int = 0
    samples: int = 0


class CpuSampler(Sampler):
    """Samples the process `pid` and all its descendants."""

    name = "cpu"

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        super().__init__(interval_s)
        self.pid = pid
        self.reason = ""
        try:
            self._root = psutil.Process(pid)
        except psutil.Error as exc:
            self._root = None
            self.reason = f"no CPU data: process {pid} cannot be read ({exc})"
        self._procs: dict[int, psutil.Process] = {}

    def available(self) -> bool:
        return self._root is not None

    def sample(self) -> CpuReading | None:
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return None  # the worker exited
        rss, cpu, alive = 0, 0.0, 0
        for proc in tree:
            proc = self._procs.setdefault(proc.pid, proc)  # reuse: keeps psutil's caches warm
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    times = proc.cpu_times()
                cpu += times.user + times.system
                alive += 1
            except psutil.Error:
                continue
        return CpuReading(rss / 1e6, cpu, alive) if alive else None

    def summary(self, t0: int, t1: int) -> CpuSummary:
        if not self.available():
            return CpuSummary(False, self.reason)
        with self._lock:
            timed = [(t, s) for t, s in self.samples if t0 <= t <= t1]
        if len(timed) < 2:
            return CpuSummary(False, "no CPU data: the window was shorter than two samples")
        (ta, a), (tb, b) = timed[0], timed[-1]
        readings = [s for _, s in timed]
        return CpuSummary(
            available=True,
            cpu_pct=100.0 * max(0.0, b.cpu_time_s - a.cpu_time_s) / ((tb - ta) / 1e9),
            rss_mb=sum(r.rss_mb for r in readings) / len(readings),
            rss_max_mb=max(r.rss_mb for r in readings),
            processes=max(r.processes for r in readings),
            samples=len(readings),
        )
