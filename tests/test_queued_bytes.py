"""The bytes of requests accepted and not yet answered have a worker-wide cap (--max-queued-size):
the connection caps bound requests in number, not in bytes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

from analyzer.worker.errors import InferError
from analyzer.worker.limits import HeldBytes
from analyzer.worker.request import ELEMENT_OVERHEAD, input_bytes

SLOW = '''
import time

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
            [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().size], dtype=np.int64))])
            for r in requests]
'''


def test_the_count_of_held_bytes():
    held = HeldBytes(100)
    assert held.take(60) and not held.take(41) and held.take(40)
    held.give(60)
    assert held.held == 40 and held.take(60) and not held.take(1)
    numbers = np.zeros((2, 3), dtype=np.float32)
    words = np.array([b"abc", b"", b"defgh"], dtype=object)
    # a BYTES element counts its bytes and its own object
    assert input_bytes({"a": numbers, "b": words}) == 24 + 8 + 3 * ELEMENT_OVERHEAD
    assert input_bytes({"b": np.full(1_000, b"", dtype=object)}) == 1_000 * ELEMENT_OVERHEAD


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("queued_bytes")
    python_models(repo, {"slow": SLOW},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
                  'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    served = start_worker(repo, "--max-queued-size", "1MB")
    yield served
    served.stop()


def _input(values: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("IN", [values], "FP32")
    tensor.set_data_from_numpy(np.ones(values, dtype=np.float32))
    return tensor


def test_requests_past_the_cap_are_refused_until_the_held_ones_are_answered(worker):
    """Before, pipelined requests at a slow model were held whatever their size: 64 of 64 MiB
    per connection on 4,096 connections."""
    quarter = 300_000 // 4  # 300 kB of FP32 each: three fit under 1 MiB, the fourth does not
    with httpclient.InferenceServerClient(worker.http, concurrency=4) as client:
        pending = [client.async_infer("slow", [_input(quarter)]) for _ in range(3)]
        # the three are held while the model sleeps (one runs, two wait in its queue)
        with pytest.raises(InferenceServerException, match="--max-queued-size") as refused:
            client.infer("slow", [_input(quarter)])
        assert refused.value.status() == "503"
        assert [int(p.get_result().as_numpy("OUT")[0]) for p in pending] == [quarter] * 3
        # all answered: their bytes are free again
        assert int(client.infer("slow", [_input(quarter)]).as_numpy("OUT")[0]) == quarter


def test_each_request_counts_what_the_worker_holds_of_it_besides_its_inputs():
    from analyzer.worker.limits import REQUEST_OVERHEAD
    from analyzer.worker.request import InferRequest

    held = HeldBytes(64 * 1024)
    tiny = [InferRequest("m", {"IN": np.ones(1, np.float32)}, {"IN": "FP32"}, None,
                         lambda outputs, error: None) for _ in range(22)]
    for request in tiny[:21]:
        held.admit(request)
    assert held.held == 21 * (4 + REQUEST_OVERHEAD)
    with pytest.raises(InferError, match="--max-queued-size"):
        held.admit(tiny[21])
    held.release(tiny[0])
    held.admit(tiny[21])


def test_tiny_requests_are_bounded_in_number_too(tmp_path):
    """A request's inputs were all that counted: a queued request of one INT32 counted 4 bytes
    while the worker held ~3 KB for it, and a client that cancels frees its connection or call
    slot while its request waits, so tiny requests at a slow model grew the queue without
    bound. Each request now counts REQUEST_OVERHEAD too: 64 KiB hold 21."""
    import json
    import select
    import socket

    python_models(tmp_path, {"slow": SLOW},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]\n')
    served = start_worker(tmp_path, "--max-queued-size", "64KB")
    host, port = served.http.rsplit(":", 1)
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1],
                                   "data": [1.0]}]}).encode()  # fmt: skip
    request = (b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(body) + body)  # fmt: skip
    sockets = []
    try:
        for _ in range(30):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(request)
            sockets.append(sock)
        refused, waiting, end = 0, list(sockets), time.monotonic() + 5
        while waiting and time.monotonic() < end:
            ready, _, _ = select.select(waiting, [], [], 1)
            for sock in ready:
                waiting.remove(sock)
                head = sock.recv(4096)
                refused += head.startswith(b"HTTP/1.1 503") and b"--max-queued-size" in head
        # 21 x 3 KiB (plus 4 bytes each) fit in 64 KiB; the model may answer one meanwhile
        assert 1 <= refused <= 30 - 21, refused
    finally:
        for sock in sockets:
            sock.close()
        served.stop()
