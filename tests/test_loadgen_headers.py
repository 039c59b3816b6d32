"""perf_analyzer's `-H NAME:VALUE` (MA's `http-header`): HTTP headers, gRPC metadata, on the
inference requests and the control calls alike. A worker whose APIs are restricted to a header
(Triton's --http-restricted-api / --grpc-restricted-protocol) answers only a client sending it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serving import EXAMPLES, start_worker

from analyzer.loadgen.control import ServerError
from analyzer.loadgen.inputs import InputError
from analyzer.loadgen.measure import MeasureSettings
from analyzer.loadgen.payload import parse_headers
from analyzer.loadgen.perf import PerfOptions, run_perf

APIS = "inference,metadata,model-config,statistics"


@pytest.fixture(scope="module")
def guarded_worker():
    served = start_worker(EXAMPLES, f"--http-restricted-api={APIS}:x-team=blue",
                          f"--grpc-restricted-protocol={APIS}:x-team=blue")  # fmt: skip
    yield served
    assert served.stop() == 0, "".join(served.output)


def _perf(url: str, protocol: str, headers, **kwargs) -> list:
    settings = MeasureSettings(mode="time_windows", window_ms=300, stability_pct=100, max_trials=2)
    options = PerfOptions(model="add_sub", url=url, protocol=protocol, settings=settings,
                          client_processes=1, concurrency=[2], headers=headers,
                          **kwargs)  # fmt: skip
    return list(run_perf(options))


@pytest.mark.parametrize("protocol,streaming", [("http", False), ("grpc", False), ("grpc", True)])
def test_headers_reach_the_server_on_every_call(guarded_worker, protocol, streaming):
    url = guarded_worker.grpc if protocol == "grpc" else guarded_worker.http
    points = _perf(url, protocol, parse_headers(["X-Team: blue"]), streaming=streaming)
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 10


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_without_the_header_the_guarded_server_refuses(guarded_worker, protocol):
    url = guarded_worker.grpc if protocol == "grpc" else guarded_worker.http
    with pytest.raises(ServerError):
        _perf(url, protocol, ())


def test_header_flags_that_cannot_be_sent_are_one_sentence():
    with pytest.raises(InputError, match="must be NAME:VALUE"):
        parse_headers(["no-colon"])
    with pytest.raises(InputError, match="is set by the load generator itself"):
        parse_headers(["Content-Length: 3"])
    with pytest.raises(InputError, match="line break"):
        parse_headers(["X-A: b\r\nHost: evil"])
    assert parse_headers(["Authorization: Bearer a:b"]) == (("Authorization", "Bearer a:b"),)


def test_the_perf_command_takes_dash_h(guarded_worker):
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "add_sub", "-u", guarded_worker.grpc,
         "-i", "grpc", "-H", "x-team:blue", "-p", "300", "--measurement-mode", "time_windows",
         "-r", "2", "-s", "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
