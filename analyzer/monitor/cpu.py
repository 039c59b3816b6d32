"""CPU sampler over psutil: RSS and CPU use of a process tree (the worker and its children).

Python-backend instances are child processes of the worker, so the tree is what the model costs.
CPU is in percent of one core (200 = two cores busy), like `top`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

from analyzer.monitor.base import Sampler


@dataclass
class CpuReading:
    rss_mb: float
    cpu_time_s: float  # the tree's CPU (user + system) since the sampler first saw each process
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
    """Samples the process `pid` and all its descendants.

    Finding the descendants reads every process's /proc entry (psutil's children() builds the
    host's parent map): ~24 ms a time on a host with ~1,000 processes, a quarter of a core at
    10 Hz (benchmarks/sampler_cost.py), and this thread runs on the load generator's CPUs. So
    the tree is looked up again only every RESCAN_S, or less often where a lookup costs more
    (its cost stays under ~2% of a core); each sample reads only the processes known. A
    worker's tree changes when a model loads (a python instance's process), which is before a
    point's warm-up, not inside its window.

    `cpu_time_s` is a counter that only grows: a process found by the first lookup counts from
    then, one found later all its CPU (it was born since the lookup before), and one that ends
    keeps what it was counted, so a window's difference is CPU spent in the window.
    """

    name = "cpu"
    RESCAN_S = 1.0
    SCAN_SHARE = 0.02  # the most of a core the lookups may take

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        super().__init__(interval_s)
        self.pid = pid
        self.reason = ""
        try:
            self._root = psutil.Process(pid)
        except psutil.Error as exc:
            self._root = None
            self.reason = f"no CPU data: process {pid} cannot be read ({exc})"
        # pid -> (process, CPU seconds at which it started counting, CPU seconds last read)
        self._known: dict[int, tuple[psutil.Process, float, float]] = {}
        self._ended_s = 0.0  # CPU counted for processes that have ended
        self._next_scan = 0.0  # time.monotonic() of the next lookup
        self._scanned = False  # the tree has been looked up once
        self._reading = threading.Lock()

    def available(self) -> bool:
        return self._root is not None

    def _scan(self) -> bool:
        """Look the tree up again; False when the root process has gone."""
        assert self._root is not None
        started = time.monotonic()
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return False
        cost = time.monotonic() - started
        self._next_scan = started + max(self.RESCAN_S, cost / self.SCAN_SHARE)
        first, self._scanned = not self._scanned, True
        for proc in tree:
            known = self._known.get(proc.pid)
            if known is not None:
                if known[0] == proc:  # psutil compares the pid and the start time
                    continue
                self._ended_s += known[2] - known[1]  # the pid was reused: that one ended
            try:
                cpu = _cpu_s(proc)
            except psutil.Error:
                continue
            # the previous lookup listed every descendant alive then: one new now was born since
            self._known[proc.pid] = (proc, cpu if first else 0.0, cpu)
        return True

    def sample(self) -> CpuReading | None:
        with self._reading:  # the sampler's thread, and summary() for a window it missed
            return self._sample()

    def _sample(self) -> CpuReading | None:
        if self._root is None:
            return None
        if time.monotonic() >= self._next_scan and not self._scan():
            return None  # the worker exited
        rss, counted, alive = 0, 0.0, 0
        for pid, (proc, base, last) in list(self._known.items()):
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu = _cpu_s(proc)
            except psutil.Error:
                self._ended_s += last - base
                del self._known[pid]
                continue
            self._known[pid] = (proc, base, cpu)
            counted += cpu - base
            alive += 1
        if self._root.pid not in self._known:
            return None  # the worker exited (what it left running is not the model's)
        return CpuReading(rss / 1e6, self._ended_s + counted, alive)

    def summary(self, t0: int, t1: int) -> CpuSummary:
        if not self.available():
            return CpuSummary(False, self.reason)
        before, timed = self.timed(t0, t1)
        if len(timed) < 2:
            # a window shorter than two intervals, or one this thread could not keep up with
            # (a starved core): the readings either side of it, the later one taken now, rather
            # than no figures at all
            taken = time.monotonic_ns()
            now = self.sample()
            timed = before + timed + ([(taken, now)] if now is not None else [])
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


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)
