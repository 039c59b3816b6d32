"""The gRPC service's conversions between protobuf messages and the worker's values.

Input tensors (raw_input_contents or the typed InferTensorContents fields) to numpy arrays, output
arrays to a ModelInferResponse, InferParameters to Python values (a model load's among them), and a
stream's error response. Pure functions of the messages: InferenceService holds the state.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from analyzer.datatypes import (
    CHUNK_ELEMENTS,
    numpy_to_wire,
    shape_count,
    tensor_from_bytes,
    tensor_to_bytes,
    wire_to_numpy,
)
from analyzer.worker.errors import InferError, Status
from analyzer.worker.offload import OFFLOAD_ELEMENTS, PENDING, PendingInput, pending_bytes
from analyzer.worker.params import show_value
from analyzer.worker.shm import SharedMemoryRegistry, region_params
from analyzer.worker.validate import RequestValidator

# InferTensorContents field holding each datatype's values when raw contents are not used.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


def param_value(param: pb.InferParameter) -> Any:
    kind = param.WhichOneof("parameter_choice")
    return getattr(param, kind) if kind else None


def load_params(request: pb.RepositoryModelLoadRequest) -> tuple[str | None, dict[str, bytes]]:
    """A load's 'config' (a JSON string) and 'file:' contents (bytes), type-checked."""
    config, files = None, {}
    for key, param in request.parameters.items():
        value = param_value(param)
        if key == "config":
            if not isinstance(value, str):
                raise InferError(
                    f"load parameter 'config' must be a string_param, got {show_value(value)}"
                )
            config = value
        elif key.startswith("file:"):
            if not isinstance(value, bytes):
                raise InferError(f"load parameter '{key}' must be a bytes_param")
            files[key] = value
    return config, files


