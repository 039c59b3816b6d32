"""A python model's response parameters (InferenceResponse(parameters=...)) reach its clients,
as in Triton: HTTP's `parameters`, gRPC's InferParameter map, a stream's responses, and a BLS
caller's response.parameters()."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import python_models, start_worker

TAGGED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", value)],
                parameters={"finish_reason": "stop", "tokens": int(value[0]), "cached": True}))
        return out
'''

STREAMED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for n in range(2):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))],
                    parameters={"index": n}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

CALLER = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="tagged", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")]).exec()
            tokens = json.loads(answer.parameters())["tokens"]
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([tokens * 10], dtype=np.int32))]))
        return out
'''

BAD = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([], parameters={"ratio": 0.5}) for _ in requests]
'''

IO = ('input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')  # fmt: skip


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("response_parameters")
    python_models(repo, {"tagged": TAGGED, "caller": CALLER, "bad": BAD},
                  "max_batch_size: 0\n" + IO)
    python_models(repo, {"streamed": STREAMED},
                  "max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n" + IO)
    served = start_worker(repo)
    yield served
    served.stop()


def _input(module, value: int):
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return tensor


def test_parameters_reach_http_and_grpc_clients(worker):
    """InferenceResponse(parameters=...) was dropped, and response.parameters() was missing."""
    with httpclient.InferenceServerClient(worker.http) as client:
        for value in (7, 8):  # twice: an answer with parameters keeps no head per layout
            result = client.infer("tagged", [_input(httpclient, value)])
            assert result.get_response()["parameters"] == {
                "finish_reason": "stop", "tokens": value, "cached": True}
            assert result.as_numpy("OUT").tolist() == [value]
    with grpcclient.InferenceServerClient(worker.grpc) as client:
        for value in (7, 8):
            result = client.infer("tagged", [_input(grpcclient, value)])
            params = result.get_response().parameters
            assert params["finish_reason"].string_param == "stop"
            assert params["tokens"].int64_param == value and params["cached"].bool_param
            assert result.as_numpy("OUT").tolist() == [value]
        assert client.infer("caller", [_input(grpcclient, 4)]).as_numpy("OUT").tolist() == [40]


def test_each_streamed_response_carries_its_own(worker):
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(worker.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("streamed", [_input(grpcclient, 0)],
                                  enable_empty_final_response=True)  # fmt: skip
        seen = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            params = result.get_response().parameters
            final = params["triton_final_response"].bool_param
            seen.append((params["index"].int64_param if "index" in params else None, final))
            if final:
                break
    finally:
        client.stop_stream()
        client.close()
    assert seen == [(0, False), (1, False), (None, True)]


def test_a_parameter_of_another_type_is_the_models_error(worker):
    with httpclient.InferenceServerClient(worker.http) as client:
        with pytest.raises(Exception, match="bool/int/str, found type float"):
            client.infer("bad", [_input(httpclient, 1)])
