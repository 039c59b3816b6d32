"""perf_analyzer's `--shared-memory system` in the load generator: the requests name regions the
worker maps instead of carrying tensors; the regions are registered for the load and gone after."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from analyzer.loadgen.inputs import InputError
from analyzer.loadgen.measure import MeasurementError, MeasureSettings
from analyzer.loadgen.perf import PerfOptions, run_perf


def _options(served, model: str, protocol: str, **kwargs) -> PerfOptions:
    settings = MeasureSettings(mode="time_windows", window_ms=300, stability_pct=100, max_trials=2)
    url = served.grpc if protocol == "grpc" else served.http
    return PerfOptions(model=model, url=url, protocol=protocol, settings=settings,
                       client_processes=1, concurrency=[2], **kwargs)  # fmt: skip


def _regions(served) -> list[str]:
    with urllib.request.urlopen(f"http://{served.http}/v2/systemsharedmemory/status") as r:
        return [region["name"] for region in json.load(r)]


def _ours() -> list[str]:
    return [p.name for p in Path("/dev/shm").glob("model_analyzer_*")]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["add_sub", "tiny_cnn"])
def test_requests_name_shared_memory_regions(examples_worker, protocol, model):
    points = run_perf(_options(examples_worker, model, protocol, shared_memory="system"))
    registered: list[str] = []
    try:
        point = next(points)  # the load ran with the regions registered: they are there now
        assert point.error_count == 0, point.errors
        assert point.request_count > 0  # (a 300-ms window on a busy machine: a handful)
        registered = [r for r in _regions(examples_worker) if r.startswith("model_analyzer_")]
        assert len(registered) == 2  # in, out
        assert set(registered) <= set(_ours())  # each is a file of ours under /dev/shm
        assert list(points) == []  # the sweep ends: the regions are unregistered and removed
    finally:
        points.close()  # a failed check above must not leave them to the next test's checks
    assert not [r for r in _regions(examples_worker) if r.startswith("model_analyzer_")]
    assert not set(registered) & set(_ours())  # (other tests' regions may come and go meanwhile)


def test_an_output_larger_than_its_region_is_the_servers_error(examples_worker):
    options = _options(examples_worker, "tiny_cnn", "http", shared_memory="system",
                       output_shm_size=8)  # tiny_cnn's output is 10 floats, 40 bytes
    with pytest.raises(MeasurementError, match="no successful request"):
        list(run_perf(options))
    assert not [r for r in _regions(examples_worker) if r.startswith("model_analyzer_")]


def test_cuda_shared_memory_is_one_sentence(examples_worker):
    with pytest.raises(InputError, match="system shared memory only"):
        list(run_perf(_options(examples_worker, "add_sub", "http", shared_memory="cuda")))


def test_the_perf_command_takes_the_shared_memory_flags(examples_worker):
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "add_sub", "-u", examples_worker.grpc,
         "-i", "grpc", "--shared-memory", "system", "--output-shared-memory-size", "1024",
         "-p", "300", "--measurement-mode", "time_windows", "-r", "2", "-s", "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
