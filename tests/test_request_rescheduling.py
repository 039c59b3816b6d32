"""Request rescheduling (python backend) on iterative sequences, as Triton runs them: a model
releases a request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and the sequence batcher queues
it again for a later batch, mixing it with new requests (continuous batching)."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

HEAD = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils

RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(value, dtype=np.int32))])
'''

# Each request asks for STEPS iterations; the model keeps its count by the CORRID the sequence
# batcher fills in, starts it at START, answers after the last step the number of iterations
# it saw and in how many batches another request was also present.
STEPS = HEAD + '''
class TritonPythonModel:
    def initialize(self, args):
        self.left = {}
        self.shared = {}

    def execute(self, requests):
        time.sleep(0.02)  # one step: long enough for the requests sent at once to meet
        responses = []
        for request in requests:
            corrid = int(tensor(request, "CORRID").reshape(-1)[0])
            if int(tensor(request, "START").reshape(-1)[0]) == 1:
                if corrid in self.left:
                    raise pb_utils.TritonModelException("START twice for one sequence")
                self.left[corrid] = int(tensor(request, "IN").reshape(-1)[0])
                self.shared[corrid] = 0
            elif corrid not in self.left:
                raise pb_utils.TritonModelException("a sequence continued without START")
            self.left[corrid] -= 1
            self.shared[corrid] += len(requests) > 1
            if self.left[corrid] > 0:
                request.set_release_flags(RESCHEDULE)
                responses.append(None)
            else:
                steps = int(tensor(request, "IN").reshape(-1)[0])
                responses.append(out([[steps, self.shared.pop(corrid)]]))
                del self.left[corrid]
        return responses
'''

# Triton's documented decoupled example: IN responses counting down, the request rescheduled
# after each but the last
COUNTDOWN = HEAD + '''
class TritonPythonModel:
    def initialize(self, args):
        self.remaining = None

    def execute(self, requests):
        for request in requests:
            if self.remaining is None:
                self.remaining = int(tensor(request, "IN")[0])
            sender = request.get_response_sender()
            self.remaining -= 1
            if self.remaining <= 0:
                sender.send(out([self.remaining]), flags=FINAL)
                self.remaining = None
            else:
                request.set_release_flags(RESCHEDULE)
                sender.send(out([self.remaining]))
        return None
'''

# reschedules every request once, after SLEEP seconds
ONCE = HEAD + '''
class TritonPythonModel:
    def initialize(self, args):
        self.seen = set()

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(tensor(request, "IN")[0])
            if value not in self.seen:
                self.seen.add(value)
                time.sleep(float(pb_utils.get_model_dir().endswith("slow/1")) * 0.5)
                request.set_release_flags(RESCHEDULE)
                responses.append(None)
            else:
                responses.append(out([value + 100]))
        return responses
'''

IO = ('input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')  # fmt: skip


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("rescheduling")
    python_models(repo, {"steps": STEPS},
                  'max_batch_size: 4\n'
                  'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
                  'sequence_batching { iterative_sequence: true control_input [\n'
                  '  { name: "START" control [ { kind: CONTROL_SEQUENCE_START '
                  'int32_false_true: [ 0, 1 ] } ] },\n'
                  '  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID '
                  'data_type: TYPE_UINT64 } ] } ] }\n')
    python_models(repo, {"countdown": COUNTDOWN},
                  'max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
                  'sequence_batching { iterative_sequence: true }\n' + IO)
    python_models(repo, {"once": ONCE}, 'max_batch_size: 0\n'
                  'sequence_batching { iterative_sequence: true }\n' + IO)
    python_models(repo, {"slow": ONCE}, 'max_batch_size: 0\n'
                  'sequence_batching { iterative_sequence: true '
                  'max_sequence_idle_microseconds: 200000 }\n' + IO)
    python_models(repo, {"not_iterative": ONCE}, 'max_batch_size: 0\n'
                  'dynamic_batching { }\n' + IO)
    served = start_worker(repo)
    yield served
    served.stop()


def _input(value: int, shape: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return tensor


def test_a_rescheduled_request_is_answered_by_its_next_execution(worker):
    """A model with sequence_batching { iterative_sequence: true } was refused at load, and
    set_release_flags(RESCHEDULE) raised."""
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        for value in (1, 2):
            result = client.infer("once", [_input(value, [1])])  # no sequence id, no flags
            assert int(result.as_numpy("OUT")[0]) == value + 100
        stats = client.get_inference_statistics("once", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 4  # each request ran twice


def test_sequences_under_way_share_batches_with_new_ones(worker):
    """Requests of 1 to 6 steps at once, on one instance of max_batch_size 4: each gets its
    own count back (its state kept by the CORRID the batcher fills in, started once by START),
    and the executions were shared."""
    got: queue.Queue = queue.Queue()
    steps = [1, 2, 3, 4, 5, 6, 2, 3]
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        for index, n in enumerate(steps):
            client.async_infer("steps", [_input(n, [1, 1])], request_id=str(index),
                               callback=lambda result, error: got.put((result, error)))
        answers = {}
        for _ in steps:
            result, error = got.get(timeout=60)
            assert error is None, error
            answers[result.get_response().id] = [int(v) for v in result.as_numpy("OUT")[0]]
        stats = client.get_inference_statistics("steps", as_json=True)["model_stats"][0]
    assert {i: answers[str(i)][0] for i in range(len(steps))} == dict(enumerate(steps))
    assert sum(shared for _, shared in answers.values()) > 0  # some iterations were batched
    assert int(stats["execution_count"]) < sum(steps)


def test_a_decoupled_model_streams_across_its_executions(worker):
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(worker.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("countdown", [_input(3, [1])])
        values = []
        for _ in range(3):
            result, error = got.get(timeout=60)
            assert error is None, error
            values.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert values == [2, 1, 0]


def test_a_sequence_idle_past_its_limit_cannot_be_rescheduled(worker):
    """Triton's rule: the model kept the request longer than max_sequence_idle_microseconds, so
    its sequence ended and the rescheduled request is refused."""
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        with pytest.raises(InferenceServerException,
                           match="must specify the START flag on the first request"):
            client.infer("slow", [_input(1, [1])])


def test_rescheduling_without_iterative_sequences_is_an_error(worker):
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        with pytest.raises(InferenceServerException,
                           match="released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"):
            client.infer("not_iterative", [_input(1, [1])])
