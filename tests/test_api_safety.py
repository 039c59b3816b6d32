"""The protocol layer against a real worker: names, restricted APIs, bounds, types, answers.

Every attack is sent the way a client on the network would send it (raw http.client bodies, raw
gRPC stubs), and every test checks the worker still serves afterwards.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import struct
import time

import grpc
import numpy as np
import pytest
from serving import EXAMPLES, start_worker
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

MIB = 1 << 20
GRPC_CAP = "1MB"
TIMEOUT = 30  # seconds any single answer may take on a loaded 2-core machine
KEY = ("x-key", "abc")

MODELS = {
    # answers OUTPUT Y only, though its config also lists Z; for X == 2, Y is complex, which no
    # Triton datatype carries
    "partial": (
        """
name: "partial"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "Z" data_type: TYPE_INT32 dims: [ 1 ] }
]
""",
        """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            y = x.astype(np.complex64) if x[0] == 2 else x
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
""",
    ),
    # one instance busy for SLOW_S per request, so a second request waits in the queue
    "slow": (
        """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
        """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
""",
    ),
}
SLOW_S = 1.5


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("safety")
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    for name, (config, code) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(code)
    served = start_worker(repo, f"--grpc-max-message-size={GRPC_CAP}")
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def restricted():
    served = start_worker(
        EXAMPLES,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--http-restricted-api=model-repository,statistics:x-key=abc",
        "--grpc-restricted-protocol=model-repository:x-key=abc",
        "--grpc-restricted-protocol=inference:x-infer=def",
    )
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture()
def conn(worker):
    c = http.client.HTTPConnection(*_host_port(worker.http), timeout=TIMEOUT)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def stub(worker):
    channel = grpc.insecure_channel(worker.grpc)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


# -- helpers ------------------------------------------------------------------------------------
def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def call(conn, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    """One request on a keep-alive connection; (status, JSON body or {})."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    raw = response.read()
    try:
        return response.status, json.loads(raw) if raw else {}
    except ValueError:
        return response.status, {"raw": raw}


def add_sub_body() -> dict:
    return {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
            for n in ("INPUT0", "INPUT1")
        ]
    }


def add_sub_request(name: str = "add_sub") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=name)
    for n in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=n, datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1, 2, 3, 4])
    return request


def x_request(model: str, x: int, outputs=()) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype="INT32", shape=[1]).contents.int_contents.append(x)
    for name in outputs:
        request.outputs.add(name=name)
    return request


def x_body(x: int, outputs=()) -> dict:
    body: dict = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [x]}]}
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    return body


def grpc_code(fn, *args, **kwargs) -> grpc.StatusCode:
    try:
        fn(*args, timeout=TIMEOUT, **kwargs)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def assert_serves(conn, stub) -> None:
    status, body = call(conn, "POST", "/v2/models/add_sub/infer", add_sub_body())
    assert status == 200, body
    assert body["outputs"][0]["data"] == [2, 4, 6, 8]
    response = stub.ModelInfer(add_sub_request(), timeout=TIMEOUT)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2, 4, 6, 8]


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def reset_peak_rss(pid: int) -> int:
    """Reset the kernel's peak-RSS mark (VmHWM) of our worker; return its RSS now, in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss(pid: int) -> int:
    return _status_kib(pid, "VmHWM") * 1024


# -- 1. model names -----------------------------------------------------------------------------
HTTP_BAD_NAMES = ["..", ".", "-rf", "%2E%2E", "..%2F..%2Ftmp%2Fx", "a%5Cb", "a%00b", "-%2Fx"]
HTTP_NAME_ROUTES = [
    ("GET", "/v2/models/{}"),
    ("GET", "/v2/models/{}/versions/1"),
    ("GET", "/v2/models/{}/ready"),
    ("GET", "/v2/models/{}/config"),
    ("GET", "/v2/models/{}/stats"),
    ("POST", "/v2/models/{}/infer"),
    ("POST", "/v2/repository/models/{}/load"),
    ("POST", "/v2/repository/models/{}/unload"),
]


def test_http_refuses_bad_model_names_on_every_route(conn, stub):
    for method, route in HTTP_NAME_ROUTES:
        body = add_sub_body() if method == "POST" else None
        for name in HTTP_BAD_NAMES:
            status, answer = call(conn, method, route.format(name), body)
            assert status == 400, (route, name, answer)
            assert "invalid model name" in answer["error"], (route, name, answer)
        # a well-formed unknown name passes the check and reaches the lookup
        status, answer = call(conn, method, route.format("no_such_model"), body)
        assert status != 200 and "invalid model name" not in answer.get("error", ""), route
    assert_serves(conn, stub)


GRPC_BAD_NAMES = ["../../../../tmp/x", "a/b", "..", ".", "-x", "a\\b", "a\0b"]


def test_grpc_refuses_bad_model_names_on_every_rpc(conn, stub):
    config = pb.ModelRepositoryParameter(string_param='{"backend": "python"}')
    for name in GRPC_BAD_NAMES:
        calls = [
            (stub.ModelReady, pb.ModelReadyRequest(name=name)),
            (stub.ModelMetadata, pb.ModelMetadataRequest(name=name)),
            (stub.ModelConfig, pb.ModelConfigRequest(name=name)),
            (stub.ModelStatistics, pb.ModelStatisticsRequest(name=name)),
            (stub.ModelInfer, add_sub_request(name)),
            (stub.RepositoryModelLoad,
             pb.RepositoryModelLoadRequest(model_name=name, parameters={"config": config})),
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=name)),
        ]  # fmt: skip
        for rpc, request in calls:
            assert grpc_code(rpc, request) == grpc.StatusCode.INVALID_ARGUMENT, (rpc, name)
    answers = list(
        stub.ModelStreamInfer(iter([add_sub_request(n) for n in GRPC_BAD_NAMES]), timeout=TIMEOUT)
    )
    assert len(answers) == len(GRPC_BAD_NAMES)
    assert all("invalid model name" in a.error_message for a in answers)
    assert_serves(conn, stub)


