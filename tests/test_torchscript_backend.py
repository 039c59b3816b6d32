"""The TorchScript backend's one-call device path (`device_call`), on the CPU device and, where
there is one, on a GPU.

On a GPU the wrapper moves the inputs to the device and the outputs back; on the CPU device those
moves are no-ops, so the wrapper's generated code, its return kinds and its refusals are all
exercised where CI runs. The GPU cases skip without CUDA; tests/test_gpu.py serves it there.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from analyzer.worker.backends.base import InstanceSpec
from analyzer.worker.backends.torchscript import TorchScriptInstance, device_call
from analyzer.worker.request import BatchTiming, InferRequest

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine"))]  # fmt: skip


class _OneTensor(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Tuple(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class _List(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> list[torch.Tensor]:
        return [a, a + 1]


class _Dict(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": a + b, "prod": a * b}


class _NotATensorArgument(torch.nn.Module):
    def forward(self, a: torch.Tensor, scale: float) -> torch.Tensor:
        return a * scale


class _Optional(torch.nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor | None:
        return a if bool(a.sum() > 0) else None


def _same(got, expected) -> None:
    if isinstance(expected, torch.Tensor):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
    elif isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for key in expected:
            _same(got[key], expected[key])
    else:
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _same(g, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module_type", [_OneTensor, _Tuple, _List, _Dict])
def test_device_call_gives_the_models_own_results(module_type, device):
    module = torch.jit.script(module_type())
    inputs = len(module.forward.schema.arguments) - 1
    call = device_call(module.to(device), torch.device(device), inputs)
    assert call is not None
    args = [torch.randn(4, 3) for _ in range(inputs)]
    with torch.inference_mode():
        got = call(*args)  # host tensors in, host tensors out
        _same(got, torch.jit.script(module_type())(*args))


def test_device_call_refuses_what_it_cannot_wrap():
    cpu = torch.device("cpu")
    assert device_call(torch.jit.script(_NotATensorArgument()), cpu, 2) is None
    assert device_call(torch.jit.script(_Optional()), cpu, 1) is None
    # the config names fewer inputs than forward takes: its defaults are not ours to fill
    assert device_call(torch.jit.script(_Tuple()), cpu, 1) is None


def test_device_call_serves_the_example_model():
    from serving import EXAMPLES

    module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
    call = device_call(module, torch.device("cpu"), 1)
    assert call is not None
    x = torch.randn(8, 3, 32, 32)
    with torch.inference_mode():
        np.testing.assert_array_equal(call(x).numpy(), module(x).numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_an_instance_on_its_device_answers_as_the_model_does_on_the_cpu(device):
    """The instance's whole path: its thread's stream, a batch of two requests, split answers."""
    from serving import EXAMPLES

    from analyzer.repository.repository import read_model

    source = read_model(EXAMPLES, "tiny_cnn")
    kind = "GPU" if device == "cuda" else "CPU"
    spec = InstanceSpec("tiny_cnn_0_0", "tiny_cnn_0", kind, 0, 0, 1, 1)
    instance = TorchScriptInstance(source, source.model_file(1), spec)
    assert instance.call is not instance._device_steps  # tiny_cnn is wrapped in one call
    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    requests = [
        InferRequest("tiny_cnn", {"INPUT__0": part}, {"INPUT__0": "FP32"}, None,
                     lambda outputs, error: None, batch_size=len(part))
        for part in (x[:2], x[2:])
    ]  # fmt: skip
    results: list = []

    def run() -> None:  # as the runner does: thread_init on the instance's own thread
        instance.thread_init()
        results.extend(instance.execute(requests, BatchTiming()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    module = torch.jit.load(str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")).eval()
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    got = np.concatenate([r["OUTPUT__0"] for r in results])
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
