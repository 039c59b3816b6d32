"""Large BYTES tensors are decoded and encoded away from the event loop (offload.py).

A 64 MiB body of 16 million BYTES elements was decoded on the loop: 8.6 s in which the worker
answered no one, its health checks included (7-8 s more to encode an echo of it). These tests
check that such inputs leave the loop, keep each model's arrival order, are bounded and answered
on every path, and come back intact over HTTP, gRPC and gRPC streaming.
"""

from __future__ import annotations

import http.client
import json
import queue
import threading

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from analyzer.datatypes import serialize_bytes_tensor
from analyzer.worker import grpc_messages, http_tensors, offload
from analyzer.worker.errors import InferError, Status
from analyzer.worker.limits import HeldBytes
from analyzer.worker.request import InferRequest

N = offload.OFFLOAD_ELEMENTS


def _words(count: int) -> np.ndarray:
    return np.array([str(i).encode() for i in range(count)], dtype=object)


# -- which inputs leave the loop ---------------------------------------------------------------
def test_only_large_bytes_inputs_are_left_to_the_side_thread():
    small, large = _words(N - 1), _words(N)
    blob = serialize_bytes_tensor(small) + serialize_bytes_tensor(large)
    header = {"inputs": [
        {"name": "S", "datatype": "BYTES", "shape": [N - 1],
         "parameters": {"binary_data_size": len(serialize_bytes_tensor(small))}},
        {"name": "L", "datatype": "BYTES", "shape": [N],
         "parameters": {"binary_data_size": len(serialize_bytes_tensor(large))}},
    ]}  # fmt: skip
    plan = http_tensors._make_plan(header, keep=False)
    inputs, wires, pending = http_tensors._decode_inputs(plan, None, memoryview(blob))
    assert inputs["S"].tolist() == small.tolist()
    assert list(inputs) == ["S", "L"] and inputs["L"] is offload.PENDING  # its place is kept
    assert pending is not None and [(p.name, p.size) for p in pending] == [
        ("L", len(serialize_bytes_tensor(large)))]
    assert pending[0].make is not None and pending[0].make().tolist() == large.tolist()

    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[
        serialize_bytes_tensor(small), serialize_bytes_tensor(large)])
    request.inputs.add(name="S", datatype="BYTES", shape=[N - 1])
    request.inputs.add(name="L", datatype="BYTES", shape=[N])
    inputs, wires, pending = grpc_messages.decode_inputs(request)
    assert inputs["S"].tolist() == small.tolist() and inputs["L"] is offload.PENDING
    assert pending is not None and [p.name for p in pending] == ["L"]

    fixed = pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(4 * N)])
    fixed.inputs.add(name="X", datatype="FP32", shape=[N])
    assert grpc_messages.decode_inputs(fixed)[2] is None  # other types are views, never pending

    # typed contents are one Python value per element: large ones are converted later too
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="X", datatype="FP32", shape=[N]).contents.fp32_contents.extend(
        range(N))
    typed.inputs.add(name="Y", datatype="INT32", shape=[2]).contents.int_contents.extend([7, 8])
    inputs, wires, pending = grpc_messages.decode_inputs(typed)
    assert inputs["X"] is offload.PENDING and inputs["Y"].tolist() == [7, 8]
    assert pending is not None and [p.name for p in pending] == ["X"]
    assert pending[0].make is not None
    assert pending[0].make().tolist() == list(map(float, range(N)))


class _Model:
    """Records what reaches `submit`, on which thread; refuses requests whose id says so."""

    def __init__(self, name: str, held: HeldBytes | None = None) -> None:
        self.name = name
        self.held = held
        self.got: list[tuple[str, int, list[bytes] | None]] = []

    def submit(self, request: InferRequest, checked: bool = False) -> None:
        if request.id == "refuse":
            raise InferError("refused by the model", Status.INVALID_ARG)
        text = request.inputs.get("TEXT")
        self.got.append((request.id, threading.get_ident(),
                         None if text is None else text[:2].tolist()))  # fmt: skip
        request.on_done({}, None)


def _request(rid: str, answers: queue.Queue, count: int = 0, cut: int = 0
             ) -> tuple[InferRequest, list[offload.PendingInput] | None]:  # fmt: skip
    """A request for `_Model`; with `count`, a pending BYTES input of that many elements
    (`cut` bytes short of them)."""
    inputs = {"TEXT": offload.PENDING} if count else {}
    request = InferRequest("m", inputs, {"TEXT": "BYTES"} if count else {}, None,
                           lambda outputs, error: answers.put((rid, error)), id=rid)  # fmt: skip
    if not count:
        return request, None
    data = serialize_bytes_tensor(_words(count))
    return request, [offload.pending_bytes("TEXT", data[: len(data) - cut], (count,), count)]