# -- 2. restricted APIs -------------------------------------------------------------------------
def test_http_restricted_api_needs_the_header_and_leaves_the_rest_open(restricted):
    c = http.client.HTTPConnection(*_host_port(restricted.http), timeout=TIMEOUT)
    try:
        refused = [
            ("POST", "/v2/repository/index", None),
            ("POST", "/v2/repository/models/add_sub/unload", None),
            ("POST", "/v2/repository/models/add_sub/load", None),
            ("GET", "/v2/models/stats", None),
            ("GET", "/v2/models/add_sub/stats", None),
        ]
        for method, path, body in refused:
            for headers in ({}, {"x-key": "abd"}, {"x-other": "abc"}):
                status, answer = call(c, method, path, body, headers)
                assert status == 403, (path, headers, answer)
                assert answer["error"] == "This API is restricted, expecting header 'x-key'"
        assert call(c, "GET", "/v2/models/add_sub/ready")[0] == 200  # the unload never ran
        for method, path, _ in refused:
            assert call(c, method, path, None, {"X-Key": "abc"})[0] == 200, path
        status, _ = call(c, "GET", "/v2/models/add_sub/ready")
        assert status == 200  # unloaded then loaded again, both with the key
        open_routes = [
            ("GET", "/v2"), ("GET", "/v2/health/live"), ("GET", "/v2/health/ready"),
            ("GET", "/v2/models/add_sub"), ("GET", "/v2/models/add_sub/config"),
        ]  # fmt: skip
        for method, path in open_routes:
            assert call(c, method, path)[0] == 200, path
        assert call(c, "POST", "/v2/models/add_sub/infer", add_sub_body())[0] == 200
    finally:
        c.close()


