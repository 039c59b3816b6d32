"""A seeded mutation fuzz of the worker's request decoding: 10,000 requests, all answered, no 5xx.

Valid requests for the examples' add_sub (python) and tiny_cnn (TorchScript) are mutated: field
types, shapes, lengths, names, parameters, truncation, random bytes, and for binary bodies a lying
Inference-Header-Content-Length. Every request must get an answer within TIMEOUT and none may be
a server fault: any 5xx / INTERNAL / UNKNOWN is a bug to investigate. The mutator is a seeded
random.Random, so a failure names the case that reproduces it.

One rule keeps the oracle exact: a positive request `timeout` shorter than the queue wait is
rightly answered 503 (Triton's UNAVAILABLE "request timeout expired"), so the fuzz gives
well-typed timeouts as 0 or at least a minute. Ill-typed ones are fuzzed as much as anything else.
"""

from __future__ import annotations

import http.client
import json
import random
import struct
import time

import grpc
import numpy as np
import pytest
from serving import EXAMPLES, start_worker
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

SEED = 20_240_612
COUNTS = {"json": 4000, "binary": 3000, "grpc": 3000}
TIMEOUT = 15  # seconds for one answer on a busy 2-core machine
LONG_TIMEOUT_US = 60_000_000
WIRE = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BF16",
        "BYTES", "", "float", "FP33", "TYPE_FP32"]  # fmt: skip
NAMES = ["add_sub", "tiny_cnn", "no_such_model", "..", "%2e%2e", "a%2Fb", "-x", "a%00b", "%",
         "add_sub/versions/1", "add_sub/versions/x",
         "tiny_cnn/versions/99999999999999999999"]  # fmt: skip
GRPC_NAMES = ["add_sub", "tiny_cnn", "no_such_model", "..", "../../tmp/x", "a/b", "-x", "a\0b", ""]
PARAM_KEYS = ["priority", "timeout", "sequence_id", "binary_data_output", "binary_data_size",
              "binary_data", "other"]  # fmt: skip
INPUT_NAMES = ["INPUT0", "INPUT1", "INPUT__0", "OUTPUT0", "", "x" * 300]
ODD_VALUES = [None, True, False, 0, -1, 1, 2, 7, 2**31, 2**63, -(2**63), 10**20, 1.5, -0.0,
              float("inf"), "", "x", "1", "FP32", "BYTES", "../x", [], [1], [[1, 2]], [-1, 4],
              {}, {"a": 1}, {"name": "OUTPUT0"}, "a" * 500]  # fmt: skip
SERVER_FAULTS = {
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED,
}  # fmt: skip


@pytest.fixture(scope="module")
def worker():
    served = start_worker(EXAMPLES)
    try:
        yield served
    finally:
        served.stop()


# -- valid requests -----------------------------------------------------------------------------
def _model_tensors(rng: random.Random) -> tuple[str, list[tuple[str, list[int]]]]:
    if rng.random() < 0.75:
        batch = rng.randint(1, 3)
        return "add_sub", [("INPUT0", [batch, 4]), ("INPUT1", [batch, 4])]
    return "tiny_cnn", [("INPUT__0", [1, 3, 32, 32])]


def _values(rng: random.Random, shape: list[int]) -> list[float]:
    return [round(rng.uniform(-2, 2), 2) for _ in range(int(np.prod(shape)))]


def _param_value(rng: random.Random, key: str):
    """Mostly odd values; a well-typed timeout is 0 or at least a minute (see the docstring)."""
    value = rng.choice(ODD_VALUES)
    if key == "timeout" and type(value) is int and 0 < value < LONG_TIMEOUT_US:
        value = rng.choice([0, LONG_TIMEOUT_US])
    return value


# -- mutation of JSON trees ---------------------------------------------------------------------
def _slots(tree, out=None) -> list[tuple]:
    """Every (container, key) in a JSON tree, so any field or element can be mutated."""
    out = [] if out is None else out
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        out.append((tree, key))
        if isinstance(value, dict | list) and value:
            _slots(value, out)
    return out


def _mutate_tree(rng: random.Random, tree: dict) -> None:
    for _ in range(rng.randint(1, 3)):
        slots = _slots(tree)
        if not slots:
            return
        container, key = rng.choice(slots)
        roll = rng.random()
        value = container[key]
        if roll < 0.45:
            container[key] = _param_value(rng, key if isinstance(key, str) else "")
        elif roll < 0.6:
            del container[key]
        elif roll < 0.75 and isinstance(value, list):
            if value and rng.random() < 0.5:
                del value[rng.randrange(len(value)) :]
            else:
                value.extend(rng.choice(ODD_VALUES[:12]) for _ in range(rng.randint(1, 3)))
        elif roll < 0.85 and type(value) is int:
            container[key] = value + rng.choice([-(2**40), -1, 1, 2**40])
        elif roll < 0.9:
            if not isinstance(tree.get("parameters"), dict):
                tree["parameters"] = {}
            param = rng.choice(PARAM_KEYS)
            tree["parameters"][param] = _param_value(rng, param)
        else:
            container[key] = rng.choice(WIRE + INPUT_NAMES)
    _keep_timeouts_long(tree)


