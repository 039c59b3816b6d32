"""KServe v2 REST against a real worker process, driven by tritonclient.http and raw HTTP."""

from __future__ import annotations

import http.client
import json
import urllib.request

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from serving import EXAMPLES
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def client(examples_worker):
    c = httpclient.InferenceServerClient(examples_worker.http, concurrency=4)
    yield c
    c.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True):
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and client.is_model_ready("tiny_cnn")
    meta = client.get_server_metadata()
    assert "statistics" in meta["extensions"] and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("add_sub")
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    config = client.get_model_config("tiny_cnn")
    assert config["max_batch_size"] == 32 and config["input"][0]["dims"] == [3, 32, 32]


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub_exact(client, binary):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("add_sub", add_sub_inputs(a, b, binary), outputs=outputs, request_id="r7")
    assert result.get_response()["id"] == "r7"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_tiny_cnn_equals_in_process_torch(client):
    module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
    x = np.random.default_rng(2).standard_normal((4, 3, 32, 32)).astype(np.float32)
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    served = client.infer("tiny_cnn", [inp]).as_numpy("OUTPUT__0")
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def _expect_error(client, model, inputs, match):
    with pytest.raises(InferenceServerException, match=match):
        client.infer(model, inputs)


def test_bad_requests_get_clear_errors_and_the_worker_keeps_serving(client):
    a = np.ones((1, 4), np.float32)
    _expect_error(client, "nope", add_sub_inputs(a, a), "unknown model.*'nope'")
    wrong = httpclient.InferInput("INPUTX", [1, 4], "FP32")
    wrong.set_data_from_numpy(a)
    _expect_error(client, "add_sub", [add_sub_inputs(a, a)[0], wrong], "INPUTX")
    bad_shape = add_sub_inputs(np.ones((1, 5), np.float32), np.ones((1, 5), np.float32))
    _expect_error(client, "add_sub", bad_shape, r"Expected \[-1,4\], got \[1,5\]")
    big = np.ones((9, 4), np.float32)
    _expect_error(client, "add_sub", add_sub_inputs(big, big), "batch-size must be <= 8")
    ints = [httpclient.InferInput(n, [1, 4], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ints:
        i.set_data_from_numpy(np.ones((1, 4), np.int32))
    _expect_error(client, "add_sub", ints, "datatype INT32.*expecting FP32")
    result = client.infer("add_sub", add_sub_inputs(a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def _raw_post(address: str, path: str, body: bytes, headers: dict | None = None):
    conn = http.client.HTTPConnection(address, timeout=10)
    conn.request("POST", path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def test_malformed_json_and_truncated_binary(examples_worker):
    status, body = _raw_post(examples_worker.http, "/v2/models/add_sub/infer", b"{not json")
    assert status == 400 and "malformed JSON" in json.loads(body)["error"]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                },
                {
                    "name": "INPUT1",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                },
            ]
        }
    ).encode()
    body_bytes = header + b"\0" * 20  # 32 bytes announced, 20 sent
    status, body = _raw_post(
        examples_worker.http,
        "/v2/models/add_sub/infer",
        body_bytes,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400 and "INPUT1" in json.loads(body)["error"]


def test_json_inputs_without_binary(examples_worker):
    body = json.dumps(
        {
            "id": "j1",
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [[4, 3, 2, 1]]},
            ],
        }
    ).encode()
    status, data = _raw_post(examples_worker.http, "/v2/models/add_sub/infer", body)
    reply = json.loads(data)
    assert status == 200 and reply["id"] == "j1"
    out = {o["name"]: o["data"] for o in reply["outputs"]}
    assert out == {"OUTPUT0": [5, 5, 5, 5], "OUTPUT1": [-3, -1, 1, 3]}


def test_statistics_follow_tritons_accounting(client):
    a = np.ones((2, 4), np.float32)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]
    for _ in range(5):
        client.infer("add_sub", add_sub_inputs(a, a))
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    s = stats["inference_stats"]
    assert s["success"]["count"] - before["inference_stats"]["success"]["count"] == 5
    assert stats["inference_count"] - before["inference_count"] == 10
    assert s["queue"]["count"] == s["success"]["count"]
    assert (
        s["compute_input"]["count"] == s["compute_infer"]["count"] == s["compute_output"]["count"]
    )
    assert stats["batch_stats"] and stats["version"] == "1"