def test_grpc_restricted_protocol_needs_the_metadata_key(restricted):
    with grpc.insecure_channel(restricted.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        unload = pb.RepositoryModelUnloadRequest(model_name="add_sub")
        load = pb.RepositoryModelLoadRequest(model_name="add_sub")
        for rpc, request in [
            (stub.RepositoryIndex, pb.RepositoryIndexRequest()),
            (stub.RepositoryModelUnload, unload),
            (stub.RepositoryModelLoad, load),
        ]:
            for metadata in ((), (("x-key", "abd"),), (("x-other", "abc"),)):
                try:
                    rpc(request, metadata=metadata, timeout=TIMEOUT)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.UNAVAILABLE
                    assert "x-key" in err.details()
                else:
                    raise AssertionError(f"{rpc} answered without the key")
        assert stub.ModelReady(pb.ModelReadyRequest(name="add_sub"), timeout=TIMEOUT).ready
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=(KEY,), timeout=TIMEOUT)
        assert index.models
        stub.RepositoryModelUnload(unload, metadata=(KEY,), timeout=TIMEOUT)
        assert not stub.ModelReady(pb.ModelReadyRequest(name="add_sub"), timeout=TIMEOUT).ready
        stub.RepositoryModelLoad(load, metadata=(KEY,), timeout=TIMEOUT)
        # statistics are restricted on HTTP only; health, metadata and model-config are open
        assert stub.ModelStatistics(pb.ModelStatisticsRequest(), timeout=TIMEOUT).model_stats
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name="add_sub"), timeout=TIMEOUT)
        assert stub.ModelConfig(pb.ModelConfigRequest(name="add_sub"), timeout=TIMEOUT)
        # inference has its own key on gRPC, for unary calls and streams alike
        infer = ("x-infer", "def")
        assert grpc_code(stub.ModelInfer, add_sub_request()) == grpc.StatusCode.UNAVAILABLE
        assert stub.ModelInfer(add_sub_request(), metadata=(infer,), timeout=TIMEOUT)
        try:
            list(stub.ModelStreamInfer(iter([add_sub_request()]), timeout=TIMEOUT))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE and "x-infer" in err.details()
        else:
            raise AssertionError("a restricted stream answered without the key")
        answers = stub.ModelStreamInfer(iter([add_sub_request()]), metadata=(infer,), timeout=30)
        assert [a.error_message for a in answers] == [""]


# -- 3. gRPC bounds -----------------------------------------------------------------------------
def _raw_add_sub(payload: bytes, count: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub")
    for n in ("INPUT0", "INPUT1"):
        request.inputs.add(name=n, datatype="FP32", shape=[count, 4])
        request.raw_input_contents.append(payload)
    return request


def test_grpc_message_cap_holds_for_plain_and_gzip_compressed_messages(worker, conn, stub):
    pid = worker.process.pid
    big = _raw_add_sub(bytes(2 * MIB), 2 * MIB // 16)
    assert grpc_code(stub.ModelInfer, big) == grpc.StatusCode.RESOURCE_EXHAUSTED
    del big
    # 2 x 128 MiB of zeros: about 0.5 MiB on the wire, 256 MiB if the worker inflated it
    bomb = _raw_add_sub(bytes(128 * MIB), 128 * MIB // 16)
    before = reset_peak_rss(pid)
    code = grpc_code(stub.ModelInfer, bomb, compression=grpc.Compression.Gzip)
    del bomb
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    grown = peak_rss(pid) - before
    assert grown < 64 * MIB, f"the worker's peak RSS grew {grown / MIB:.0f} MiB"
    assert peak_rss(pid) < 1024 * MIB
    assert_serves(conn, stub)


# -- 5. allocation only after validation ---------------------------------------------------------
def _binary_body(inputs: list[tuple[dict, bytes]]) -> tuple[bytes, dict]:
    header = json.dumps({"inputs": [spec for spec, _ in inputs]}).encode()
    body = header + b"".join(blob for _, blob in inputs)
    return body, {"Inference-Header-Content-Length": str(len(header))}


def test_bytes_claims_beyond_the_payload_are_refused_before_allocating(worker, conn, stub):
    pid = worker.process.pid
    reset_peak_rss(pid)
    huge = 3_000_000_000
    json_cases = [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [huge], "data": ["a"]},
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": [huge]},  # bytes(3e9)
        {"name": "INPUT0", "datatype": "BYTES", "shape": [huge, huge], "data": ["a"]},
        {"name": "INPUT0", "datatype": "FP32", "shape": [1 << 40, 1 << 40], "data": [1]},
    ]
    for spec in json_cases:
        status, answer = call(conn, "POST", "/v2/models/add_sub/infer", {"inputs": [spec]})
        assert status == 400, (spec, answer)
    binary_cases = [
        ({"shape": [huge], "parameters": {"binary_data_size": 8}}, struct.pack("<I", 4) + b"abcd"),
        ({"shape": [1], "parameters": {"binary_data_size": 8}}, struct.pack("<I", huge) + b"abcd"),
    ]
    for extra, blob in binary_cases:
        spec = {"name": "INPUT0", "datatype": "BYTES", **extra}
        body, headers = _binary_body([(spec, blob)])
        status, answer = call(conn, "POST", "/v2/models/add_sub/infer", body, headers)
        assert status == 400, (extra, answer)
        assert "BYTES" in answer["error"], answer
    contents = pb.ModelInferRequest(model_name="add_sub")
    one = contents.inputs.add(name="INPUT0", datatype="BYTES", shape=[huge])
    one.contents.bytes_contents.append(b"a")
    raw = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[b"\4\0\0\0abcd"])
    raw.inputs.add(name="INPUT0", datatype="BYTES", shape=[huge])
    wide = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[b"\0" * 16])
    wide.inputs.add(name="INPUT0", datatype="FP32", shape=[1 << 62, 4])
    for request in (contents, raw, wide):
        assert grpc_code(stub.ModelInfer, request) == grpc.StatusCode.INVALID_ARGUMENT
    print(f"peak worker RSS {peak_rss(pid) / MIB:.0f} MiB")  # shown with -s
    assert peak_rss(pid) < 1024 * MIB, f"peak RSS {peak_rss(pid) / MIB:.0f} MiB"
    assert_serves(conn, stub)


