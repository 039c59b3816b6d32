"""Request tensors for the load generator, made from the model's metadata and config.

perf_analyzer's rules: the data is random (default), zero, or read from a JSON file in its
`--input-data` format; `--shape NAME:d1,d2` fixes dynamic dims (batch dim excluded); `-b N` stacks
N samples into one request for a batching model. The data is made once, before any load starts, so
the client spends no time on it while measuring.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analyzer.datatypes import wire_to_numpy
from analyzer.errors import AnalyzerError
from analyzer.fsutil import UserFileError, read_user_text


class InputError(AnalyzerError):
    """Input description that cannot make a request (bad --shape, --input-data, -b)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # without the batch dim; -1 where dynamic


@dataclass(frozen=True)
class ModelIO:
    """What the load generator needs to know about a model's interface."""

    name: str
    version: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]


def model_io(metadata: dict, config: dict) -> ModelIO:
    """Combine `/v2/models/M` metadata and `/v2/models/M/config` into a ModelIO."""
    max_batch = int(config.get("max_batch_size", 0) or 0)
    optional = {i.get("name") for i in config.get("input", []) if i.get("optional")}
    inputs = []
    for item in metadata.get("inputs", []):
        shape = [int(d) for d in item.get("shape", [])]
        if max_batch > 0:
            shape = shape[1:]  # metadata shapes carry the -1 batch dim
        if item["name"] in optional:
            continue  # perf_analyzer sends optional inputs only when the data names them
        inputs.append(TensorSpec(item["name"], item["datatype"], tuple(shape)))
    outputs = tuple(o["name"] for o in metadata.get("outputs", []))
    versions = metadata.get("versions") or [""]
    return ModelIO(metadata["name"], str(versions[-1]), max_batch, tuple(inputs), outputs)


