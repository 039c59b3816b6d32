"""Monitors: the GPU sampler's clean "no GPU" answer here, real readings on a GPU machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from analyzer.monitor.cpu import CpuSampler
from analyzer.monitor.gpu import GpuSampler
from analyzer.worker import devices

HAS_GPU = devices.gpu_count() > 0


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: the no-GPU path cannot be taken")
def test_gpu_sampler_without_gpu_says_so_and_never_raises():
    sampler = GpuSampler(interval_s=0.01)
    sampler.start()  # a no-op without devices
    t0 = time.monotonic_ns()
    time.sleep(0.05)
    summary = sampler.summary(t0, time.monotonic_ns())
    sampler.stop()
    assert summary.available is False
    assert summary.reason.startswith("no GPU")
    assert summary.gpus == [] and summary.memory_used_mb == 0


def test_gpu_sampler_unknown_device_is_no_gpu():
    sampler = GpuSampler(["GPU-does-not-exist"])
    summary = sampler.summary(0, time.monotonic_ns())
    sampler.stop()
    assert summary.available is False and summary.reason.startswith("no GPU")


@pytest.mark.skipif(not HAS_GPU, reason="no GPU on this machine")
def test_gpu_sampler_reads_memory_utilisation_and_power():
    sampler = GpuSampler(interval_s=0.02)
    sampler.start()
    t0 = time.monotonic_ns()
    time.sleep(0.3)
    summary = sampler.summary(t0, time.monotonic_ns())
    sampler.stop()
    assert summary.available, summary.reason
    for gpu in summary.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.samples >= 5
        assert 0 < gpu.memory_used_max_mb <= gpu.memory_total_mb
        assert 0 <= gpu.utilization_pct <= 100


def test_cpu_sampler_measures_a_busy_process_tree():
    # a parent that sleeps and a child that spins: the tree's CPU is the child's
    code = "import subprocess, sys, time; "
    code += "subprocess.Popen([sys.executable, '-c', 'while 1: pass']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.5)
        sampler = CpuSampler(parent.pid, interval_s=0.02)
        sampler.start()
        t0 = time.monotonic_ns()
        time.sleep(0.5)
        summary = sampler.summary(t0, time.monotonic_ns())
        sampler.stop()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert summary.available and summary.samples >= 5
    assert summary.processes == 2
    # one core spinning, the parent asleep (~0): under a full test run's load the child may get
    # a quarter of a core (26% once beside three test processes)
    assert 10 < summary.cpu_pct <= 110
    assert summary.rss_mb > 5
    gone = CpuSampler(2**22 + 12345)
    assert not gone.available() and "cannot be read" in gone.summary(0, 1).reason


def test_cpu_sampler_keeps_the_cpu_of_a_process_that_ended_in_the_window():
    """A python instance that ends inside a window (a crash, an unload) still spent its CPU in
    it: the tree's counter keeps what it counted (it used to drop it, and the window read ~0)."""
    burn = "import time\nwhile time.process_time() < 0.4: pass"
    code = ("import subprocess, sys\nsys.stdin.readline()\n"
            f"subprocess.run([sys.executable, '-c', {burn!r}])\nprint('done', flush=True)\n"
            "sys.stdin.readline()\n")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    sampler = CpuSampler(parent.pid, interval_s=0.02)
    sampler.RESCAN_S = 0.0  # every sample looks the tree up: the child is seen while it runs
    try:
        sampler.start()
        time.sleep(0.2)
        t0 = time.monotonic_ns()
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "done\n"
        time.sleep(0.2)
        summary = sampler.summary(t0, time.monotonic_ns())
    finally:
        sampler.stop()
        parent.kill()
        parent.wait()
    spent = [reading.cpu_time_s for t, reading in sampler.samples if t >= t0]
    assert spent[-1] - spent[0] >= 0.3  # the child's 0.4 s of CPU, after it ended
    assert summary.available and summary.cpu_pct > 0
    assert summary.processes == 2


def test_cpu_sampler_looks_the_process_table_up_once_a_while(monkeypatch):
    """Finding a tree's processes reads every process on the host (~24 ms at ~1,000): once a
    RESCAN_S, not at every sample; the samples between read only the processes known."""
    lookups = []
    real = psutil.Process.children
    monkeypatch.setattr(psutil.Process, "children",
                        lambda self, recursive=False: lookups.append(1) or real(self, recursive))
    sampler = CpuSampler(os.getpid())
    sampler.RESCAN_S = 3600.0
    readings = [sampler.sample() for _ in range(20)]
    assert len(lookups) == 1
    assert all(r is not None and r.processes >= 1 for r in readings)
    assert readings[-1].cpu_time_s >= readings[0].cpu_time_s


def test_a_window_the_sampler_missed_gets_the_readings_either_side():
    """A point's window with fewer than two readings (short, or the sampler's core starved: a
    docker profile under load lost one row's RAM figure) takes the reading before it and one
    taken at its end."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sampler = CpuSampler(child.pid, interval_s=3600.0)  # one reading, at the start
    sampler.start()
    try:
        for _ in range(100):
            if sampler.samples:
                break
            time.sleep(0.01)
        t0 = time.monotonic_ns()
        summary = sampler.summary(t0, time.monotonic_ns())
    finally:
        sampler.stop()
        child.kill()
        child.wait()
    assert summary.available, summary.reason
    assert summary.samples == 2 and summary.rss_mb > 5 and summary.processes == 1


def test_tritons_host_metric_flags(monkeypatch):
    """--allow-cpu-metrics / --allow-gpu-metrics turn families off; --metrics-interval-ms reads
    the host at most once an interval, every scrape between served the last reading."""
    from analyzer.worker import metrics

    reads = []
    monkeypatch.setattr(metrics, "_cpu_lines", lambda: reads.append("cpu") or ["nv_cpu_x 1"])
    monkeypatch.setattr(metrics, "_gpu_lines", lambda: reads.append("gpu") or ["nv_gpu_x 1"])
    assert "nv_cpu_x" not in metrics.render_metrics([], metrics.HostMetrics(cpu=False))
    assert "nv_gpu_x" not in metrics.render_metrics([], metrics.HostMetrics(gpu=False))
    reads.clear()
    every = metrics.HostMetrics()
    for _ in range(3):
        assert "nv_cpu_x 1" in metrics.render_metrics([], every)
    assert reads.count("cpu") == 3  # the default here: read at every scrape
    reads.clear()
    cached = metrics.HostMetrics(interval_ms=60_000)
    for _ in range(3):
        assert "nv_gpu_x 1" in metrics.render_metrics([], cached)
    assert reads == ["cpu", "gpu"]  # once in the interval