def test_a_bytes_input_the_model_does_not_take_is_refused_before_its_elements_are_made(
        monkeypatch):  # fmt: skip
    """16 M empty BYTES elements for add_sub (FP32) were all made into Python objects, on the
    event loop, before the datatype was compared: 9 s with the server unresponsive, for a
    400. The datatype is compared first now, over both protocols."""
    from analyzer.config.model_config import load_model_config
    from analyzer.worker import grpc_messages, http_tensors
    from analyzer.worker.errors import InferError
    from analyzer.worker.validate import RequestValidator

    validator = RequestValidator(load_model_config(EXAMPLES / "add_sub" / "config.pbtxt"))
    made: list[str] = []

    def counting(data, wire, shape, count):
        made.append(wire)
        raise AssertionError("decoded before the datatype was checked")

    monkeypatch.setattr(http_tensors, "tensor_from_bytes", counting)
    monkeypatch.setattr(grpc_messages, "tensor_from_bytes", counting)
    count = 16_000_000
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, count],
                          "parameters": {"binary_data_size": 4 * count}}]}  # fmt: skip
    plan = http_tensors._make_plan(header, keep=False)
    blob = memoryview(bytes(4 * count))
    with pytest.raises(InferError, match="unexpected datatype BYTES for inference input "
                       "'INPUT0', expecting FP32 for model 'add_sub'"):  # fmt: skip
        http_tensors._decode_inputs(plan, None, blob, None, validator)
    request = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[bytes(blob)])
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, count])
    with pytest.raises(InferError, match="unexpected datatype BYTES"):
        grpc_messages.decode_inputs(request, None, validator)
    assert made == []


def test_an_output_requested_twice_is_refused(conn, stub):
    """Each copy was sent: a 155 KB request naming an output 1,000 times got 393 MB back."""
    body = add_sub_body()
    body["outputs"] = [{"name": "OUTPUT0"}] * 1000
    status, answer = call(conn, "POST", "/v2/models/add_sub/infer", body)
    assert status == 400 and "output 'OUTPUT0' is requested more than once" in answer["error"]
    request = add_sub_request()
    for _ in range(3):
        request.outputs.add(name="OUTPUT1")
    assert grpc_code(stub.ModelInfer, request) == grpc.StatusCode.INVALID_ARGUMENT
    assert_serves(conn, stub)