def parse_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    """`--shape NAME:d1,d2` (repeatable) -> {NAME: (d1, d2)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(","))
            if any(d <= 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise InputError(
                f"--shape '{value}' must be NAME:d1,d2,... with positive integer dims"
            ) from None
    return shapes


def _resolve_shape(spec: TensorSpec, shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(spec.shape) or any(
            d != -1 and d != g for d, g in zip(spec.shape, given, strict=False)
        ):
            raise InputError(
                f"--shape {spec.name}:{','.join(map(str, given))} does not fit the model's "
                f"shape {list(spec.shape)} (batch dim excluded)"
            )
        return given
    if any(d < 0 for d in spec.shape):
        raise InputError(
            f"input '{spec.name}' has dynamic shape {list(spec.shape)}: give its shape with "
            f"--shape {spec.name}:d1,d2,..."
        )
    return spec.shape


REQUEST_LIMIT = (2 << 30) - 1  # the most a gRPC (protobuf) message can carry; HTTP's is less


def _check_request_size(io: ModelIO, shapes: dict[str, tuple[int, ...]], batch_size: int,
                        string_length: int) -> None:  # fmt: skip
    """A shape whose request could never be sent (a config's dims of 9000000000000) is named
    before its tensors are made, not met as an allocation of terabytes."""
    total = 0
    for spec in io.inputs:
        count = batch_size * math.prod(shapes[spec.name])
        size = (4 + string_length if spec.datatype == "BYTES"
                else wire_to_numpy(spec.datatype).itemsize)  # fmt: skip
        total += count * size
        if total > REQUEST_LIMIT:
            raise InputError(
                f"input '{spec.name}' of model '{io.name}' makes one request "
                f"{_gib(total)} (shape {list(shapes[spec.name])}, batch {batch_size}), more than "
                f"the 2 GiB a request can carry; give a smaller shape with --shape {spec.name}:"
                "d1,d2,..."
            )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):,.1f} GiB"


def _synthetic(spec: TensorSpec, shape: tuple[int, ...], kind: str, rng, string_length: int):
    dtype = wire_to_numpy(spec.datatype)
    if spec.datatype == "BYTES":
        count = int(np.prod(shape))
        if kind == "zero":
            items = [b"0"] * count
        else:
            letters = rng.integers(97, 123, size=(count, string_length), dtype=np.uint8)
            items = [row.tobytes() for row in letters]
        out = np.empty(count, dtype=np.object_)
        out[:] = items
        return out.reshape(shape)
    if kind == "zero":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 64, size=shape).astype(dtype)
    return rng.random(size=shape, dtype=np.float64).astype(dtype)


def _from_json_value(spec: TensorSpec, value, shapes, where: str) -> np.ndarray:
    dtype = wire_to_numpy(spec.datatype)
    shape = None
    if isinstance(value, dict):
        shape = tuple(int(d) for d in value["shape"]) if "shape" in value else None
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                arr = np.empty(1, dtype=np.object_)
                arr[:] = [raw]
            else:
                arr = np.frombuffer(raw, dtype=dtype).copy()
        elif "content" in value:
            value = value["content"]
            arr = None
        else:
            raise InputError(f"{where}: an input object needs 'content' or 'b64'")
    else:
        arr = None
    if arr is None:
        if spec.datatype == "BYTES":
            flat = np.asarray(value, dtype=np.object_).ravel()
            arr = np.empty(flat.size, dtype=np.object_)
            arr[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
        else:
            arr = np.asarray(value, dtype=dtype).ravel()
    if shape is None:
        try:
            shape = _resolve_shape(spec, shapes)
        except InputError:
            known = int(np.prod([d for d in spec.shape if d > 0]))
            if sum(d < 0 for d in spec.shape) != 1 or arr.size == 0 or arr.size % known:
                raise InputError(
                    f"{where}: input '{spec.name}' has {arr.size} values, which do not fill its "
                    f"shape {list(spec.shape)}; give \"shape\" in the file or --shape"
                ) from None
            shape = tuple(arr.size // known if d < 0 else d for d in spec.shape)
    if int(np.prod(shape)) != arr.size:
        raise InputError(
            f"{where}: input '{spec.name}' has {arr.size} values, shape {list(shape)} needs "
            f"{int(np.prod(shape))}"
        )
    return arr.reshape(shape)


def _load_json_steps(path: Path, io: ModelIO, shapes) -> list[dict[str, np.ndarray]]:
    try:
        document = json.loads(read_user_text(path, limit=REQUEST_LIMIT))
    except UserFileError as err:
        raise InputError(f"--input-data {err}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"--input-data {path}: not valid JSON ({exc})") from None
    steps = document.get("data") if isinstance(document, dict) else None
    if not isinstance(steps, list) or not steps:
        raise InputError(f"--input-data {path}: expected {{\"data\": [ {{input: values}}, ... ]}}")
    if isinstance(steps[0], list):
        raise InputError(
            f"--input-data {path}: sequence streams (a list of lists) are not read yet; give "
            "one list of steps (a sequence model's requests cycle through them)"
        )
    out = []
    for index, step in enumerate(steps):
        where = f"--input-data {path}, data[{index}]"
        if not isinstance(step, dict):
            raise InputError(f"{where}: expected an object of input name -> values")
        tensors = {}
        for spec in io.inputs:
            if spec.name not in step:
                raise InputError(f"{where}: input '{spec.name}' is missing")
            tensors[spec.name] = _from_json_value(spec, step[spec.name], shapes, where)
        unknown = set(step) - {s.name for s in io.inputs}
        if unknown:
            raise InputError(f"{where}: '{sorted(unknown)[0]}' is not an input of the model")
        out.append(tensors)
    return out


def _batch(samples: list[dict[str, np.ndarray]], batch_size: int, io: ModelIO):
    """Request j takes samples j*b .. j*b+b-1 (cyclically), stacked on a new batch dim."""
    if io.max_batch_size == 0:
        return [dict(s) for s in samples]
    count = len(samples)
    requests = []
    for j in range(count):
        picked = [samples[(j * batch_size + i) % count] for i in range(batch_size)]
        requests.append({name: np.stack([p[name] for p in picked]) for name in picked[0]})
    return requests


def make_requests(
    io: ModelIO,
    batch_size: int = 1,
    input_data: str = "random",
    shapes: dict[str, tuple[int, ...]] | None = None,
    string_length: int = 128,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """The tensors of each distinct request; the load cycles through them."""
    shapes = shapes or {}
    unknown = set(shapes) - {s.name for s in io.inputs}
    if unknown:
        name = sorted(unknown)[0]
        raise InputError(f"--shape names '{name}', which is not an input of the model")
    if batch_size < 1:
        raise InputError(f"-b {batch_size}: the batch size must be at least 1")
    if io.max_batch_size == 0 and batch_size > 1:
        raise InputError(
            f"-b {batch_size}: model '{io.name}' has max_batch_size 0, so each request is one "
            "sample"
        )
    if io.max_batch_size > 0 and batch_size > io.max_batch_size:
        raise InputError(
            f"-b {batch_size} exceeds model '{io.name}' max_batch_size {io.max_batch_size}"
        )
    if input_data in ("random", "zero"):
        rng = np.random.default_rng(seed)
        resolved = {s.name: _resolve_shape(s, shapes) for s in io.inputs}
        _check_request_size(io, resolved, batch_size, string_length)
        sample = {
            s.name: _synthetic(s, resolved[s.name], input_data, rng, string_length)
            for s in io.inputs
        }
        return _batch([sample], batch_size, io)
    return _batch(_load_json_steps(Path(input_data), io, shapes), batch_size, io)
