"""A model's readiness as Triton's python backend reports it: the instance's process must be
alive, and a model that defines is_ready() is asked (sync or async, 5 s at most, while execute()
runs too); an exception or a value that is not a bool reads as not ready."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import python_models, start_worker

CONFIG = ('max_batch_size: 0\n'
          'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')

HEAD = '''
import asyncio
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(requests, value):
    return [pb_utils.InferenceResponse([pb_utils.Tensor(
        "OUT", np.array([value], dtype=np.float32))]) for _ in requests]
'''

MODELS = {
    # ready unless a file named "drain" is in its version folder (a graceful drain)
    "drains": HEAD + '''
class TritonPythonModel:
    def is_ready(self):
        return not os.path.exists(os.path.join(pb_utils.get_model_dir(), "drain"))

    def execute(self, requests):
        return answer(requests, 1)
''',
    "async_ready": HEAD + '''
class TritonPythonModel:
    async def is_ready(self):
        await asyncio.sleep(0.01)
        return True

    def execute(self, requests):
        return answer(requests, 1)
''',
    "raises": HEAD + '''
class TritonPythonModel:
    def is_ready(self):
        raise RuntimeError("the feature store is unreachable")

    def execute(self, requests):
        return answer(requests, 1)
''',
    "not_bool": HEAD + '''
class TritonPythonModel:
    def is_ready(self):
        return "yes"

    def execute(self, requests):
        return answer(requests, 1)
''',
    "hangs": HEAD + '''
class TritonPythonModel:
    def is_ready(self):
        time.sleep(60)
        return True

    def execute(self, requests):
        return answer(requests, 1)
''',
    # execute() waits until is_ready() has run: it answers 1 only if is_ready() ran meanwhile
    "busy": HEAD + '''
class TritonPythonModel:
    def initialize(self, args):
        self.asked = threading.Event()

    def is_ready(self):
        self.asked.set()
        return True

    def execute(self, requests):
        return answer(requests, 1 if self.asked.wait(20) else 0)
''',
    # asks about two others from execute(), as a BLS model may before calling them
    "asks": HEAD + '''
class TritonPythonModel:
    def execute(self, requests):
        return answer(requests, int(pb_utils.is_model_ready("drains"))
                      + 2 * int(pb_utils.is_model_ready("raises")))
''',
    # ready only while is_ready() runs on the loop its async execute() ran on (Triton runs both
    # on the model's one loop: what one makes there, the other may use)
    "one_loop": HEAD + '''
class TritonPythonModel:
    def initialize(self, args):
        self.loop = None

    async def is_ready(self):
        return self.loop is None or asyncio.get_running_loop() is self.loop

    async def execute(self, requests):
        self.loop = asyncio.get_running_loop()
        await asyncio.sleep(0)
        return answer(requests, 1)
''',
    # no is_ready(): ready while its process lives; it answers with that process's pid
    "plain": HEAD + '''
class TritonPythonModel:
    def execute(self, requests):
        return answer(requests, os.getpid())
''',
}


# A decoupled model: one thread asks whether "hangs" is ready (5 s to a no), another meanwhile
# calls "async_ready" by BLS and answers 1 if that call came back first, then the first answers its
# readiness + 10, final. The worker reads both threads' messages on one reader thread.
ASKS_WHILE_STREAMING = HEAD + '''
class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            asked = threading.Event()

            def ask():
                ready = pb_utils.is_model_ready("hangs")
                asked.set()
                bls.join()
                sender.send(answer([request], int(ready) + 10)[0],
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            def call():
                time.sleep(0.3)  # the readiness question is with the worker by now
                called = pb_utils.InferenceRequest(
                    model_name="async_ready", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([0], dtype=np.float32))]).exec()
                sender.send(answer([request], int(not asked.is_set()
                                                   and not called.has_error()))[0])

            bls = threading.Thread(target=call)
            bls.start()
            threading.Thread(target=ask).start()
        return None
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("readiness")
    python_models(repo, MODELS, CONFIG)
    python_models(repo, {"streams": ASKS_WHILE_STREAMING},
                  CONFIG + "model_transaction_policy { decoupled: true }\n")
    served = start_worker(repo)
    yield served, repo
    served.stop()


def _infer(client: httpclient.InferenceServerClient, model: str) -> float:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0], dtype=np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUT")[0])


def test_the_models_is_ready_decides_over_http_and_grpc(worker):
    """Before, a model's is_ready() was never called: a model draining or missing what it
    needs read as ready."""
    served, repo = worker
    with httpclient.InferenceServerClient(served.http) as http, \
            grpcclient.InferenceServerClient(served.grpc) as grpc:  # fmt: skip
        for client in (http, grpc):
            assert client.is_model_ready("drains")
            assert client.is_model_ready("async_ready")
            assert not client.is_model_ready("raises")
            assert not client.is_model_ready("not_bool")
            assert client.is_model_ready("plain")
        (repo / "drains" / "1" / "drain").touch()
        try:
            assert not http.is_model_ready("drains")
            assert not grpc.is_model_ready("drains")
            assert _infer(http, "asks") == 0
        finally:
            (repo / "drains" / "1" / "drain").unlink()
        assert http.is_model_ready("drains")
        assert _infer(http, "asks") == 1  # pb_utils.is_model_ready() asks the same way
        assert _infer(http, "raises") == 1  # not ready is the model's word; it still serves
        assert http.is_server_ready()  # the server's readiness is the models' loaded state


def test_is_ready_runs_while_execute_does(worker):
    served, _ = worker
    with httpclient.InferenceServerClient(served.http) as client:
        result: list[float] = []
        call = threading.Thread(target=lambda: result.append(_infer(client, "busy")))
        with httpclient.InferenceServerClient(served.http) as other:
            call.start()
            time.sleep(0.3)  # execute() is waiting now
            assert other.is_model_ready("busy")
            call.join(30)
    assert result == [1]


def test_a_check_that_hangs_reads_as_not_ready_and_blocks_nothing(worker):
    served, _ = worker
    outcome: list[bool] = []

    def check() -> None:
        with httpclient.InferenceServerClient(served.http, network_timeout=30) as client:
            outcome.append(client.is_model_ready("hangs"))

    checks = [threading.Thread(target=check) for _ in range(2)]
    for thread in checks:
        thread.start()
    time.sleep(0.3)
    with grpcclient.InferenceServerClient(served.grpc) as client:
        assert client.is_server_live()  # the loop answers others while the checks wait
        assert client.is_model_ready("plain")
    assert all(thread.is_alive() for thread in checks)  # (they wait 5 s)
    for thread in checks:
        thread.join(30)
    assert outcome == [False, False]


def test_a_dead_process_reads_as_not_ready(worker):
    """Before, a model whose process had died read as ready: every request then failed."""
    served, _ = worker
    with httpclient.InferenceServerClient(served.http) as client:
        pid = int(_infer(client, "plain"))
        assert client.is_model_ready("plain")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while client.is_model_ready("plain") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client.is_model_ready("plain")
        assert not client.is_model_ready("plain", "1")


def test_a_readiness_question_does_not_hold_up_a_streaming_models_other_messages(worker):
    """pb_utils.is_model_ready() from a decoupled model's thread was answered on the thread that
    reads all of that model's messages: a slow is_ready() elsewhere held up its responses and
    BLS calls for up to 5 s."""
    served, _ = worker
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([0], dtype=np.float32))
        client.async_stream_infer("streams", [tensor])
        values = []
        for _ in range(2):
            result, error = got.get(timeout=60)
            assert error is None, error
            values.append(float(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert values == [1, 10]  # the BLS call came back first; "hangs" is not ready


def test_an_async_is_ready_and_an_async_execute_share_the_models_loop(worker):
    served, _ = worker
    client = httpclient.InferenceServerClient(served.http)
    assert client.is_model_ready("one_loop")
    for _ in range(3):
        assert _infer(client, "one_loop") == 1
        assert client.is_model_ready("one_loop")