# -- 4. malformed field types -------------------------------------------------------------------
def _mutated(path: str, value):
    """add_sub's valid body with one field replaced: path like 'inputs.0.shape'."""
    body = add_sub_body()
    keys = path.split(".")
    target = body
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return body


HTTP_BAD_FIELDS = [
    ("inputs", {}), ("inputs", "INPUT0"), ("inputs.0", 1), ("inputs.0", None),
    ("inputs.0.name", 3), ("inputs.0.name", None), ("inputs.0.datatype", 7),
    ("inputs.0.datatype", "FLOAT"), ("inputs.0.shape", "1,4"), ("inputs.0.shape", [True, 4]),
    ("inputs.0.shape", [1.0, 4]), ("inputs.0.shape", ["1", 4]), ("inputs.0.shape", [-1, 4]),
    ("inputs.0.shape", [1] * 40), ("inputs.0.shape", [1 << 62, 1 << 62]),
    ("inputs.0.shape", {"0": 1}), ("inputs.0.parameters", [1]),
    ("inputs.0.parameters.binary_data_size", "16"), ("inputs.0.parameters.binary_data_size", -1),
    ("inputs.0.parameters.binary_data_size", True), ("inputs.0.parameters.binary_data_size", 1.5),
    ("inputs.0.data", ["a", "b", "c", "d"]), ("inputs.0.data", [1, None, 3, 4]),
    ("inputs.0.data", [[1, 2], [3]]), ("inputs.0.data", {"x": 1}), ("inputs.0.data", None),
    ("inputs.0.data", [10**30, 1, 2, 3]), ("inputs.0.data", "1234"),
    ("outputs", {"name": "OUTPUT0"}), ("outputs", "OUTPUT0"), ("outputs", [1]),
    ("outputs", [{"name": 5}]), ("outputs", [{}]), ("outputs", [{"name": "OUTPUT0",
                                                      "parameters": "binary"}]),
    ("outputs", [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]),
    ("parameters", [1]), ("parameters", "x"), ("parameters.priority", "1"),
    ("parameters.priority", True), ("parameters.priority", -1), ("parameters.priority", 1.5),
    ("parameters.timeout", "x"), ("parameters.timeout", False), ("parameters.timeout", -5),
    ("parameters.binary_data_output", 1), ("parameters.sequence_id", [1]),
    ("parameters.sequence_id", 1.5), ("id", 5), ("id", ["a"]), ("id", {"a": 1}),
    ("parameters.custom", None), ("parameters.custom", [1]), ("parameters.custom", {"a": 1}),
    ("parameters.custom", 1 << 64),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value"), HTTP_BAD_FIELDS, ids=lambda v: repr(v)[:24])
def test_malformed_json_field_types_are_400(conn, path, value):
    status, answer = call(conn, "POST", "/v2/models/add_sub/infer", _mutated(path, value))
    assert status == 400, answer
    assert answer["error"] and "\n" not in answer["error"]


def test_a_nested_request_parameter_is_refused_before_it_can_fail_a_batch(conn, stub):
    """A request's parameters travel with it to the model's process, in its batch. One 500
    levels deep was valid JSON well under the body cap, and pickling the batch for the python
    model raised RecursionError: every request batched with it failed, other clients' too.
    Triton takes only a bool, an integer, a number or a string; so does the worker now."""
    body = add_sub_body()
    body["parameters"] = {"x": json.loads("[" * 500 + "]" * 500)}
    status, answer = call(conn, "POST", "/v2/models/add_sub/infer", body)
    assert status == 400, answer
    assert answer["error"] == ("parameter 'x' has invalid type (a list): it should be either "
                               "'int', 'bool', 'double' or 'string'")  # fmt: skip
    body["parameters"] = {"s": "text", "i": -3, "b": True, "d": 0.5}
    status, answer = call(conn, "POST", "/v2/models/add_sub/infer", body)
    assert status == 200, answer
    assert_serves(conn, stub)


def test_malformed_bodies_and_repository_fields_are_400(conn, stub):
    infer = "/v2/models/add_sub/infer"
    for body in (b"[1]", b'"x"', b"null", b"[" * 100_000, b"{\"id\": " + b"1" * 5000 + b"}",
                 b"\xff\xfe", b"{"):  # fmt: skip
        status, answer = call(conn, "POST", infer, body)
        assert status == 400, (body[:20], answer)
    load = "/v2/repository/models/add_sub/load"
    for path, body in [
        (load, b"[]"), (load, b"5"), (load, {"parameters": [1]}), (load, {"parameters": "x"}),
        (load, {"parameters": {"config": 5}}), (load, {"parameters": {"config": {"a": 1}}}),
        (load, {"parameters": {"config": "{}", "file:1/model.py": 5}}),
        ("/v2/repository/models/add_sub/unload", {"parameters": 7}),
        ("/v2/repository/index", {"ready": "yes"}), ("/v2/repository/index", {"ready": 1}),
        ("/v2/repository/index", b"[true]"),
    ]:  # fmt: skip
        status, answer = call(conn, "POST", path, body)
        assert status == 400, (path, body, answer)
    # well-typed, the same requests reach the manager, which refuses loads in 'none' mode
    assert call(conn, "POST", load, {"parameters": {"config": "{}"}})[0] == 503
    assert call(conn, "POST", "/v2/repository/index", {"ready": True})[0] == 200
    assert_serves(conn, stub)


def _grpc_mutations() -> list[tuple[str, pb.ModelInferRequest]]:
    cases = []

    def case(label: str):
        request = add_sub_request()
        cases.append((label, request))
        return request

    case("negative dim").inputs[0].shape[:] = [-1, 4]
    case("huge shape").inputs[0].shape[:] = [1 << 40, 1 << 40]
    case("deep shape").inputs[0].shape[:] = [1] * 40
    case("unknown datatype").inputs[0].datatype = "FLOAT"
    case("empty datatype").inputs[0].datatype = ""
    case("short contents").inputs[0].contents.fp32_contents.pop()
    r = case("uint overflow")
    r.inputs[0].datatype = "UINT8"
    r.inputs[0].ClearField("contents")
    r.inputs[0].contents.uint_contents.extend([300, 1, 2, 3])
    r = case("FP16 contents")
    r.inputs[0].datatype = "FP16"
    r = case("raw count")
    r.raw_input_contents.append(b"\0" * 16)
    r = case("raw length")
    for t in r.inputs:
        t.ClearField("contents")
    r.raw_input_contents.extend([b"\0" * 16, b"\0" * 15])
    case("no inputs").ClearField("inputs")
    case("twice").inputs[1].name = "INPUT0"
    for key, param in [
        ("priority", pb.InferParameter(string_param="1")),
        ("priority", pb.InferParameter(bool_param=True)),
        ("priority", pb.InferParameter(int64_param=-1)),
        ("priority", pb.InferParameter(double_param=1.0)),
        ("timeout", pb.InferParameter(string_param="x")),
        ("timeout", pb.InferParameter(int64_param=-5)),
        ("sequence_id", pb.InferParameter(double_param=1.5)),
        ("sequence_id", pb.InferParameter(bool_param=True)),
    ]:
        case(f"{key}={param}").parameters[key].CopyFrom(param)
    return cases


def test_malformed_grpc_fields_are_invalid_argument(conn, stub):
    for label, request in _grpc_mutations():
        try:
            stub.ModelInfer(request, timeout=TIMEOUT)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (label, err.details())
        else:
            raise AssertionError(f"{label}: answered OK")
    bad_loads = [
        {"config": pb.ModelRepositoryParameter(int64_param=5)},
        {"config": pb.ModelRepositoryParameter(bytes_param=b"{}")},
        {"config": pb.ModelRepositoryParameter(string_param="{}"),
         "file:1/model.py": pb.ModelRepositoryParameter(string_param="print(1)")},
    ]  # fmt: skip
    for params in bad_loads:
        request = pb.RepositoryModelLoadRequest(model_name="add_sub", parameters=params)
        assert grpc_code(stub.RepositoryModelLoad, request) == grpc.StatusCode.INVALID_ARGUMENT
    assert_serves(conn, stub)


# -- 4. answers after the model ran, and inside streams -----------------------------------------
def test_outputs_the_model_did_not_produce_still_get_an_answer(conn, stub):
    status, answer = call(conn, "POST", "/v2/models/partial/infer", x_body(3, ["Y", "Z"]))
    assert status == 500 and "did not produce output 'Z'" in answer["error"], answer
    status, answer = call(conn, "POST", "/v2/models/partial/infer", x_body(3))
    assert status == 200 and answer["outputs"][0]["data"] == [3], answer
    status, answer = call(conn, "POST", "/v2/models/partial/infer", x_body(2))
    assert status == 500 and "no Triton datatype" in answer["error"], answer
    for request, expected in [
        (x_request("partial", 3, ["Y", "Z"]), "did not produce output 'Z'"),
        (x_request("partial", 2), "no Triton datatype"),
    ]:
        try:
            stub.ModelInfer(request, timeout=TIMEOUT)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INTERNAL and expected in err.details()
        else:
            raise AssertionError(f"{expected}: answered OK")
    assert_serves(conn, stub)


def test_grpc_stream_answers_every_request_errors_included(conn, stub):
    bad_priority = add_sub_request()
    bad_priority.parameters["priority"].string_param = "high"
    bad_shape = add_sub_request()
    bad_shape.inputs[0].shape[:] = [-3, 4]
    requests = [
        add_sub_request(), add_sub_request("../x"), bad_priority, bad_shape,
        x_request("partial", 1, ["Y", "Z"]), add_sub_request("no_such_model"),
        x_request("partial", 2), add_sub_request(),
    ]  # fmt: skip
    for i, request in enumerate(requests):
        request.id = str(i)
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=TIMEOUT))
    assert sorted(int(a.infer_response.id) for a in answers) == list(range(len(requests)))
    errors = {int(a.infer_response.id): a.error_message for a in answers if a.error_message}
    assert sorted(errors) == [1, 2, 3, 4, 5, 6], errors
    assert "invalid model name" in errors[1] and "priority" in errors[2]
    assert "did not produce output 'Z'" in errors[4] and "no Triton datatype" in errors[6]
    assert_serves(conn, stub)


