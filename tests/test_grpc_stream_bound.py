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