def test_a_models_later_requests_follow_its_deferred_one_and_other_models_go_on(monkeypatch):
    gate = threading.Event()
    decode = offload.tensor_from_bytes

    def held_back(*args, **kwargs):
        assert gate.wait(30)
        return decode(*args, **kwargs)

    monkeypatch.setattr(offload, "tensor_from_bytes", held_back)
    answers: queue.Queue = queue.Queue()
    first, other = _Model("first"), _Model("other")
    offload.submit(first, *_request("big", answers, N))
    offload.submit(first, *_request("small", answers))  # no BYTES: it still waits its turn
    offload.submit(other, *_request("elsewhere", answers))  # another model is not held up
    assert [g[0] for g in other.got] == ["elsewhere"] and other.got[0][1] == threading.get_ident()
    assert first.got == []
    gate.set()
    got = {answers.get(timeout=30)[0] for _ in range(3)}
    assert got == {"big", "small", "elsewhere"}
    assert [g[0] for g in first.got] == ["big", "small"]  # arrival order
    assert first.got[0][2] == [b"0", b"1"]  # decoded before the model saw it
    assert all(g[1] != threading.get_ident() for g in first.got)  # on the side thread
    offload.submit(first, *_request("after", answers))  # nothing waits now: queued directly
    assert first.got[-1][:2] == ("after", threading.get_ident())


def test_a_request_cancelled_while_it_waits_is_answered_and_not_decoded(monkeypatch):
    gate = threading.Event()
    decode = offload.tensor_from_bytes
    decoded: list[int] = []

    def held_back(*args, **kwargs):
        assert gate.wait(30)
        decoded.append(args[3])
        return decode(*args, **kwargs)

    monkeypatch.setattr(offload, "tensor_from_bytes", held_back)
    answers: queue.Queue = queue.Queue()
    model = _Model("m")
    offload.submit(model, *_request("first", answers, N))
    gone, pending = _request("gone", answers, N + 1)
    offload.submit(model, gone, pending)
    gone.cancel()  # its client disconnects while the first is decoded
    gate.set()
    got = dict(answers.get(timeout=30) for _ in range(2))
    assert got["first"] is None
    assert isinstance(got["gone"], InferError) and str(got["gone"]) == "request was cancelled"
    assert got["gone"].status == Status.UNAVAILABLE
    assert [g[0] for g in model.got] == ["first"] and decoded == [N]


def test_deferred_requests_are_answered_when_they_fail_and_their_bytes_are_counted():
    answers: queue.Queue = queue.Queue()
    held = HeldBytes(limit=10 << 20)
    model = _Model("m", held)
    # a count the buffer does not hold: answered with the input's name, as inline decoding is
    offload.submit(model, *_request("short", answers, N, cut=1))
    rid, error = answers.get(timeout=30)
    assert rid == "short" and isinstance(error, InferError)
    assert error.status == Status.INVALID_ARG and "input 'TEXT': truncated BYTES element" in str(
        error)
    # the model's own refusal reaches the client too
    offload.submit(model, *_request("refuse", answers, N))
    rid, error = answers.get(timeout=30)
    assert rid == "refuse" and str(error) == "refused by the model"
    assert held.held == 0  # what a waiting request held is given back
    # past --max-queued-size a request is refused before it waits
    tight = _Model("tight", HeldBytes(limit=1000))
    with pytest.raises(InferError, match="--max-queued-size") as refused:
        offload.submit(tight, *_request("big", answers, N))
    assert refused.value.status == Status.UNAVAILABLE
    assert answers.empty() and tight.got == []


# -- a real worker -----------------------------------------------------------------------------
ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            __import__("json").loads(args["model_config"]))

    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            reply = pb_utils.InferenceResponse([
                pb_utils.Tensor("ECHO", text[::-1].copy()),
                pb_utils.Tensor("N", np.array([text.size], dtype=np.int64))])
            if self.decoupled:
                sender = request.get_response_sender()
                sender.send(reply)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                out.append(reply)
        return None if self.decoupled else out
