"""The real NVIDIA perf_analyzer (2.41.0, installed by the set-up) drives the worker."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from serving import ROOT

PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["add_sub", "tiny_cnn"])
def test_perf_analyzer_drives_the_worker(examples_worker, protocol, model, tmp_path: Path):
    assert PERF_ANALYZER.exists(), "the set-up (make test) installs perf_analyzer into .venv"
    url = examples_worker.http if protocol == "http" else examples_worker.grpc
    csv = tmp_path / "pa.csv"
    cmd = [
        str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol,
        "--concurrency-range", "1:8:7", "-p", "500", "-s", "100", "-r", "30", "-f", str(csv),
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    throughputs = [float(x) for x in re.findall(r"Throughput: ([\d.]+) infer/sec", run.stdout)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), run.stdout
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("Concurrency,Inferences/Second") and len(rows) == 3


def test_perf_analyzer_streams_to_the_worker(examples_worker, tmp_path: Path):
    """`-i grpc --streaming`: every request of a ModelStreamInfer stream answered with its id
    and the final-response flag perf_analyzer asks for, or it exits with an error."""
    csv = tmp_path / "pa.csv"
    cmd = [
        str(PERF_ANALYZER), "-m", "add_sub", "-u", examples_worker.grpc, "-i", "grpc",
        "--streaming", "--concurrency-range", "4", "-p", "500", "-s", "100", "-r", "30",
        "-f", str(csv),
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    throughput = re.findall(r"Throughput: ([\d.]+) infer/sec", run.stdout)
    assert len(throughput) == 1 and float(throughput[0]) > 0, run.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(examples_worker, protocol, tmp_path: Path):
    """`--shared-memory system`: perf_analyzer registers its regions, sends every input and asks
    for every output through them, and unregisters them; the worker serves Triton's extension on
    both protocols."""
    url = examples_worker.http if protocol == "http" else examples_worker.grpc
    cmd = [
        str(PERF_ANALYZER), "-m", "add_sub", "-u", url, "-i", protocol, "--shared-memory",
        "system", "--output-shared-memory-size", "64", "--concurrency-range", "2", "-p", "500",
        "-s", "100", "-r", "30",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    throughput = re.findall(r"Throughput: ([\d.]+) infer/sec", run.stdout)
    assert len(throughput) == 1 and float(throughput[0]) > 0, run.stdout