class MalformedRequest(InferError):
    """Bytes that are no ModelInferRequest: a unary call is refused, a stream ends."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"malformed request: {detail}")
        self.detail = detail


def set_parameters(field: Any, parameters: dict[str, Any]) -> None:
    """A protobuf `map<string, InferParameter>` filled from bool / int / str values."""
    for key, value in parameters.items():
        if isinstance(value, bool):
            field[key].bool_param = value
        elif isinstance(value, int):
            field[key].int64_param = value
        else:
            field[key].string_param = str(value)


def stream_error(request_id: str, model_name: str, message: str) -> pb.ModelStreamInferResponse:
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(id=request_id, model_name=model_name),
    )


def tensor_region(tensor: Any, what: str) -> tuple[str, int, int] | None:
    """The shared memory region an input's or requested output's parameters name, if any."""
    if not tensor.parameters:
        return None
    return region_params({k: param_value(v) for k, v in tensor.parameters.items()}, what)


def decode_inputs(
    request: pb.ModelInferRequest, shm: SharedMemoryRegistry | None = None,
    validator: RequestValidator | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str], list[PendingInput] | None]:
    """Inputs from raw_input_contents (one per input not in shared memory), the typed contents,
    or a copy of the shared memory region an input's parameters name. A BYTES input is checked
    against the model (`validator`) before its elements are made; a large one is left to the
    side thread (offload.py): it is in the pending list, and `inputs` holds its place."""
    if not request.inputs:
        raise InferError("inference request has no inputs")
    regions = [tensor_region(t, f"input '{t.name}'") for t in request.inputs]
    raw = request.raw_input_contents
    plain = sum(r is None for r in regions)
    if raw and len(raw) != plain:
        raise InferError(f"{len(raw)} raw input contents for {plain} inputs")
    inputs: dict[str, np.ndarray] = {}
    wire_types: dict[str, str] = {}
    pending: list[PendingInput] | None = None
    next_raw = 0
    for i, tensor in enumerate(request.inputs):
        name, wire, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
        if name in inputs:
            raise InferError(f"input '{name}' is given twice")
        region = regions[i]
        if validator is not None and (wire == "BYTES" or region is not None):
            # before a copy out of shared memory or the decoding of BYTES (see http_tensors)
            validator.check_type(name, wire)
        try:
            dtype = wire_to_numpy(wire)
            count = shape_count(shape)
            if region is not None:
                if shm is None:
                    raise InferError("shared memory is not served here")
                data: bytes | None = shm.read(*region)
            elif raw:
                data = raw[next_raw]
                next_raw += 1
            else:
                data = None
                values = _contents(tensor, wire, shape, count)
                if count >= OFFLOAD_ELEMENTS:  # one Python value per element to convert
                    pending = pending or []
                    pending.append(PendingInput(name, count * 8, partial(
                        _from_contents, values, wire, dtype, shape, count)))  # fmt: skip
                    array = PENDING
                else:
                    array = _from_contents(values, wire, dtype, shape, count)
            if data is None:
                pass
            elif wire == "BYTES" and count >= OFFLOAD_ELEMENTS:
                pending = pending or []
                pending.append(pending_bytes(name, data, shape, count))
                array = PENDING
            else:
                array = tensor_from_bytes(memoryview(data), wire, shape, count)
        except ValueError as err:
            raise InferError(f"input '{name}': {err}") from None
        inputs[name] = array
        wire_types[name] = wire
    return inputs, wire_types, pending


def _contents(tensor: Any, wire: str, shape: tuple[int, ...], count: int) -> Any:
    """The typed contents field of a tensor's datatype, checked to hold `count` values."""
    field = _CONTENTS_FIELD.get(wire)
    if field is None:
        raise ValueError(f"datatype {wire} must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:  # before any copy: the count is the client's claim
        raise ValueError(f"shape {list(shape)} needs {count} values, contents have {len(values)}")
    return values


def _from_contents(values: Any, wire: str, dtype: Any, shape: tuple[int, ...],
                   count: int) -> np.ndarray:  # fmt: skip
    """Checked contents (`_contents`) as an array."""
    out = np.empty(count, dtype=np.object_ if wire == "BYTES" else dtype)
    # a slice at a time: one numpy call over millions of values holds the GIL, and so the
    # event loop, for as long as it runs, even on the offload thread
    try:
        for start in range(0, count, CHUNK_ELEMENTS):
            out[start : start + CHUNK_ELEMENTS] = values[start : start + CHUNK_ELEMENTS]
    except OverflowError as err:  # e.g. 300 in uint_contents of a UINT8 input
        raise ValueError(f"contents do not fit {wire}: {err}") from None
    return out.reshape(shape)


def encode_outputs(model: Any, request_id: str, outputs: dict[str, np.ndarray],
                   requested: list[str] | None,
                   regions: dict[str, tuple[str, int, int]] | None = None,
                   shm: SharedMemoryRegistry | None = None) -> pb.ModelInferResponse:  # fmt: skip
    """The response; an output with a shared memory region (`regions`, by name) is written there
    and answered with an empty raw content (the others' indexes stay aligned)."""
    response = pb.ModelInferResponse(
        model_name=model.name, model_version=str(model.version), id=request_id
    )
    for name in requested or list(outputs):
        if name not in outputs:
            raise InferError(f"model '{model.name}' did not produce output '{name}'",
                             Status.INTERNAL)  # fmt: skip
        array = outputs[name]
        wire = numpy_to_wire(array.dtype)
        entry = response.outputs.add(name=name, datatype=wire, shape=list(array.shape))
        blob = bytes(tensor_to_bytes(array, wire))
        region = (regions or {}).get(name)
        if region is not None and shm is not None:
            shm.write(region[0], region[1], blob, region[2])
            entry.parameters["shared_memory_region"].string_param = region[0]
            entry.parameters["shared_memory_byte_size"].int64_param = len(blob)
            blob = b""
        response.raw_output_contents.append(blob)
    return response
