"""`model_warmup` with Triton's semantics: each instance runs each sample before the model is
READY, so the first client request (and a profile's first point) meets a warm model.

A sample of `batch_size` N is N requests of one sample each (a batch dimension of 1 when the
model batches), executed together on the instance `count` times (0 counts as 1; a sample of
batch_size 0 is skipped, as in Triton). Inputs are `zero_data`, `random_data` (random bytes; a
STRING input gets zero data, as in Triton) or `input_data_file`: raw row-major bytes read from
the model's `warmup/` folder (a STRING input's file is Triton's length-prefixed format). Every
dimension must be given. Warm-up executions count in the model's statistics and are logged, as
Triton's are; a sample that fails fails the load with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2

from analyzer.config.model_config import ModelConfig
from analyzer.datatypes import config_to_wire, deserialize_bytes_tensor, wire_to_numpy
from analyzer.repository.repository import RepositoryError, inside
from analyzer.worker.request import InferRequest, Outputs

WARMUP_FOLDER = "warmup"
# a config may come from a repository-API load request: what it makes the worker allocate and
# run before READY is bounded (Triton sets no bound; a real warm-up is far below these)
MAX_SAMPLE_BYTES = 1 << 30  # one input of one request
MAX_REQUESTS = 1024  # a sample's batch_size
MAX_COUNT = 1000  # a sample's runs
# a load's warm-up altogether: every sample's inputs times its batch_size, the bytes its batches
# make (a python model's shared memory among them); 2 x 128 MiB inputs x batch 4 took 2 GB of
# /dev/shm and 2.5 GB of the worker under the per-input bound alone
MAX_LOAD_BYTES = 512 << 20
_STRING = model_config_pb2.DataType.TYPE_STRING


@dataclass(frozen=True)
class WarmupSample:
    name: str
    count: int
    requests: int  # the sample's batch_size: requests of one sample each, run together
    inputs: dict[str, np.ndarray]  # one request's tensors (batch dimension included)
    wires: dict[str, str]

    def make_requests(self, model: str) -> list[InferRequest]:
        return [
            InferRequest(model, dict(self.inputs), dict(self.wires), None, _ignore,
                         on_response=_ignore_response)  # fmt: skip
            for _ in range(self.requests)
        ]


def warmup_samples(config: ModelConfig, model_path: Path) -> list[WarmupSample]:
    """The config's warm-up samples with their data; ValueError naming the sample and input."""
    samples = []
    batched = config.max_batch_size > 0
    total = 0
    for index, setting in enumerate(config.model_warmup):
        name = setting.name or f"#{index}"
        if setting.batch_size == 0:
            continue
        for what, value, cap in (("batch_size", setting.batch_size, MAX_REQUESTS),
                                 ("count", setting.count, MAX_COUNT)):  # fmt: skip
            if value > cap:
                raise ValueError(f"model '{config.name}': warmup sample '{name}' has {what} "
                                 f"{value}, more than this worker runs ({cap})")  # fmt: skip
        inputs, wires = {}, {}
        for key, meta in setting.inputs.items():
            where = f"model '{config.name}': warmup sample '{name}', input '{key}'"
            dims = [int(d) for d in meta.dims]
            if any(d < 0 for d in dims):
                raise ValueError(f"{where}: every dimension must be given, got {dims}")
            wire = config_to_wire(model_config_pb2.DataType.Name(meta.data_type))
            size = int(np.prod(dims, dtype=np.float64)) * (
                wire_to_numpy(wire).itemsize if wire != "BYTES" else 4)
            if size > MAX_SAMPLE_BYTES:
                raise ValueError(f"{where}: dims {dims} make {size} bytes, more than this worker "
                                 f"allocates for a warm-up input ({MAX_SAMPLE_BYTES})")  # fmt: skip
            total += size * setting.batch_size
            if total > MAX_LOAD_BYTES:  # before this input is made
                raise ValueError(f"model '{config.name}': the warm-up samples' inputs times their "
                                 f"batch_size make more than {MAX_LOAD_BYTES} bytes (at sample "
                                 f"'{name}', input '{key}'), more than this worker allocates for "
                                 "a model's warm-up")  # fmt: skip
            array = _data(meta, wire, dims, model_path, where)
            inputs[key] = array.reshape([1, *dims]) if batched else array
            wires[key] = wire
        samples.append(WarmupSample(name, max(setting.count, 1), setting.batch_size, inputs,
                                    wires))  # fmt: skip
    return samples


def _data(meta: model_config_pb2.ModelWarmup.Input, wire: str, dims: list[int],
          model_path: Path, where: str) -> np.ndarray:  # fmt: skip
    count = int(np.prod(dims)) if dims else 1
    kind = meta.WhichOneof("input_data_type")
    if kind is None:
        raise ValueError(f"{where}: set zero_data, random_data or input_data_file")
    if wire == "BYTES" and kind != "input_data_file":
        out = np.empty(count, dtype=np.object_)
        out[:] = [b""] * count  # Triton's zero data for strings: empty elements
        return out.reshape(dims)
    dtype = wire_to_numpy(wire)
    if kind == "zero_data":
        return np.zeros(dims, dtype=dtype)
    if kind == "random_data":
        raw = np.random.default_rng().integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
        if wire == "BOOL":
            return (raw % 2).astype(bool).reshape(dims)
        return raw.view(dtype).reshape(dims)
    folder = model_path / WARMUP_FOLDER
    try:
        path = inside(folder, folder / meta.input_data_file, "input_data_file",
                      meta.input_data_file)  # fmt: skip
        content = path.read_bytes()
    except RepositoryError:
        raise ValueError(f"{where}: input_data_file '{meta.input_data_file}' is outside "
                         f"{WARMUP_FOLDER}/") from None  # fmt: skip
    except OSError as err:
        raise ValueError(f"{where}: cannot read {WARMUP_FOLDER}/{meta.input_data_file} "
                         f"({err.strerror})") from None  # fmt: skip
    if wire == "BYTES":
        try:
            return deserialize_bytes_tensor(content, count).reshape(dims)
        except ValueError as err:
            raise ValueError(f"{where}: {WARMUP_FOLDER}/{meta.input_data_file}: {err}") from None
    needed = count * dtype.itemsize
    if len(content) < needed:
        raise ValueError(f"{where}: {WARMUP_FOLDER}/{meta.input_data_file} has {len(content)} "
                         f"bytes, the input needs {needed}")  # fmt: skip
    return np.frombuffer(content[:needed], dtype=dtype).reshape(dims).copy()


def _ignore(outputs: Outputs | None, error: Exception | None) -> None:
    """A warm-up request's answer goes nowhere; the runner checks for errors itself."""


def _ignore_response(outputs: Outputs | None, error: Exception | None, final: bool) -> None:
    """A decoupled model's warm-up responses go nowhere too."""
