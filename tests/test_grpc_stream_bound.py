"""A gRPC stream whose client sends faster than the model answers is held back at the cap."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import grpc
import numpy as np
from serving import start_worker
from test_worker_faults import python_repo
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

CAP = 3
SENT = 30


def request(i: int) -> pb.ModelInferRequest:
    x = np.array([0.05], np.float32)  # 50 ms of work each: the queue would grow to ~SENT
    message = pb.ModelInferRequest(model_name="slow", id=str(i))
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(x.tobytes())
    return message


def pending(metrics: str) -> int:
    text = urllib.request.urlopen(metrics, timeout=10).read().decode()
    found = re.search(r'^nv_inference_pending_request_count\{model="slow".*\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


def test_a_stream_never_has_more_than_its_cap_of_requests_in_the_worker(tmp_path):
    repo, _ = python_repo(tmp_path)
    worker = start_worker(repo, f"--grpc-max-stream-pending={CAP}")
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(pending(worker.metrics))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        with grpc.insecure_channel(worker.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            sampler.start()
            answers = list(stub.ModelStreamInfer(iter([request(i) for i in range(SENT)]),
                                                 timeout=120))  # fmt: skip
        stop.set()
        sampler.join(10)
        assert sorted(int(a.infer_response.id) for a in answers) == list(range(SENT))
        assert not any(a.error_message for a in answers)
        assert seen and max(seen) <= CAP, f"pending requests seen: {max(seen)} > {CAP}"
        assert max(seen) >= 1  # the sampler did see the queue
    finally:
        stop.set()
        worker.stop()


HELD = """
import time
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 60
        while not Path({release!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""


def test_what_waits_in_a_stream_counts_against_the_buffered_total(tmp_path):
    """HTTP/2 flow control bounds a stream's waiting messages in wire bytes only: 8 MiB of
    empty 5-byte messages were 1.7 million Python objects (~20 times the bytes; 1.2 GB for 8
    such streams, and a quadratic pop that held the loop for minutes). What waits now counts
    against --http-max-buffered-size, with each message's overhead: past it the stream ends
    with RESOURCE_EXHAUSTED, and what it held is given back (the next stream is served)."""
    repo, _ = python_repo(tmp_path, "held")
    release = tmp_path / "release"
    (repo / "held" / "1" / "model.py").write_text(HELD.format(release=str(release)))
    worker = start_worker(repo, "--grpc-max-stream-pending=1", "--http-max-buffered-size=1MB")
    first = pb.ModelInferRequest(model_name="held", id="0")
    first.inputs.add(name="X", datatype="FP32", shape=[1])
    first.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    empty = pb.ModelInferRequest()
    try:
        with grpc.insecure_channel(worker.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            # the first request holds the stream's one place until `release` exists; the rest,
            # ~100 KB on the wire, ~2.6 MB waiting, stay in its inbox
            flood = [first] + [empty] * 20_000
            try:
                list(stub.ModelStreamInfer(iter(flood), timeout=120))
                raise AssertionError("the stream was not refused")
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                assert "too many received requests" in err.details()
            release.touch()
            few = [first] + [empty] * 2_000  # well under the total once the flood's is back
            answers = list(stub.ModelStreamInfer(iter(few), timeout=120))
            assert len(answers) == 2_001
            assert sum(not a.error_message for a in answers) == 1
    finally:
        release.touch()
        worker.stop()
