"""The infer body of the REST API: JSON and binary tensors in, JSON and binary tensors out.

A request's JSON header becomes a `_Plan`, checked once; a header whose inputs are all binary is
kept and reused by the requests that repeat it. Inputs are decoded as numpy views of the binary
part of the body (or converted from JSON 'data'); outputs are encoded as JSON values or as binary
blobs after the header (Triton's binary tensor data extension), with the head of an all-binary
response built once per output layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer.datatypes import (
    CHUNK_ELEMENTS,
    numpy_to_wire,
    shape_count,
    tensor_from_bytes,
    tensor_to_bytes,
    wire_to_numpy,
)
from analyzer.worker.errors import InferError
from analyzer.worker.http_message import HttpRequest, HttpResponse, error_response
from analyzer.worker.json_process import PROCESS_JSON_BYTES, parse_in_child
from analyzer.worker.offload import OFFLOAD_ELEMENTS, PENDING, PendingInput, pending_bytes
from analyzer.worker.params import (
    _object,
    _parse_json,
    flag_param,
    natural_param,
    scalar_params,
    sequence_flags,
    sequence_param,
    show_value,
)
from analyzer.worker.request import Outputs, Signature, batch_signature, response_parameters
from analyzer.worker.shm import SharedMemoryRegistry, region_params

if TYPE_CHECKING:
    from analyzer.worker.manager import Served
    from analyzer.worker.validate import RequestValidator

HEADER_LENGTH = "inference-header-content-length"
# a kept plan's response heads by output layout: (JSON head, the outputs sent as (name, wire
# type), the HTTP headers, the cell of the encoded HTTP head)
Heads = dict[tuple[Any, ...],
             tuple[bytes, list[tuple[str, str]], list[tuple[str, str]], list[bytes | None]]]
_BINARY_TYPE = "application/octet-stream"


def _outputs(spec: Any) -> list[dict[str, Any]] | None:
    """'outputs': a list of objects, each with a string 'name' and optional 'parameters'."""
    if spec is None:
        return None
    if not isinstance(spec, list):
        raise InferError(f"'outputs' must be a list of objects, got {show_value(spec)}")
    for entry in spec:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InferError("each entry of 'outputs' must be an object with a string 'name'")
        params = _object(entry.get("parameters"), f"parameters of output '{entry['name']}'")
        if "binary_data" in params:
            flag_param(params, "binary_data")
        region_params(params, f"output '{entry['name']}'")  # checked before the model runs
    return spec


@dataclass(slots=True)
class _InputPlan:
    name: str
    wire: str
    shape: tuple[int, ...]
    count: int
    size: int | None  # binary_data_size; None: the values are the JSON 'data' of entry `index`
    index: int
    region: tuple[str, int, int] | None = None  # (shared memory region, offset, byte size)


@dataclass(slots=True)
class _Plan:
    """What a request's JSON header asks for, checked once.

    Clients repeat the same header on every call (perf_analyzer, tritonclient with fixed shapes),
    so a header whose inputs are all binary is parsed and checked once and its plan reused, with
    the response heads it has produced. The dicts and lists here are shared by the requests that
    reuse the plan and are only read.
    """

    inputs: list[_InputPlan]
    outputs: list[dict[str, Any]] | None
    requested: list[str] | None
    params: dict[str, Any]
    binary_default: bool
    request_id: str
    priority: int
    timeout: int
    correlation: int | str
    flags: int
    heads: Heads | None  # response heads by output layout; None when the plan is not kept
    checked: dict[Any, int] | None  # batch size by the model versions' validators that accepted it
    signature: Signature  # the requests' batch_signature(): their shapes are the plan's


class _Plans:
    """Plans of recent request headers: bounded in count and key size, so a client that sends
    a new header every time costs a dict lookup and nothing more."""

    MAX_PLANS = 64
    MAX_KEY_BYTES = 4096
    MAX_HEADS = 16  # response layouts per plan

    def __init__(self) -> None:
        self.plans: dict[bytes, _Plan] = {}

    def plan(self, http: HttpRequest,
             offloaded: bool = False) -> tuple[_Plan, dict[str, Any] | None, memoryview]:
        """(plan, the parsed header when it was parsed now, the binary part of the body).
        `offloaded`: on the offload thread, where a JSON header this large is parsed in a
        process of its own (json_process.py)."""
        body = http.body
        length = http.headers.get(HEADER_LENGTH)
        if length is None:
            header = _parse_header(body, offloaded)
            return _make_plan(header, keep=False), header, memoryview(b"")
        try:
            n = int(length)
        except ValueError:
            raise InferError(f"invalid Inference-Header-Content-Length '{length}'") from None
        if n < 0 or n > len(body):
            raise InferError(
                f"Inference-Header-Content-Length {n} exceeds the request body of {len(body)} "
                "bytes"
            )
        view = memoryview(body)
        key = None
        if n <= self.MAX_KEY_BYTES:
            key = bytes(view[:n])
            plan = self.plans.get(key)
            if plan is not None:
                return plan, None, view[n:]
        header = _parse_header(view[:n], offloaded)
        plan = _make_plan(header, keep=key is not None)
        if plan.heads is not None and key is not None:
            plans = self.plans
            if len(plans) >= self.MAX_PLANS:
                del plans[next(iter(plans))]  # the oldest goes
            plans[key] = plan
        return plan, header, view[n:]


def _parse_header(data: bytes | memoryview, offloaded: bool) -> dict[str, Any]:
    """A request's JSON; on the offload thread, one this large in a process of its own."""
    if offloaded and len(data) >= PROCESS_JSON_BYTES:
        return parse_in_child(data)
    return _parse_json(data)