# -- 6. a client that goes away cancels its queued work -----------------------------------------
def _slow_executions(conn) -> int:
    status, answer = call(conn, "GET", "/v2/models/slow/stats")
    assert status == 200, answer
    return answer["model_stats"][0]["execution_count"]


def _occupy_slow(worker) -> http.client.HTTPConnection:
    """Start one request that keeps the single instance of 'slow' busy for SLOW_S."""
    busy = http.client.HTTPConnection(*_host_port(worker.http), timeout=TIMEOUT)
    busy.request("POST", "/v2/models/slow/infer", body=json.dumps(x_body(1)).encode())
    time.sleep(0.3)  # let it leave the queue and start executing
    return busy


def test_disconnected_http_client_cancels_its_queued_request(worker, conn):
    before = _slow_executions(conn)
    busy = _occupy_slow(worker)
    body = json.dumps(x_body(2)).encode()
    with socket.create_connection(_host_port(worker.http), timeout=TIMEOUT) as quitter:
        quitter.sendall(
            b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        time.sleep(0.3)  # queued behind the busy instance
    assert busy.getresponse().status == 200
    busy.close()
    time.sleep(SLOW_S * 2)  # had the queued request run, it would have finished by now
    assert _slow_executions(conn) == before + 1


def test_cancelled_grpc_call_cancels_its_queued_request(worker, conn, stub):
    before = _slow_executions(conn)
    busy = _occupy_slow(worker)
    assert grpc_code(lambda r, timeout: stub.ModelInfer(r, timeout=0.3), x_request("slow", 2)) == (
        grpc.StatusCode.DEADLINE_EXCEEDED
    )
    future = stub.ModelInfer.future(x_request("slow", 3), timeout=TIMEOUT)
    time.sleep(0.2)
    future.cancel()
    assert busy.getresponse().status == 200
    busy.close()
    time.sleep(SLOW_S * 2)
    assert _slow_executions(conn) == before + 1