"""
CONFIG = ('max_batch_size: 0 input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ] '
          'output [ { name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] }, '
          '{ name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]')  # fmt: skip


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("offload")
    python_models(repo, {"echo": ECHO}, CONFIG)
    python_models(repo, {"echo_decoupled": ECHO},
                  CONFIG + " model_transaction_policy { decoupled: true }")  # fmt: skip
    served = start_worker(repo)
    try:
        yield served
    finally:
        served.stop()


WORDS = _words(N + 5)
EXPECTED = WORDS[::-1].tolist()


@pytest.mark.parametrize("binary", [True, False])
def test_large_bytes_round_trip_over_http(worker, binary):
    with httpclient.InferenceServerClient(worker.http) as client:
        text = httpclient.InferInput("TEXT", [WORDS.size], "BYTES")
        text.set_data_from_numpy(WORDS, binary_data=True)
        outputs = [httpclient.InferRequestedOutput("ECHO", binary_data=binary),
                   httpclient.InferRequestedOutput("N", binary_data=binary)]  # fmt: skip
        result = client.infer("echo", [text], outputs=outputs)
        echoed = result.as_numpy("ECHO")
        assert [w if isinstance(w, bytes) else w.encode() for w in echoed.tolist()] == EXPECTED
        assert result.as_numpy("N").tolist() == [WORDS.size]


def test_large_bytes_round_trip_over_grpc_and_its_stream(worker):
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        text = grpcclient.InferInput("TEXT", [WORDS.size], "BYTES")
        text.set_data_from_numpy(WORDS)
        result = client.infer("echo", [text])
        assert result.as_numpy("ECHO").tolist() == EXPECTED
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for model in ("echo", "echo_decoupled", "echo"):
                client.async_stream_infer(model, [text], request_id=model)
            ids = []
            for _ in range(3):  # as they are answered: a stream orders nothing across models
                result, error = answers.get(timeout=60)
                assert error is None, error
                ids.append(result.get_response().id)
                assert result.as_numpy("ECHO").tolist() == EXPECTED
            assert sorted(ids) == ["echo", "echo", "echo_decoupled"]
        finally:
            client.stop_stream()


def test_a_large_malformed_bytes_input_is_answered_over_both_protocols(worker):
    count = N + 1
    blob = serialize_bytes_tensor(_words(count))[:-1]  # the last element is one byte short
    header = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [count],
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    conn = http.client.HTTPConnection(worker.http, timeout=60)
    conn.request("POST", "/v2/models/echo/infer", header + blob,
                 {"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 400
    assert body["error"] == "input 'TEXT': truncated BYTES element"
    request = pb.ModelInferRequest(model_name="echo", raw_input_contents=[blob])
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[count])
    with grpc.insecure_channel(worker.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "input 'TEXT': truncated BYTES element"
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=60).live  # the worker goes on


def test_a_large_json_request_is_read_off_the_loop_and_answered(worker):
    """A REST body of 1 MiB of JSON or more is parsed and converted on the offload thread."""
    words = _words(150_000)
    body = json.dumps({"id": "big", "inputs": [{
        "name": "TEXT", "datatype": "BYTES", "shape": [words.size],
        "data": [w.decode() for w in words.tolist()]}]}).encode()  # fmt: skip
    assert len(body) >= offload.OFFLOAD_JSON_BYTES
    conn = http.client.HTTPConnection(worker.http, timeout=60)
    try:
        conn.request("POST", "/v2/models/echo/infer", body)
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        assert answer["id"] == "big"
        echoed = {o["name"]: o["data"] for o in answer["outputs"]}
        assert echoed["N"] == [words.size]
        assert echoed["ECHO"] == [w.decode() for w in words[::-1].tolist()]
        # its errors come back as the inline path's would
        conn.request("POST", "/v2/models/echo/infer", body[:-1])
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 400 and error.startswith("malformed JSON in request body")
        wrong = body.replace(b'"datatype": "BYTES"', b'"datatype": "INT32"')
        conn.request("POST", "/v2/models/echo/infer", wrong)
        response = conn.getresponse()
        assert response.status == 400
        assert "'data' of a" in json.loads(response.read())["error"]
    finally:
        conn.close()


def test_large_typed_contents_round_trip_over_grpc(worker):
    request = pb.ModelInferRequest(model_name="echo")
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[WORDS.size])
    text.contents.bytes_contents.extend(WORDS.tolist())
    with grpc.insecure_channel(worker.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, timeout=60)
    names = [o.name for o in response.outputs]
    echoed = grpc_messages.tensor_from_bytes(response.raw_output_contents[names.index("ECHO")],
                                             "BYTES", (WORDS.size,))  # fmt: skip
    assert echoed.tolist() == EXPECTED
