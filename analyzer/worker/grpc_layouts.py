"""Repeated ModelInferRequest layouts, parsed and checked once (the gRPC twin of HTTP's plans).

Why: clients send the same request again and again with new tensor bytes (perf_analyzer,
tritonclient with fixed shapes). Serialized, such a request is its other fields (model, id,
parameters, input names/types/shapes, requested outputs: protobuf fields 1-6) followed by one
raw_input_contents field (7) per input. A request whose bytes before its first raw field, but for
its id, equal a layout seen before, and whose remaining bytes are exactly the raw fields that
layout expects, has the same meaning as that earlier request but for the id and the tensor values:
its inputs become numpy views at fixed offsets from its first raw field and no protobuf message,
parameter dict or validation is built for it. The id is left out of the layout because streaming
clients number their requests (perf_analyzer --streaming, tritonclient's async_stream_infer): a
layout per id would never repeat. Anything
else (contents in typed fields, BYTES inputs, unknown fields, a different layout) takes the
general path, which parses it with protobuf and may teach a new layout once it was accepted.
Bounded: at most MAX_LAYOUTS layouts, each of a prefix of at most MAX_PREFIX_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from analyzer.datatypes import WIRE_TO_NUMPY
from analyzer.worker.request import InferRequest, OnDone, Signature

_RAW_TAG = 0x3A  # field 7 (raw_input_contents), length-delimited
_ID_TAG = 0x1A  # field 3 (id), length-delimited
_FIELD_TAGS = frozenset((0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32))  # fields 1-6, length-delimited
_NO_ID = (-1, -1, -1)


def raw_start(data: bytes) -> int:
    """Offset of the first raw_input_contents field of a serialized ModelInferRequest, or -1."""
    return scan(data)[0]


def scan(data: bytes) -> tuple[int, int, int, int]:
    """The offset of the first raw_input_contents field of a serialized ModelInferRequest, and
    of its id field's tag, value and end (-1, -1, -1 without one).

    Only the top-level fields are walked (tag and length); the first offset is -1 when there is
    no raw field, a field other than 1-7 comes first, the id comes twice, or the bytes end inside
    a field.
    """
    i, n = 0, len(data)
    ident = _NO_ID
    while i < n:
        tag = data[i]
        if tag == _RAW_TAG:
            return (i, *ident)
        if tag not in _FIELD_TAGS:
            return (-1, *_NO_ID)
        begin = i
        i += 1
        length = shift = 0
        while True:
            if i >= n or shift > 28:
                return (-1, *_NO_ID)
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        if tag == _ID_TAG:
            if ident[0] >= 0:
                return (-1, *_NO_ID)  # protobuf keeps the last: the general path decides
            ident = (begin, i, i + length)
        i += length
    return (-1, *_NO_ID)


def varint(n: int) -> bytes:
    """A protobuf base-128 varint (lengths of length-delimited fields)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(slots=True)
class Layout:
    """One request layout. The dicts and lists are shared by its requests and only read."""

    key: bytes  # the bytes before the first raw field, less the id field
    size: int  # the whole message's length, less the id field
    fields: pb.ModelInferRequest  # the key parsed: what the answer needs (model, outputs)
    model_name: str
    model_version: str
    # name, dtype, shape, element count, offset of the bytes from the first raw field
    inputs: tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]
    framing: tuple[tuple[int, bytes], ...]  # (offset from the first, tag and length) per raw field
    wire_types: dict[str, str]
    requested: list[str] | None
    output_names: tuple[str, ...]  # the requested outputs' names, () when none were named
    params: dict[str, Any]
    priority: int
    timeout: int
    correlation: int | str
    flags: int
    checked: dict[Any, int]  # batch size by the model versions' validators that accepted the layout
    signature: Signature  # the requests' batch_signature(): their shapes are the layout's

    def request(self, data: bytes, on_done: OnDone, arrival_ns: int, base: int,
                request_id: str) -> InferRequest:  # fmt: skip
        """The InferRequest of a message that `Layouts.match` gave this layout for (with the
        offset of its first raw field and its id)."""
        inputs = {
            name: np.ndarray(shape, dtype, data, base + offset)
            for name, dtype, shape, count, offset in self.inputs
        }
        return InferRequest(
            model_name=self.model_name,
            inputs=inputs,
            wire_types=self.wire_types,
            requested_outputs=self.requested,
            on_done=on_done,
            id=request_id,
            parameters=self.params,
            arrival_ns=arrival_ns,
            priority=self.priority,
            timeout_us=self.timeout,
            correlation_id=self.correlation,
            flags=self.flags,
            signature=self.signature,
        )


