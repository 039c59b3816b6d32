"""TorchScript instances in processes of their own (INSTANCE_PROCESS), on the CPU device.

GPU instances take this path by default (tests/test_gpu.py serves one there); here `true` puts a
CPU instance in a process, so the hand-off -- a batch into shared memory, outputs back, a child
that dies -- is exercised where CI runs.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import tritonclient.http as httpclient
from serving import start_worker
from tritonclient.utils import InferenceServerException

from analyzer.config.model_config import ModelConfig
from analyzer.worker.backends.base import InstanceSpec
from analyzer.worker.backends.instance_process import (
    in_process_of_its_own,
    instance_process_choice,
)
from analyzer.worker.backends.python_stub import ShmArena
from analyzer.worker.backends.tensor_stub import place, view

STUB = "analyzer.worker.backends.tensor_stub"
CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "X__0" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "B__1" data_type: TYPE_INT64 dims: [ 2 ] }} ]
output [ {{ name: "TWICE__0" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "NEXT__1" data_type: TYPE_INT64 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 50000 }}
parameters {{ key: "INSTANCE_PROCESS" value: {{ string_value: "{choice}" }} }}
"""


class _TwoOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, b + 1


def _repository(root: Path, models: dict[str, str]) -> Path:
    module = torch.jit.script(_TwoOutputs())
    for name, choice in models.items():
        (root / name / "1").mkdir(parents=True)
        module.save(str(root / name / "1" / "model.pt"))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, choice=choice))
    return root


def _stubs(worker: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(worker.pid).children(recursive=True)
            if STUB in p.cmdline()]  # fmt: skip


def _infer(url: str, model: str, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    b = rng.integers(-1000, 1000, (rows, 2)).astype(np.int64)
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        inputs = [httpclient.InferInput("X__0", list(x.shape), "FP32"),
                  httpclient.InferInput("B__1", list(b.shape), "INT64")]  # fmt: skip
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(model, inputs)
        return x, b, result.as_numpy("TWICE__0"), result.as_numpy("NEXT__1")
    finally:
        client.close()


def test_a_process_instance_batches_and_answers_as_a_thread_instance(tmp_path):
    repo = _repository(tmp_path / "repo", {"in_process": "true", "on_thread": "false"})
    worker = start_worker(repo)
    try:
        stubs = _stubs(worker.process)
        assert len(stubs) == 1, "one instance in a process of its own, the other on a thread"
        for model in ("in_process", "on_thread"):
            answers: list = []

            def send(i: int, model: str = model, answers: list = answers) -> None:
                answers.append(_infer(worker.http, model, 1 + i % 3, seed=i))

            threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(answers) == 12
            for x, b, twice, following in answers:  # each request gets its own rows back
                np.testing.assert_array_equal(twice, x * 2)
                np.testing.assert_array_equal(following, b + 1)
                assert twice.dtype == np.float32 and following.dtype == np.int64
            client = httpclient.InferenceServerClient(worker.http)
            stats = client.get_inference_statistics(model)["model_stats"][0]
            client.close()
            assert stats["inference_count"] == sum(1 + i % 3 for i in range(12))
            assert stats["execution_count"] < 12, "the dynamic batcher joined requests"
    finally:
        worker.stop()
    for stub in stubs:  # the child goes with the worker
        assert not stub.is_running() or stub.status() == psutil.STATUS_ZOMBIE


def test_a_killed_instance_process_fails_its_requests_and_the_worker_goes_on(tmp_path):
    repo = _repository(tmp_path / "repo", {"in_process": "true", "on_thread": "false"})
    worker = start_worker(repo)
    try:
        (stub,) = _stubs(worker.process)
        _infer(worker.http, "in_process", 2, seed=0)
        stub.kill()
        deadline = time.monotonic() + 10  # a zombie until the worker reaps it
        while stub.is_running() and stub.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="stopped"):
            _infer(worker.http, "in_process", 2, seed=1)
        assert time.monotonic() - started < 30, "an error answer, not a wait"
        x, _, twice, _ = _infer(worker.http, "on_thread", 3, seed=2)
        np.testing.assert_array_equal(twice, x * 2)
        assert worker.process.poll() is None
    finally:
        worker.stop()


def test_instance_process_choice_is_checked_and_auto_follows_the_device():
    config = ModelConfig(name="m")
    assert instance_process_choice(config) is None
    spec = InstanceSpec(name="m_0", group="m", kind="GPU", device_id=0, index=0, count=1,
                        cpu_threads=1)  # fmt: skip
    cpu = InstanceSpec(name="m_0", group="m", kind="CPU", device_id=0, index=0, count=1,
                       cpu_threads=1)  # fmt: skip
    assert in_process_of_its_own(config, spec) and not in_process_of_its_own(config, cpu)
    config.parameters["INSTANCE_PROCESS"].string_value = " False "
    assert instance_process_choice(config) is False
    assert not in_process_of_its_own(config, spec)
    config.parameters["INSTANCE_PROCESS"].string_value = "TRUE"
    assert in_process_of_its_own(config, cpu)
    config.parameters["INSTANCE_PROCESS"].string_value = "sometimes"
    with pytest.raises(ValueError, match="model 'm': parameters INSTANCE_PROCESS must be auto, "
                       "true or false, got 'sometimes'"):  # fmt: skip
        instance_process_choice(config)


def test_place_concatenates_into_shared_memory_and_grows_the_arena():
    arena = ShmArena()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(8, dtype=np.float32).reshape(2, 4) + 100
    c = np.array([[1, 2]], dtype=np.int16)
    layout, fd = place(arena, [("X", [a, b]), ("C", [c])])
    assert fd is not None  # a new file, for the peer
    try:
        np.testing.assert_array_equal(view(arena, layout[0]), np.concatenate([a, b]))
        np.testing.assert_array_equal(view(arena, layout[1]), c)
        assert [entry[3] % 64 for entry in layout] == [0, 0]
        big = np.ones((1 << 19, 4), np.float32)  # 8 MiB: past the first arena
        layout, grown = place(arena, [("X", [big])])
        assert grown is not None
        np.testing.assert_array_equal(view(arena, layout[0]), big)
        layout, again = place(arena, [("X", [a])])
        assert again is None  # it fits: no new file
        with pytest.raises(TypeError, match="tensor 'S' holds Python objects"):
            place(arena, [("S", [np.array([b"x"], dtype=object)])])
    finally:
        os.close(fd)
        if grown is not None:
            os.close(grown)
        arena.close()
