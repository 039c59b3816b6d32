"""onnxruntime_onnx models: auto-complete from the model file, inference, device checks."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from build_examples import build_onnx_add_mul
from serving import start_worker
from tritonclient.utils import InferenceServerException

from analyzer.worker import devices


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnx")
    for name, extra in (("addmul", ""), ("addmul_gpu", "instance_group [{ kind: KIND_GPU }]")):
        build_onnx_add_mul(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\n{extra}\n')
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "addmul")
    yield served
    assert served.stop() == 0


def test_auto_complete_and_exact_results(worker):
    client = httpclient.InferenceServerClient(worker.http)
    config = client.get_model_config("addmul")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert {i["name"]: i["dims"] for i in config["input"]} == {"INPUT0": [4], "INPUT1": [4]}
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 2, np.float32)
    inputs = [httpclient.InferInput(n, [3, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("addmul", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * b)
    client.close()


def test_gpu_instances_need_a_gpu(worker):
    client = httpclient.InferenceServerClient(worker.http)
    if devices.gpu_count() == 0:
        with pytest.raises(InferenceServerException, match="KIND_GPU but no GPU is available"):
            client.load_model("addmul_gpu")
    else:  # a GPU machine: loads with onnxruntime-gpu, or says which provider is missing
        try:
            client.load_model("addmul_gpu")
            assert client.is_model_ready("addmul_gpu")
        except InferenceServerException as err:
            assert "CUDAExecutionProvider" in str(err)
    client.close()
