"""GPU code paths: KIND_GPU TorchScript instances and nv_gpu_* metrics. Skipped without a GPU."""

from __future__ import annotations

import shutil
import urllib.request

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from serving import EXAMPLES, start_worker

from analyzer.worker import devices

pytestmark = pytest.mark.skipif(
    devices.gpu_count() == 0 or not torch.cuda.is_available(), reason="no CUDA GPU on this machine"
)


def test_kind_gpu_torchscript_matches_cpu_and_reports_gpu_metrics(tmp_path):
    shutil.copytree(EXAMPLES / "tiny_cnn", tmp_path / "tiny_cnn")
    config = tmp_path / "tiny_cnn" / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    served = start_worker(tmp_path)
    try:
        client = httpclient.InferenceServerClient(served.http)
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer("tiny_cnn", [inp]).as_numpy("OUTPUT__0")
        module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
        with torch.inference_mode():
            expected = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)
        assert client.get_model_config("tiny_cnn")["instance_group"][0]["kind"] == "KIND_GPU"
        text = urllib.request.urlopen(served.metrics, timeout=10).read().decode()
        assert "nv_gpu_memory_used_bytes{gpu_uuid=" in text
        client.close()
    finally:
        assert served.stop() == 0