def _make_plan(header: dict[str, Any], keep: bool) -> _Plan:
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise InferError("inference request has no 'inputs'")
    inputs: list[_InputPlan] = []
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        name, wire, shape, params = _input_spec(spec)
        if name in seen:
            raise InferError(f"input '{name}' is given twice")
        seen.add(name)
        size = params.get("binary_data_size")
        try:
            count = shape_count(shape)
        except ValueError as err:
            raise InferError(f"input '{name}': {err}") from None
        region = region_params(params, f"input '{name}'")
        if region is not None:
            inputs.append(_InputPlan(name, wire, shape, count, None, index, region))
            continue
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InferError(
                    f"input '{name}': 'binary_data_size' must be a non-negative integer, "
                    f"got {show_value(size)}"
                )
        elif "data" not in spec:
            raise InferError(f"input '{name}' has neither 'data' nor binary data")
        else:
            keep = False  # the values are in the header: it is not repeated
        inputs.append(_InputPlan(name, wire, shape, count, size, index))
    outputs = _outputs(header.get("outputs"))
    params = scalar_params(_object(header.get("parameters"), "request 'parameters'"))
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InferError(f"request 'id' must be a string, got {show_value(request_id)}")
    return _Plan(
        inputs=inputs,
        outputs=outputs,
        requested=[o["name"] for o in outputs] if outputs else None,
        params=params,
        binary_default=flag_param(params, "binary_data_output"),
        request_id=request_id,
        priority=natural_param(params, "priority"),
        timeout=natural_param(params, "timeout"),
        correlation=sequence_param(params),
        flags=sequence_flags(params),
        heads={} if keep else None,
        checked={} if keep else None,
        signature=batch_signature((p.name, p.shape) for p in inputs),
    )


def _decode_inputs(
    plan: _Plan, header: dict[str, Any] | None, binary: memoryview,
    shm: SharedMemoryRegistry | None = None, validator: RequestValidator | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str], list[PendingInput] | None]:
    """The input arrays: views of the binary part, copies of a shared memory region, or
    converted JSON 'data' (header given). A BYTES input is checked against the model
    (`validator`) before its elements are made; a large one is left to the side thread
    (offload.py): it is in the pending list, and `inputs` holds its place."""
    inputs: dict[str, np.ndarray] = {}
    wire_types: dict[str, str] = {}
    pending: list[PendingInput] | None = None
    offset = 0
    available = len(binary)
    for p in plan.inputs:
        name, size = p.name, p.size
        if validator is not None and (p.wire == "BYTES" or p.region is not None):
            # before a copy out of shared memory (up to the input cap each) as before decoding
            # BYTES: inputs the model does not take were read first, and then refused
            validator.check_type(name, p.wire)
        try:
            if p.region is not None:
                if shm is None:
                    raise InferError("shared memory is not served here")
                region, at, length = p.region
                data: bytes | memoryview | None = shm.read(region, at, length)
            elif size is not None:
                if offset + size > available:
                    raise InferError(
                        f"unexpected end of binary data for input '{name}': needs {size} bytes, "
                        f"{available - offset} remain"
                    )
                data = binary[offset : offset + size]
                offset += size
            else:
                assert header is not None  # plans with JSON data are never kept
                data = None
                array = _from_json_data(header["inputs"][p.index]["data"], p.wire, p.shape, p.count)
            if data is None:
                pass
            elif p.wire == "BYTES" and p.count >= OFFLOAD_ELEMENTS:
                pending = pending or []
                pending.append(pending_bytes(name, data, p.shape, p.count))
                array = PENDING
            else:
                array = tensor_from_bytes(data, p.wire, p.shape, p.count)
        except ValueError as err:
            raise InferError(f"input '{name}': {err}") from None
        inputs[name] = array
        wire_types[name] = p.wire
    if offset != available:
        raise InferError(f"{available - offset} unexpected bytes after the binary input data")
    return inputs, wire_types, pending


