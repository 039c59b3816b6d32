"""The load generator over gRPC ModelStreamInfer: perf_analyzer's `--streaming`, and decoupled
models (any number of responses per request, the last flagged final), for `perf` and `profile`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from serving import start_worker
from test_ensemble import REPEAT, _python_model

from analyzer.loadgen.inputs import InputError
from analyzer.loadgen.measure import MeasureSettings
from analyzer.loadgen.perf import PerfOptions, run_perf

REPEAT_CONFIG = ('name: "repeat" backend: "python" model_transaction_policy { decoupled: true }\n'
                 'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')  # fmt: skip


# one response at once, the final flag alone 50 ms later: a request is done only at the flag
LATE_FINAL = """
import threading, time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))

            def final(sender=sender):
                time.sleep(0.05)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=final).start()
        return None
"""


@pytest.fixture(scope="module")
def repeat_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("streaming")
    _python_model(repo, "repeat", REPEAT, REPEAT_CONFIG)
    _python_model(repo, "late_final", LATE_FINAL, REPEAT_CONFIG.replace('"repeat"', '"late_final"'))
    served = start_worker(repo)
    yield served
    assert served.stop() == 0, "".join(served.output)


def _perf(url: str, model: str, protocol: str = "grpc", **kwargs) -> list:
    settings = MeasureSettings(mode="time_windows", window_ms=400, stability_pct=100, max_trials=2)
    options = PerfOptions(model=model, url=url, protocol=protocol, settings=settings,
                          client_processes=1, **kwargs)  # fmt: skip
    return list(run_perf(options))


def test_a_decoupled_model_is_measured_to_its_final_response(repeat_worker):
    """`repeat` answers each of IN's 4 values as a response of its own, half of them from a
    thread after execute() returned, then the final flag alone: a request counts as done only
    at that flag, so its latency covers every response."""
    points = _perf(repeat_worker.grpc, "repeat", concurrency=[1, 3], shapes={"IN": (4,)})
    assert [p.error_count for p in points] == [0, 0], [p.errors for p in points]
    assert all(p.request_count > 10 for p in points)
    stats = json.loads(subprocess.run(
        ["curl", "-s", f"http://{repeat_worker.http}/v2/models/repeat/stats"],
        capture_output=True, text=True, timeout=30).stdout)  # fmt: skip
    model = stats["model_stats"][0]
    # every response the model sent was read: 4 with values and the final flag, per request
    assert model["inference_count"] >= sum(p.request_count for p in points)


def test_a_decoupled_request_lasts_until_its_final_flag(repeat_worker):
    """Not a speed check: the model holds each request's final flag back 50 ms after its one
    response, so no request can be done sooner unless it was counted done at that response."""
    points = _perf(repeat_worker.grpc, "late_final", concurrency=[2], shapes={"IN": (1,)})
    assert points[0].error_count == 0, points[0].errors
    assert points[0].latency_avg_us >= 50_000, (points[0].latency_avg_us, points[0].p50_us)


def test_a_decoupled_model_at_a_request_rate(repeat_worker):
    points = _perf(repeat_worker.grpc, "repeat", request_rates=[100.0], shapes={"IN": (3,)})
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 20


def test_a_decoupled_model_over_http_is_one_sentence(repeat_worker):
    with pytest.raises(InputError, match="model 'repeat' is decoupled.*needs gRPC streaming"):
        _perf(repeat_worker.http, "repeat", protocol="http", concurrency=[1],
              shapes={"IN": (2,)})  # fmt: skip


def test_streaming_a_plain_model(examples_worker):
    """--streaming on a model with one response per request: done at that response."""
    points = _perf(examples_worker.grpc, "add_sub", concurrency=[2], streaming=True)
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 20
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "add_sub", "-u", examples_worker.grpc,
         "-i", "grpc", "--streaming", "-p", "300", "--measurement-mode", "time_windows",
         "-r", "2", "-s", "100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_decoupled_model_is_profiled(tmp_path: Path):
    repo = tmp_path / "repo"
    _python_model(repo, "repeat", REPEAT, REPEAT_CONFIG)
    (tmp_path / "cfg.yaml").write_text("perf_analyzer_flags:\n  shape: 'IN:3'\n")
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "-f", "cfg.yaml",
         "--model-repository", str(repo), "--profile-models", "repeat",
         "--output-model-repository-path", "OUT", "--export-path", "EXP",
         "--run-config-search-mode", "quick", "--run-config-search-max-instance-count", "2",
         "--run-config-search-max-concurrency", "4", "--final-rounds", "0",
         "--measurement-mode", "time_windows", "--measurement-interval", "300",
         "--stability-percentage", "100", "--max-trials", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "EXP" / "results" / "profile_results.json").read_text())
    assert "repeat" in json.dumps(results)
    assert list((tmp_path / "OUT").glob("repeat*/config.pbtxt"))