def _keep_timeouts_long(tree: dict) -> None:
    params = tree.get("parameters")
    if isinstance(params, dict):
        t = params.get("timeout")
        if type(t) is int and 0 < t < LONG_TIMEOUT_US:
            params["timeout"] = 0


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif roll < 0.7:
            del data[rng.randrange(len(data) + 1) :]
        else:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def _path(rng: random.Random, model: str) -> str:
    name = model if rng.random() < 0.9 else rng.choice(NAMES)
    return f"/v2/models/{name}/infer"


# -- the three kinds of request -----------------------------------------------------------------
def json_case(rng: random.Random) -> tuple[str, bytes, dict]:
    model, tensors = _model_tensors(rng)
    body: dict = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": list(s), "data": _values(rng, s)}
            for n, s in tensors
        ]
    }
    if rng.random() < 0.3:
        body["outputs"] = [{"name": "OUTPUT0" if model == "add_sub" else "OUTPUT__0"}]
    if rng.random() < 0.3:
        body["id"] = str(rng.randrange(1000))
    _mutate_tree(rng, body)
    data = json.dumps(body).encode()
    if rng.random() < 0.1:
        data = _mutate_bytes(rng, data)
    return _path(rng, model), data, {"Content-Type": "application/json"}


def binary_case(rng: random.Random) -> tuple[str, bytes, dict]:
    model, tensors = _model_tensors(rng)
    blobs = [np.asarray(_values(rng, s), np.float32).tobytes() for _, s in tensors]
    header: dict = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": list(s),
             "parameters": {"binary_data_size": len(b)}}
            for (n, s), b in zip(tensors, blobs, strict=True)
        ],
        "parameters": {"binary_data_output": rng.random() < 0.5},
    }  # fmt: skip
    if rng.random() < 0.5:
        _mutate_tree(rng, header)
    if rng.random() < 0.2 and header.get("inputs") and isinstance(header["inputs"], list):
        # a BYTES claim: a count or an element length far beyond the payload
        spec = header["inputs"][0]
        if isinstance(spec, dict):
            spec["datatype"] = "BYTES"
            blobs[0] = struct.pack("<I", rng.choice([3, 3_000_000_000])) + blobs[0][:8]
            spec["parameters"] = {"binary_data_size": len(blobs[0])}
            spec["shape"] = [rng.choice([1, 3_000_000_000])]
    head = json.dumps(header).encode()
    payload = b"".join(blobs)
    if rng.random() < 0.3:
        payload = _mutate_bytes(rng, payload)
    body = head + payload
    length: object = len(head)
    if rng.random() < 0.5:  # the lie
        length = rng.choice([len(head) - 1, len(head) + 1, 0, -1, len(body), len(body) + 7,
                             rng.randrange(len(body) + 1), "abc", "", " 12", "1e3",
                             2**70])  # fmt: skip
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": str(length)}  # fmt: skip
    return _path(rng, model), body, headers


def grpc_case(rng: random.Random) -> pb.ModelInferRequest:
    model, tensors = _model_tensors(rng)
    request = pb.ModelInferRequest(model_name=model)
    raw = rng.random() < 0.7
    for name, shape in tensors:
        tensor = request.inputs.add(name=name, datatype="FP32", shape=shape)
        values = _values(rng, shape)
        if raw:
            request.raw_input_contents.append(np.asarray(values, np.float32).tobytes())
        else:
            tensor.contents.fp32_contents.extend(values)
    for _ in range(rng.randint(1, 3)):
        _mutate_grpc(rng, request)
    return request