def _input_spec(spec: Any) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    """One entry of 'inputs', type-checked: (name, datatype, shape, parameters)."""
    if not isinstance(spec, dict):
        raise InferError("each entry of 'inputs' must be an object with name, datatype, shape")
    name, wire, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(name, str):
        raise InferError(f"each input needs a string 'name', got {show_value(name)}")
    if not isinstance(wire, str):
        raise InferError(f"input '{name}' needs a string 'datatype', got {show_value(wire)}")
    try:
        wire_to_numpy(wire)
    except ValueError:
        raise InferError(f"input '{name}' has unknown datatype {show_value(wire)}") from None
    if not isinstance(shape, list):
        raise InferError(f"input '{name}' needs a 'shape' list, got {show_value(shape)}")
    params = _object(spec.get("parameters"), f"parameters of input '{name}'")
    return name, wire, tuple(shape), params


def _from_json_data(data: Any, wire: str, shape: tuple[int, ...], count: int) -> np.ndarray:
    """JSON 'data' as an array; only strings for BYTES and only numbers otherwise.

    Flat or nested as the shape (any nesting holding `count` values, as np.asarray takes it).
    The count is checked first, from the lengths of the first lists, and a large list is
    flattened and converted CHUNK_ELEMENTS at a time: one numpy call over millions of values
    holds the GIL, and so the event loop, for as long as it runs, even on the offload
    thread."""
    if type(data) is not list:  # one value, as np.asarray takes it
        data = [data]
    dims: list[int] = []
    node: Any = data
    while type(node) is list:
        dims.append(len(node))
        node = node[0] if node else None
    held = 1
    for dim in dims:
        held *= dim
    if held != count:
        raise ValueError(f"shape {list(shape)} needs {count} values, 'data' has {held}")
    flat = _flatten(data, dims) if len(dims) > 1 else data
    if count <= CHUNK_ELEMENTS:
        return _from_flat(flat, wire).reshape(shape)
    parts = [_from_flat(flat[start : start + CHUNK_ELEMENTS], wire)
             for start in range(0, count, CHUNK_ELEMENTS)]  # fmt: skip
    for values in (flat, data):  # freed a slice at a time: freeing millions is one C call
        while values:
            del values[-CHUNK_ELEMENTS:]
    return np.concatenate(parts).reshape(shape)


def _flatten(data: list[Any], dims: list[int]) -> list[Any]:
    """Nested lists of lengths `dims` as one flat list, each level a slice at a time; the
    lists of each level emptied as they are read, so that freeing `data` is short too."""
    level = data
    for size in dims[1:]:
        step = max(CHUNK_ELEMENTS // max(size, 1), 1)
        below: list[Any] = []
        for start in range(0, len(level), step):
            part = level[start : start + step]
            if any(type(v) is not list or len(v) != size for v in part):
                raise ValueError("'data' is not a (nested) list of values of the input's shape: "
                                 "its lists differ in length")  # fmt: skip
            below.extend(chain.from_iterable(part))
            for v in part:
                v.clear()
        level = below
    return level


def _from_flat(values: Any, wire: str) -> np.ndarray:
    """A flat list or array of JSON values as a 1-D array of the datatype's."""
    try:
        flat = np.asarray(values, dtype=np.object_ if wire == "BYTES" else None)
    except (ValueError, TypeError, OverflowError) as err:
        raise ValueError(f"'data' is not a (nested) list of values: {err}") from None
    if flat.ndim != 1:
        raise ValueError("'data' is not a (nested) list of values of the input's shape")
    if wire == "BYTES":
        # bytes(n) of a number would allocate n bytes: elements must be strings
        if not all(isinstance(v, str) for v in flat):
            raise ValueError("'data' of a BYTES input must hold strings")
        out = np.empty(flat.size, dtype=np.object_)
        out[:] = [v.encode() for v in flat]
        return out
    if flat.dtype.kind not in "biuf":
        raise ValueError(f"'data' of a {wire} input must hold numbers in range")
    try:
        return flat.astype(wire_to_numpy(wire))
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"'data' does not convert to {wire}: {err}") from None


