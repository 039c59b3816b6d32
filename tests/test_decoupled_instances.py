"""A decoupled python model's instance is free once execute() returns, as in Triton: its open
requests are answered as their responses come, while the instance runs the next call."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving import python_models, start_worker

IO = ('input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'instance_group [ { count: 1 kind: KIND_CPU } ]\n')  # fmt: skip

OVERLAP = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

SECOND = threading.Event()


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))])


class TritonPythonModel:
    """Request 1 answers 100 at once, then waits (20 s at most) for request 2 to reach
    execute() before it answers 1 (seen) or 0 (not seen) and its final flag. Request 2 is
    answered 2, final, in execute(). One instance: request 2 reaches it only if the instance
    is free while request 1 is still open. Both keep their own input (IN), whatever the
    other call wrote after them."""

    def execute(self, requests):
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            sender = request.get_response_sender()
            if int(tensor.as_numpy()[0]) == 2:
                SECOND.set()
                sender.send(out(2), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(out(100))

            def wait(sender=sender, tensor=tensor):
                seen = SECOND.wait(20)
                sender.send(out(int(seen)))
                sender.send(out(int(tensor.as_numpy()[0])),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=wait).start()
        return None
'''

DIES = '''
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """One response, then the model's process ends without sending the final flag."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))]))

            def die():
                time.sleep(0.3)
                os._exit(3)

            threading.Thread(target=die).start()
        return None
'''


SLOW = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))])


class TritonPythonModel:
    """1 at once, then 2 and the final flag a second later."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(out(1))

            def rest(sender=sender):
                time.sleep(1.0)
                sender.send(out(2), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=rest).start()
        return None
'''


# async def execute: request 1's coroutine waits (10 s at most) for request 2's execute() on the
# same instance, then answers 1 if it came (the coroutines ran side by side, Triton's rule for a
# decoupled model) or 0; request 2 answers 2. Request 3 sends 30, then its coroutine raises.
ASYNC = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.second = None

    async def execute(self, requests):
        if self.second is None:
            self.second = asyncio.Event()
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if value == 1:
                try:
                    await asyncio.wait_for(self.second.wait(), 10)
                    sender.send(out(1), flags=FINAL)
                except asyncio.TimeoutError:
                    sender.send(out(0), flags=FINAL)
            elif value == 2:
                self.second.set()
                sender.send(out(2), flags=FINAL)
            else:
                sender.send(out(30))
                await asyncio.sleep(0.01)
                raise RuntimeError("the coroutine failed half way")
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled_instances")
    python_models(repo, {"overlap": OVERLAP, "dies": DIES, "slow": SLOW, "async": ASYNC},
                  'max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n' + IO)
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "*")
    yield served
    served.stop()


class _Stream:
    def __init__(self, url: str) -> None:
        self.got: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def send(self, model: str, value: int, request_id: str) -> None:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
        self.client.async_stream_infer(model, [tensor], request_id=request_id)

    def next(self) -> tuple[str, int | None, bool, object]:
        result, error = self.got.get(timeout=60)
        if error is not None:
            return "", None, True, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        array = result.as_numpy("OUT")
        return response.id, None if array is None else int(array[0]), final, None

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_the_instance_takes_the_next_call_while_a_request_is_open(worker):
    """The instance stayed busy until request 1's final flag, so request 2 waited behind it:
    concurrent streams to one instance were served one after another, and a profile of a
    streaming model read lower than Triton serves it."""
    stream = _Stream(worker.grpc)
    try:
        stream.send("overlap", 1, "first")
        assert stream.next()[:2] == ("first", 100)  # request 1 is in, and open
        stream.send("overlap", 2, "second")
        got: dict[str, list[int | None]] = {"first": [100], "second": []}
        while len(got["first"]) < 3 or len(got["second"]) < 1:
            request_id, value, _, error = stream.next()
            assert error is None, error
            got[request_id].append(value)
    finally:
        stream.close()
    assert got["second"] == [2]
    assert got["first"] == [100, 1, 1]  # request 2 ran while it was open; its input intact
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        stats = client.get_inference_statistics("overlap", as_json=True)
    model = stats["model_stats"][0]
    assert int(model["execution_count"]) == 2
    assert int(model["inference_stats"]["success"]["count"]) == 2


def test_open_requests_of_a_model_that_ends_are_answered(worker):
    """A decoupled model whose process ends with requests still open: they get an error instead
    of waiting for ever."""
    stream = _Stream(worker.grpc)
    try:
        stream.send("dies", 1, "r")
        assert stream.next()[:2] == ("r", 7)
        _, _, _, error = stream.next()
    finally:
        stream.close()
    assert error is not None and "stopped before sending every final response" in str(error)


def test_an_unload_lets_open_requests_finish(worker):
    """The instance is idle while its request streams on: the unload waits for the final flag
    before the model's process is finalized, as Triton's does."""
    stream = _Stream(worker.grpc)
    try:
        stream.send("slow", 0, "r")
        assert stream.next()[:2] == ("r", 1)
        with grpcclient.InferenceServerClient(worker.grpc) as client:
            client.unload_model("slow")
            got = stream.next()
            assert got[3] is None, got[3]
            assert got[:3] == ("r", 2, True)
            assert not client.is_model_ready("slow")
    finally:
        stream.close()


def test_async_executes_of_a_decoupled_model_run_side_by_side(worker):
    """The instance waited for each async execute() to finish before it took the next call:
    a model waiting on I/O served one request at a time."""
    stream = _Stream(worker.grpc)
    try:
        stream.send("async", 1, "first")
        stream.send("async", 2, "second")
        got = {}
        for _ in range(2):
            request_id, value, final, error = stream.next()
            assert error is None and final, error
            got[request_id] = value
    finally:
        stream.close()
    assert got == {"first": 1, "second": 2}


def test_a_failed_async_execute_answers_its_open_requests(worker):
    """Its coroutine raised after one response, after execute() had returned (it runs in the
    background now): the request still gets the error as its final answer, not an open stream
    until the model's unload."""
    stream = _Stream(worker.grpc)
    try:
        stream.send("async", 3, "r")
        assert stream.next()[:2] == ("r", 30)
        _, _, _, error = stream.next()
    finally:
        stream.close()
    assert error is not None and "the coroutine failed half way" in str(error)