def _mutate_grpc(rng: random.Random, request: pb.ModelInferRequest) -> None:
    roll = rng.random()
    tensor = request.inputs[rng.randrange(len(request.inputs))] if request.inputs else None
    if roll < 0.1:
        request.model_name = rng.choice(GRPC_NAMES)
    elif roll < 0.15:
        request.model_version = rng.choice(["1", "2", "x", "-1", "99999999999999999999"])
    elif roll < 0.3 and tensor is not None:
        tensor.shape[:] = [rng.choice([-1, 0, 1, 2, 3, 4, 32, 2**31, 2**62])
                           for _ in range(rng.randint(0, 5))]  # fmt: skip
    elif roll < 0.4 and tensor is not None:
        tensor.datatype = rng.choice(WIRE)
    elif roll < 0.45 and tensor is not None:
        tensor.name = rng.choice(INPUT_NAMES)
    elif roll < 0.6 and request.raw_input_contents:
        i = rng.randrange(len(request.raw_input_contents))
        request.raw_input_contents[i] = _mutate_bytes(rng, request.raw_input_contents[i])
    elif roll < 0.65:
        request.raw_input_contents.append(rng.randbytes(rng.randint(0, 64)))
    elif roll < 0.7 and tensor is not None:
        field = rng.choice(["int_contents", "bytes_contents", "uint_contents", "fp32_contents"])
        values = getattr(tensor.contents, field)
        if field == "bytes_contents":
            values.extend(rng.randbytes(rng.randint(0, 8)) for _ in range(rng.randint(0, 5)))
        else:
            values.extend(rng.randint(0, 1000) for _ in range(rng.randint(0, 5)))
    elif roll < 0.9:
        key = rng.choice(PARAM_KEYS)
        param = request.parameters[key]
        kind = rng.choice(["bool_param", "int64_param", "string_param", "double_param",
                           "uint64_param"])  # fmt: skip
        value = {
            "bool_param": rng.random() < 0.5,
            "int64_param": rng.choice([-(2**63), -1, 0, 1, 2, 2**62]),
            "uint64_param": rng.choice([0, 1, 2, 2**64 - 1]),
            "string_param": rng.choice(["", "1", "high", "x" * 100]),
            "double_param": rng.choice([0.0, 1.5, -1.0, float("nan")]),
        }[kind]
        if key == "timeout" and kind in ("int64_param", "uint64_param") and 0 < value < 2**40:
            value = 0
        setattr(param, kind, value)
    elif roll < 0.95:
        request.outputs.add(name=rng.choice(INPUT_NAMES + ["OUTPUT1", "OUTPUT__0"]))
    elif request.inputs:
        del request.inputs[rng.randrange(len(request.inputs))]


# -- the run -------------------------------------------------------------------------------------
class Http:
    """One keep-alive connection, reopened only when the server closes it."""

    def __init__(self, address: str):
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)

    def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        try:
            self.conn.request("POST", path, body=body, headers=headers)
            response = self.conn.getresponse()
            data = response.read()
            if response.will_close:
                self.reopen()
            return response.status, data
        except (OSError, http.client.HTTPException) as err:
            self.reopen()
            return -1, repr(err).encode()  # no answer: a timeout or a dropped connection

    def reopen(self) -> None:
        self.conn.close()
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)


def test_ten_thousand_mutated_requests_are_all_answered_without_a_server_fault(worker):
    rng = random.Random(SEED)
    faults: list[str] = []
    answered = {"json": 0, "binary": 0, "grpc": 0}
    ok = 0
    started = time.monotonic()
    client = Http(worker.http)
    channel = grpc.insecure_channel(worker.grpc)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for kind in ("json", "binary"):
            make = json_case if kind == "json" else binary_case
            for i in range(COUNTS[kind]):
                path, body, headers = make(rng)
                status, data = client.post(path, body, headers)
                if status < 0 or status >= 500:
                    faults.append(f"{kind} #{i} {path} -> {status} {data[:200]!r}; "
                                  f"headers {headers}; body {body[:300]!r}")  # fmt: skip
                else:
                    answered[kind] += 1
                    ok += status == 200
        for i in range(COUNTS["grpc"]):
            request = grpc_case(rng)
            try:
                stub.ModelInfer(request, timeout=TIMEOUT)
                ok += 1
            except grpc.RpcError as err:
                if err.code() in SERVER_FAULTS or err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    faults.append(f"grpc #{i} -> {err.code()} {err.details()[:200]}; "
                                  f"request {str(request)[:300]!r}")  # fmt: skip
                    continue
            answered["grpc"] += 1
        elapsed = time.monotonic() - started
        assert not faults, f"{len(faults)} faults, first ones:\n" + "\n".join(faults[:10])
        assert answered == COUNTS
        assert ok > 100, "the mutator should leave some requests valid"
        assert worker.process.poll() is None, "".join(worker.output)
        _assert_serves(client, stub)
        print(f"fuzz: {sum(COUNTS.values())} requests, {ok} valid, {elapsed:.1f} s")
    finally:
        client.conn.close()
        channel.close()


def _assert_serves(client: Http, stub) -> None:
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                       for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    status, data = client.post("/v2/models/add_sub/infer", json.dumps(body).encode(), {})
    assert status == 200 and json.loads(data)["outputs"][0]["data"] == [2, 4, 6, 8]
    request = pb.ModelInferRequest(model_name="tiny_cnn")
    request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 3, 32, 32])
    request.raw_input_contents.append(np.zeros(3 * 32 * 32, np.float32).tobytes())
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    assert len(response.raw_output_contents[0]) == 10 * 4
