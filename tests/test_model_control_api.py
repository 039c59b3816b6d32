"""A python model's model loading API (pb_utils.load_model, unload_model, is_model_ready) and
pb_utils.get_model_dir(), as Triton's python backend has them (vLLM's backend unloads itself
when its engine fails)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

DOUBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]) for r in requests]
'''

LOADER = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def out(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.dirname(os.path.abspath(__file__))
        assert pb_utils.get_model_dir() == here, (pb_utils.get_model_dir(), here)
        assert here.endswith(os.path.join("loader", "1"))

    def execute(self, requests):
        responses = []
        for request in requests:
            action = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            try:
                if action == 0:
                    responses.append(out(int(pb_utils.is_model_ready("double"))))
                elif action == 1:
                    pb_utils.load_model(model_name="double")
                    answer = pb_utils.InferenceRequest(
                        model_name="double", requested_output_names=["OUT"],
                        inputs=[pb_utils.Tensor("IN", np.array([21], dtype=np.int32))]).exec()
                    responses.append(out(int(pb_utils.get_output_tensor_by_name(
                        answer, "OUT").as_numpy()[0])))
                elif action == 2:
                    pb_utils.unload_model("double")
                    responses.append(out(1))
                else:
                    pb_utils.load_model("not_in_the_repository")
                    responses.append(out(-1))
            except pb_utils.TritonModelException as err:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err))))
        return responses
'''

SELFISH = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Unloads itself from execute(), as vLLM's backend does when its engine is gone."""

    def execute(self, requests):
        pb_utils.unload_model("selfish")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.array([7], dtype=np.int32))]) for _ in requests]
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("model_control_api")
    python_models(repo, {"double": DOUBLE, "loader": LOADER, "selfish": SELFISH},
                  'max_batch_size: 0\n'
                  'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    served = start_worker(repo, "--model-control-mode", "explicit",
                          "--load-model", "loader", "--load-model", "selfish")  # fmt: skip
    yield served
    served.stop()


def _call(client, model: str, value: int) -> int:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(client.infer(model, [tensor]).as_numpy("OUT")[0])


def test_a_model_loads_checks_and_unloads_other_models(worker):
    """pb_utils.load_model and the rest did not exist: such a model failed with an
    AttributeError."""
    with httpclient.InferenceServerClient(worker.http) as client:
        assert _call(client, "loader", 0) == 0  # double is not loaded
        assert _call(client, "loader", 1) == 42  # loaded, then called by BLS
        assert client.is_model_ready("double") and _call(client, "loader", 0) == 1
        assert _call(client, "loader", 2) == 1
        deadline = time.monotonic() + 30  # the unload was started, not waited for
        while client.is_model_ready("double"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(InferenceServerException,
                           match="Failed to load model 'not_in_the_repository'"):
            _call(client, "loader", 3)


def test_a_model_may_unload_itself(worker):
    with httpclient.InferenceServerClient(worker.http) as client:
        assert _call(client, "selfish", 0) == 7
        deadline = time.monotonic() + 30
        while client.is_model_ready("selfish"):
            assert time.monotonic() < deadline, "the model never left"
            time.sleep(0.05)
