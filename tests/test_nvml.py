"""Every GPU reader goes through analyzer/monitor/nvml.py. A fake pynvml with two GPUs (one that
cannot report power) drives the profile's sampler, the worker's Prometheus lines, the machine
description and the worker's GPU count on a machine without a GPU, so their GPU paths are tested
in CI too; the real NVML is checked by tests/test_gpu.py on a GPU machine."""

from __future__ import annotations

import sys
import time
import types
from types import SimpleNamespace

import pytest

from analyzer.monitor.gpu import GpuSampler
from analyzer.monitor.nvml import Nvml

GIB = 2**30


def fake_pynvml(calls: list[str]) -> types.ModuleType:
    boards = [
        {"uuid": b"GPU-aaaa", "name": b"Fake A100", "used": 3 * GIB, "total": 40 * GIB,
         "util": 55, "power": 210_000},
        {"uuid": "GPU-bbbb", "name": "Fake T4", "used": 1 * GIB, "total": 16 * GIB,
         "util": 5, "power": None},
    ]  # fmt: skip
    nv = types.ModuleType("pynvml")

    def power(h):
        if boards[h]["power"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return boards[h]["power"]

    nv.nvmlInit = lambda: calls.append("init")
    nv.nvmlShutdown = lambda: calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: len(boards)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: boards[h]["uuid"]
    nv.nvmlDeviceGetName = lambda h: boards[h]["name"]
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=boards[h]["used"],
                                                           total=boards[h]["total"])
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=boards[h]["util"])
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 300_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 5_000_000
    nv.nvmlSystemGetDriverVersion = lambda: b"580.1"
    return nv


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    made: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(made))
    return made


def test_a_session_lists_devices_picks_them_and_shuts_down(calls):
    with Nvml.open() as nvml:
        assert [(d.index, d.uuid, d.name) for d in nvml.devices] == [
            (0, "GPU-aaaa", "Fake A100"), (1, "GPU-bbbb", "Fake T4")]  # fmt: skip
        assert [d.index for d in nvml.pick(["GPU-bbbb", "0"])] == [1, 0]
        assert len(nvml.pick(["all"])) == 2
        with pytest.raises(KeyError):
            nvml.pick(["7"])
        assert nvml.driver_version() == "580.1"
    assert calls == ["init", "shutdown"]


def test_the_sampler_reads_the_chosen_gpus_and_tolerates_a_board_without_power(calls):
    sampler = GpuSampler(["GPU-bbbb"], interval_s=0.01)
    assert sampler.available()
    sampler.start()
    t0 = time.monotonic_ns()
    time.sleep(0.1)
    summary = sampler.summary(t0, time.monotonic_ns())
    sampler.stop()
    sampler.close()
    assert summary.available and [g.uuid for g in summary.gpus] == ["GPU-bbbb"]
    gpu = summary.gpus[0]
    assert gpu.memory_used_mb == pytest.approx(GIB / 1e6) and gpu.power_w is None
    assert gpu.utilization_pct == 5.0
    missing = GpuSampler(["GPU-zzzz"])
    assert not missing.available() and "'GPU-zzzz' is not a GPU index or UUID" in missing.reason
    missing.close()
    assert calls.count("init") == calls.count("shutdown") == 2


def test_the_worker_metrics_and_the_machine_description_see_the_same_gpus(calls, monkeypatch):
    from analyzer.report import machine
    from analyzer.worker import devices, metrics

    monkeypatch.setattr(metrics, "_nvml", metrics._Nvml())
    lines = metrics._gpu_lines()
    used = [line for line in lines if line.startswith("nv_gpu_memory_used_bytes")]
    assert used == [f'nv_gpu_memory_used_bytes{{gpu_uuid="GPU-aaaa"}} {3 * GIB:.6f}',
                    f'nv_gpu_memory_used_bytes{{gpu_uuid="GPU-bbbb"}} {GIB:.6f}']  # fmt: skip
    power = [line for line in lines if line.startswith("nv_gpu_power_usage{")]
    assert power[0].endswith(" 210.000000") and power[1].endswith(" 0.000000")
    gpus, driver = machine._gpus()
    assert driver == "580.1" and [g["uuid"] for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]
    devices.gpu_count.cache_clear()
    try:
        assert devices.gpu_count() == 2
    finally:
        devices.gpu_count.cache_clear()