def test_metrics_use_triton_names(client, examples_worker):
    client.infer(
        "add_sub", add_sub_inputs(np.ones((1, 4), np.float32), np.ones((1, 4), np.float32))
    )
    text = urllib.request.urlopen(examples_worker.metrics, timeout=10).read().decode()
    line = next(
        x
        for x in text.splitlines()
        if x.startswith('nv_inference_request_success{model="add_sub",version="1"}')
    )
    assert int(line.split()[-1]) >= 1
    for name in (
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_request_failure",
    ):
        assert f"{name}{{" in text
    assert "_total{" not in text and "_created" not in text and "e+" not in text


def _binary_add_sub(header: bytes, a: np.ndarray, b: np.ndarray) -> tuple[bytes, dict]:
    return header + a.tobytes() + b.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _split_reply(data: bytes, head_length: str) -> tuple[dict, bytes]:
    n = int(head_length)
    return json.loads(data[:n]), data[n:]


def test_a_repeated_header_is_reused_with_each_requests_own_data(examples_worker):
    """The parsed plan of a repeated header is kept; the values, the model and the body length
    are still each request's own."""
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [1, 4],
                 "parameters": {"binary_data_size": 16}}
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }  # fmt: skip
    ).encode()
    rng = np.random.default_rng(7)
    for _ in range(3):
        a, b = (rng.standard_normal((1, 4)).astype(np.float32) for _ in range(2))
        body, headers = _binary_add_sub(header, a, b)
        conn = http.client.HTTPConnection(examples_worker.http)
        conn.request("POST", "/v2/models/add_sub/infer", body, headers)
        reply = conn.getresponse()
        data = reply.read()
        head, blob = _split_reply(data, reply.getheader("Inference-Header-Content-Length"))
        conn.close()
        assert reply.status == 200 and [o["name"] for o in head["outputs"]] == ["OUTPUT0"]
        assert np.array_equal(np.frombuffer(blob, np.float32).reshape(1, 4), a + b)
    # the same header, now short of data, and sent to a model with other inputs
    status, data = _raw_post(examples_worker.http, "/v2/models/add_sub/infer", header + b"\0" * 20,
                             {"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    assert status == 400 and "INPUT1" in json.loads(data)["error"]
    zeros = np.zeros((1, 4), np.float32)
    body, headers = _binary_add_sub(header, zeros, zeros)
    status, data = _raw_post(examples_worker.http, "/v2/models/tiny_cnn/infer", body, headers)
    assert status == 400 and "tiny_cnn" in json.loads(data)["error"]


def test_header_plans_are_bounded():
    from analyzer.worker.http import _Plans
    from analyzer.worker.http_message import HttpRequest

    plans = _Plans()
    for i in range(3 * _Plans.MAX_PLANS):
        header = json.dumps(
            {"id": f"r{i}", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1],
                                        "parameters": {"binary_data_size": 4}}]}  # fmt: skip
        ).encode()
        headers = {"inference-header-content-length": str(len(header))}
        plan, _, binary = plans.plan(HttpRequest("POST", "/", "", headers, header + b"\0" * 4))
        assert plan.request_id == f"r{i}" and len(binary) == 4
    assert len(plans.plans) == _Plans.MAX_PLANS
    # a header with its values inside (JSON 'data') is never kept
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}]})
    headers = {"inference-header-content-length": str(len(header))}
    plan, parsed, _ = plans.plan(HttpRequest("POST", "/", "", headers, header.encode()))
    assert plan.heads is None and parsed is not None and header.encode() not in plans.plans


def test_a_backend_that_returns_neither_outputs_nor_an_error_is_answered_500():
    """The REST API's answer path, in process: a completion with no outputs and no error (a
    backend's bug) still answers its request, with an error that says what happened."""
    from analyzer.config.model_config import parse_model_config
    from analyzer.worker.http import RestApi
    from analyzer.worker.http_message import HttpRequest
    from analyzer.worker.validate import RequestValidator

    config = parse_model_config(
        'name: "m" max_batch_size: 8 input [{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }] '
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }]'
    )

    class Model:
        name, version = "m", 1
        validator = RequestValidator(config)

        def submit(self, request, checked: bool = False) -> None:
            request.on_done(None, None)

    class Manager:
        def get(self, name: str, version: str = "") -> Model:
            return Model()

    class Loop:
        def call_soon_threadsafe(self, f, *args) -> None:
            f(*args)

    api = RestApi(Manager(), Loop(), "test")
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]}).encode()  # fmt: skip
    answers = []
    api(HttpRequest("POST", "/v2/models/m/infer", "", {}, body), answers.append)
    assert len(answers) == 1 and answers[0].status == 500
    assert "returned no outputs" in json.loads(b"".join(answers[0].body))["error"]