def _encode_outputs(
    model: Served, request_id: str, outputs: Outputs, spec: list[dict[str, Any]] | None,
    binary_default: bool, heads: Heads | None = None, shm: SharedMemoryRegistry | None = None,
) -> HttpResponse:
    """The response; with `heads` (a kept plan's), an all-binary head is built once per layout.
    An output whose parameters name a shared memory region is written there instead."""
    key: tuple[Any, ...] | None = None
    sent: list[tuple[str, str]]
    blobs: list[bytes | memoryview]
    parameters = response_parameters(outputs)
    if parameters:  # the head carries them: not one to keep per layout
        heads = None
    if heads is not None:
        key = (model.name, model.version, *((n, a.dtype, a.shape) for n, a in outputs.items()))
        cached = heads.get(key)
        if cached is not None:
            head, sent, headers, wire_head = cached
            blobs = [tensor_to_bytes(outputs[name], wire) for name, wire in sent]
            return HttpResponse(200, [head, *blobs], _BINARY_TYPE, headers, wire_head)
    if spec:
        wanted = [(o["name"], (o.get("parameters") or {})) for o in spec]
    else:
        wanted = [(name, {}) for name in outputs]
    entries: list[dict[str, Any]] = []
    blobs, sent = [], []
    # JSON outputs of many values: (the marker standing for its 'data' in the head, its JSON)
    large: list[tuple[bytes, list[bytes]]] = []
    for name, params in wanted:
        if name not in outputs:
            return error_response(500, f"model '{model.name}' did not produce output '{name}'")
        array = outputs[name]
        wire = numpy_to_wire(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": wire, "shape": list(array.shape)}
        region = region_params(params, f"output '{name}'") if params else None
        if region is not None:
            if shm is None:
                raise InferError("shared memory is not served here")
            blob = tensor_to_bytes(array, wire)
            shm.write(region[0], region[1], blob, region[2])
            # no parameters: Triton's C++ client reads any it finds as binary data's
            entries.append(entry)
            continue
        if params.get("binary_data", binary_default):  # BF16 too: 2 bytes each, as Triton's
            blob = tensor_to_bytes(array, wire)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
            sent.append((name, wire))
        elif array.size > CHUNK_ELEMENTS:  # spliced into the head below, encoded in slices
            marker = f"\0{os.urandom(8).hex()}"  # no client's 'id' spells it
            entry["data"] = marker
            large.append((json.dumps(marker).encode(), _json_values(array, wire)))
        else:
            entry["data"] = _json_list(array.ravel(), wire)
        entries.append(entry)
    header: dict[str, Any] = {
        "model_name": model.name,
        "model_version": str(model.version),
        "outputs": entries,
    }
    if request_id:
        header["id"] = request_id
    if parameters:
        header["parameters"] = parameters
    head = json.dumps(header, separators=(",", ":")).encode()
    heads_out = _splice(head, large) if large else [head]
    if not blobs:
        return HttpResponse(200, heads_out)
    headers = [("Inference-Header-Content-Length", str(sum(map(len, heads_out))))]
    # a head holds no values when every output is binary and of a fixed size per element
    if heads is not None and key is not None and len(sent) == len(entries) and all(
        wire not in ("BYTES", "BF16") for _, wire in sent
    ):
        if len(heads) >= _Plans.MAX_HEADS:
            del heads[next(iter(heads))]
        # the key fixes every output's type and shape, so the body's length: one HTTP head
        heads[key] = (head, sent, headers, [None])
    return HttpResponse(200, [*heads_out, *blobs], _BINARY_TYPE, headers)


def _json_list(flat: np.ndarray, wire: str) -> list[Any]:
    """A flat array's values as JSON takes them."""
    if wire == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    # JSON has no bfloat16: its values are exact as float32
    values: list[Any] = (flat.astype(np.float32) if wire == "BF16" else flat).tolist()
    return values


def _json_values(array: np.ndarray, wire: str) -> list[bytes]:
    """An output's 'data' as JSON, made CHUNK_ELEMENTS values at a time: one tolist() and one
    json.dumps over millions of values held the GIL, and so the event loop, for seconds (a
    4M-value FP32 output: 3.7 s). The same bytes as json.dumps of the whole list."""
    flat = array.ravel()
    pieces = [b"["]
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        text = json.dumps(_json_list(flat[start : start + CHUNK_ELEMENTS], wire),
                          separators=(",", ":"))  # fmt: skip
        pieces.append((text[1:-1] if start == 0 else "," + text[1:-1]).encode())
    pieces.append(b"]")
    return pieces


def _splice(head: bytes, large: list[tuple[bytes, list[bytes]]]) -> list[bytes]:
    """The head with each marker replaced by its output's JSON pieces, in order."""
    out: list[bytes] = []
    for marker, pieces in large:
        before, head = head.split(marker, 1)
        out.append(before)
        out.extend(pieces)
    out.append(head)
    return out
