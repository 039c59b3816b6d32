"""Scheduling semantics seen from outside: batching under load and parallel instances.

Judged on execution timestamps reported by the model itself (CLOCK_MONOTONIC, shared by all
processes) and on statistics ratios, never on absolute durations.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from serving import EXAMPLES, start_worker

TIMER_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.05)
        end = time.monotonic()
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            n = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("START", np.full((n, 1), start)),
                pb_utils.Tensor("END", np.full((n, 1), end)),
                pb_utils.Tensor("BATCH", np.full((n, 1), len(requests), np.int64)),
            ]))
        return responses
"""


def timer_config(name: str, count: int, batching: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
{batching}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [1] }} ]
output [
  {{ name: "START" data_type: TYPE_FP64 dims: [1] }},
  {{ name: "END" data_type: TYPE_FP64 dims: [1] }},
  {{ name: "BATCH" data_type: TYPE_INT64 dims: [1] }}
]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def timer_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("timers")
    models = {
        "one_instance": (1, ""),
        "two_instances": (2, ""),
        "batched": (1, "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    }
    for name, (count, batching) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(timer_config(name, count, batching))
        (repo / name / "1" / "model.py").write_text(TIMER_MODEL)
    served = start_worker(repo)
    yield served
    assert served.stop() == 0


def fire(address: str, model: str, n: int) -> list[tuple[float, float, int]]:
    """n concurrent single-sample requests; returns each one's (start, end, batch requests)."""
    client = httpclient.InferenceServerClient(address, concurrency=n)
    try:
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), np.float32))
        pending = [client.async_infer(model, [x]) for _ in range(n)]
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    return [
        (float(r.as_numpy("START")[0, 0]), float(r.as_numpy("END")[0, 0]),
         int(r.as_numpy("BATCH")[0, 0]))
        for r in results
    ]  # fmt: skip


def overlapping_pairs(spans) -> int:
    intervals = sorted({(s, e) for s, e, _ in spans})
    return sum(
        1
        for i, (s1, e1) in enumerate(intervals)
        for s2, e2 in intervals[i + 1 :]
        if s2 < e1 and s1 < e2
    )


def test_one_instance_serialises_two_instances_overlap(timer_worker):
    one = fire(timer_worker.http, "one_instance", 4)
    two = fire(timer_worker.http, "two_instances", 4)
    assert len({(s, e) for s, e, _ in one}) == 4 and overlapping_pairs(one) == 0
    assert overlapping_pairs(two) >= 1


def test_dynamic_batcher_forms_batches_under_concurrent_load(timer_worker):
    spans = fire(timer_worker.http, "batched", 8)
    assert max(b for _, _, b in spans) > 1
    client = httpclient.InferenceServerClient(timer_worker.http)
    stats = client.get_inference_statistics("batched")["model_stats"][0]
    client.close()
    assert stats["execution_count"] < stats["inference_count"] == 8


def test_without_dynamic_batching_requests_run_alone(timer_worker):
    spans = fire(timer_worker.http, "two_instances", 6)
    assert {b for _, _, b in spans} == {1}


def test_parallel_instances_finish_faster_than_serial_ones(timer_worker):
    """Ratio of wall spans: 2 instances take about half as long for the same 6 requests."""
    one = fire(timer_worker.http, "one_instance", 6)
    two = fire(timer_worker.http, "two_instances", 6)
    span = lambda xs: max(e for _, e, _ in xs) - min(s for s, _, _ in xs)  # noqa: E731
    assert span(two) / span(one) < 0.75


def _policies(pid: int) -> dict[int, int]:
    """Scheduling policy (field 41 of /proc/<pid>/task/<tid>/stat) of each thread."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = task.joinpath("stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = int(fields[38])  # fields after 'comm', which may hold spaces
    return out


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_the_event_loop_yields_the_core_to_model_threads(examples_worker):
    """The loop thread is SCHED_BATCH; model threads and python-model stubs are not."""
    pid = examples_worker.process.pid
    policies = _policies(pid)
    assert policies.pop(pid) == os.SCHED_BATCH
    assert policies and set(policies.values()) == {os.SCHED_OTHER}
    stubs = psutil.Process(pid).children(recursive=True)
    assert stubs  # add_sub is a python model: its instances run in stub processes
    for stub in stubs:
        assert os.sched_getscheduler(stub.pid) == os.SCHED_OTHER


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_the_loop_policy_can_be_left_alone():
    worker = start_worker(EXAMPLES, "--loop-yields-to-models", "false")
    try:
        assert set(_policies(worker.process.pid).values()) == {os.SCHED_OTHER}
    finally:
        assert worker.stop() == 0, "".join(worker.output)
