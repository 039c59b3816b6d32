"""GPU code paths: KIND_GPU TorchScript instances and nv_gpu_* metrics. Skipped without a GPU."""

from __future__ import annotations

import shutil
import urllib.request

import numpy as np
import psutil
import pytest
import torch
import tritonclient.http as httpclient
from serving import EXAMPLES, start_worker

from analyzer.worker import devices

pytestmark = pytest.mark.skipif(
    devices.gpu_count() == 0 or not torch.cuda.is_available(), reason="no CUDA GPU on this machine"
)

THREAD = '\nparameters { key: "INSTANCE_PROCESS" value: { string_value: "false" } }\n'


def test_kind_gpu_torchscript_matches_cpu_and_reports_gpu_metrics(tmp_path):
    # tiny_cnn's GPU instance in a process of its own (the default), tiny_thread's on a thread
    for name, extra in (("tiny_cnn", ""), ("tiny_thread", THREAD)):
        shutil.copytree(EXAMPLES / "tiny_cnn", tmp_path / name)
        config = tmp_path / name / "config.pbtxt"
        text = config.read_text().replace("KIND_CPU", "KIND_GPU") + extra
        config.write_text(text.replace('name: "tiny_cnn"', f'name: "{name}"'))
    served = start_worker(tmp_path)
    try:
        stubs = [p for p in psutil.Process(served.process.pid).children(recursive=True)
                 if "analyzer.worker.backends.tensor_stub" in p.cmdline()]  # fmt: skip
        assert len(stubs) == 1
        client = httpclient.InferenceServerClient(served.http)
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
        with torch.inference_mode():
            expected = module(torch.from_numpy(x)).numpy()
        for name in ("tiny_cnn", "tiny_thread"):
            out = client.infer(name, [inp]).as_numpy("OUTPUT__0")
            np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)
            assert client.get_model_config(name)["instance_group"][0]["kind"] == "KIND_GPU"
        text = urllib.request.urlopen(served.metrics, timeout=10).read().decode()
        assert "nv_gpu_memory_used_bytes{gpu_uuid=" in text
        client.close()
    finally:
        assert served.stop() == 0
