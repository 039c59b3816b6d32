"""Monitors: the GPU sampler's clean "no GPU" answer here, real readings on a GPU machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
    assert 30 < summary.cpu_pct <= 110  # one core spinning (shared with the test on 2 cores)
    assert summary.rss_mb > 5
    gone = CpuSampler(2**22 + 12345)
    assert not gone.available() and "cannot be read" in gone.summary(0, 1).reason


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