class Layouts:
    MAX_LAYOUTS = 64
    MAX_PREFIX_BYTES = 4096

    def __init__(self) -> None:
        self.layouts: dict[bytes, Layout] = {}
        self.last: Layout | None = None

    def match(self, data: bytes) -> tuple[Layout, int, str] | None:
        """The known layout of this message, the offset of its first raw field and its id; None
        when it has none (the general path then handles it)."""
        layout = self.last
        if layout is not None and len(data) == layout.size and data.startswith(layout.key):
            base, request_id = len(layout.key), ""  # no id: the key is the whole prefix
        else:
            start, id_at, value_at, id_end = scan(data)
            if start < 0 or start > self.MAX_PREFIX_BYTES:
                return None
            if id_at < 0:
                key, size, request_id = data[:start], len(data), ""
            else:
                key, size = data[:id_at] + data[id_end:start], len(data) - (id_end - id_at)
                try:
                    request_id = data[value_at:id_end].decode()
                except UnicodeDecodeError:
                    return None  # protobuf refuses it: the general path says so
            layout = self.layouts.get(key)
            if layout is None or size != layout.size:
                return None
            base = start
        for offset, frame in layout.framing:
            at = base + offset
            if data[at : at + len(frame)] != frame:
                return None
        self.last = layout
        return layout, base, request_id

    def learn(self, data: bytes, request: pb.ModelInferRequest, accepted: InferRequest) -> None:
        """Keep the layout of a message the general path parsed and accepted, if it has one."""
        start, id_at, _, id_end = scan(data)
        if start < 0 or start > self.MAX_PREFIX_BYTES:
            return
        key = data[:start] if id_at < 0 else data[:id_at] + data[id_end:start]
        if key in self.layouts or len(request.raw_input_contents) != len(request.inputs):
            return
        if any(o.parameters for o in request.outputs):  # shared memory: the general path's
            return
        inputs, framing = [], []
        offset = 0  # from the first raw field
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            if tensor.datatype == "BYTES":
                return
            frame = bytes((_RAW_TAG,)) + varint(len(raw))
            framing.append((offset, frame))
            offset += len(frame)
            dtype = WIRE_TO_NUMPY[tensor.datatype]
            shape = tuple(tensor.shape)
            count = len(raw) // dtype.itemsize
            inputs.append((tensor.name, dtype, shape, count, offset))
            offset += len(raw)
        if start + offset != len(data):  # something other than raw fields follows them
            return
        if len(self.layouts) >= self.MAX_LAYOUTS:
            del self.layouts[next(iter(self.layouts))]  # the oldest goes
        fields = pb.ModelInferRequest.FromString(key)
        self.layouts[key] = Layout(
            key=key,
            size=len(key) + offset,
            fields=fields,
            model_name=accepted.model_name,
            model_version=request.model_version,
            inputs=tuple(inputs),
            framing=tuple(framing),
            wire_types=accepted.wire_types,
            requested=accepted.requested_outputs,
            output_names=tuple(o.name for o in fields.outputs),
            params=accepted.parameters,
            priority=accepted.priority,
            timeout=accepted.timeout_us,
            correlation=accepted.correlation_id,
            flags=accepted.flags,
            checked={},
            signature=accepted.batch_signature(),
        )
