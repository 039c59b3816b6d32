"""Triton's GRPCInferenceService against a real worker process, driven by tritonclient.grpc."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from serving import EXAMPLES
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def client(examples_worker):
    c = grpcclient.InferenceServerClient(examples_worker.grpc)
    yield c
    c.close()


def test_metadata_config_and_health(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}
    config = client.get_model_config("tiny_cnn").config
    assert config.max_batch_size == 32 and list(config.input[0].dims) == [3, 32, 32]


def test_add_sub_exact_and_request_id(client):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    inputs = [grpcclient.InferInput(n, [5, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs, request_id="g1")
    assert result.get_response().id == "g1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_tiny_cnn_equals_in_process_torch(client):
    module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
    x = np.random.default_rng(4).standard_normal((2, 3, 32, 32)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    served = client.infer("tiny_cnn", [inp]).as_numpy("OUTPUT__0")
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def test_errors_carry_grpc_codes(client):
    inp = grpcclient.InferInput("INPUT__0", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("missing_model", [inp])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    wrong = grpcclient.InferInput("IMAGE", [1, 3, 32, 32], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("tiny_cnn", [wrong])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "IMAGE" in str(info.value)


def test_streaming_answers_every_request_with_its_id(client):
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    a = np.ones((1, 4), np.float32)
    for i in range(5):
        inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a * i)
        inputs[1].set_data_from_numpy(a)
        client.async_stream_infer("add_sub", inputs, request_id=str(i))
    client.stop_stream()
    assert sorted(r.get_response().id for r, e in results if e is None) == list("01234")
    for result, _ in results:
        i = int(result.get_response().id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * i + a)


def test_statistics_over_grpc(client):
    stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    s = stats["inference_stats"]
    assert int(s["queue"]["count"]) == int(s["success"]["count"]) > 0


def test_a_kept_response_head_serializes_as_the_full_message():
    """encode_bytes appends each answer's raw outputs to a head serialized once per layout: the
    bytes must parse to the very message the protobuf encoder builds, every time."""
    from tritonclient.grpc import service_pb2 as pb

    from analyzer.worker.grpc import InferenceService

    class Model:
        name, version = "m", 3

    service = InferenceService.__new__(InferenceService)
    service._heads = {}
    for request in (pb.ModelInferRequest(model_name="m", id="r1"),
                    pb.ModelInferRequest(model_name="m", outputs=[{"name": "B"}])):  # fmt: skip
        for scale in (1, 2, 3):  # the second and third answers reuse the head
            outputs = {
                "A": np.arange(6, dtype=np.float32).reshape(2, 3) * scale,
                "B": np.full((2, 40), scale, np.int64),  # 640 bytes: a two-byte length
                "C": (np.arange(6, dtype=np.int16).reshape(3, 2) * scale).T,  # not contiguous
                "D": np.array([[True, False, scale > 1]]),
            }
            got = pb.ModelInferResponse.FromString(service.encode_bytes(Model(), request, outputs))
            requested = [o.name for o in request.outputs] or None
            assert got == InferenceService.encode(Model(), request.id, outputs, requested)
    assert len(service._heads) == 2
