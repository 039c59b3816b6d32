"""Repeated ModelInferRequest layouts, parsed and checked once (the gRPC twin of HTTP's plans).

Why: clients send the same request again and again with new tensor bytes (perf_analyzer,
tritonclient with fixed shapes). Serialized, such a request is its other fields (model, id,
parameters, input names/types/shapes, requested outputs: protobuf fields 1-6) followed by one
raw_input_contents field (7) per input. A request whose bytes before its first raw field equal a
layout seen before, and whose remaining bytes are exactly the raw fields that layout expects, has
the same meaning as that earlier request but for the tensor values: its inputs become numpy views
at fixed offsets and no protobuf message, parameter dict or validation is built for it. Anything
else (contents in typed fields, BYTES inputs, unknown fields, a different layout) takes the
general path, which parses it with protobuf and may teach a new layout once it was accepted.
Bounded: at most MAX_LAYOUTS layouts, each of a prefix of at most MAX_PREFIX_BYTES.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from analyzer.datatypes import WIRE_TO_NUMPY
from analyzer.worker.request import InferRequest

_RAW_TAG = 0x3A  # field 7 (raw_input_contents), length-delimited
_FIELD_TAGS = frozenset((0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32))  # fields 1-6, length-delimited


def raw_start(data: bytes) -> int:
    """Offset of the first raw_input_contents field of a serialized ModelInferRequest, or -1.

    Only the top-level fields are walked (tag and length); -1 when there is no raw field or a
    field other than 1-7 comes first, or the bytes end inside a field.
    """
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        if tag == _RAW_TAG:
            return i
        if tag not in _FIELD_TAGS:
            return -1
        i += 1
        length = shift = 0
        while True:
            if i >= n or shift > 28:
                return -1
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        i += length
    return -1


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

    prefix: bytes
    size: int  # the whole message's length
    fields: pb.ModelInferRequest  # the prefix parsed: what the answer needs (id, outputs)
    model_name: str
    model_version: str
    # name, dtype, shape, element count, offset of the bytes
    inputs: tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]
    framing: tuple[tuple[int, bytes], ...]  # (offset, tag and length) of each raw field
    wire_types: dict[str, str]
    requested: list[str] | None
    output_names: tuple[str, ...]  # the requested outputs' names, () when none were named
    request_id: str
    params: dict
    priority: int
    timeout: int
    correlation: int | str
    checked: dict  # batch size by the model versions' validators that accepted the layout

    def request(self, data: bytes, on_done, arrival_ns: int) -> InferRequest:
        """The InferRequest of a message that `Layouts.match` gave this layout for."""
        inputs = {
            name: np.frombuffer(data, dtype, count, offset).reshape(shape)
            for name, dtype, shape, count, offset in self.inputs
        }
        return InferRequest(
            model_name=self.model_name,
            inputs=inputs,
            wire_types=self.wire_types,
            requested_outputs=self.requested,
            on_done=on_done,
            id=self.request_id,
            parameters=self.params,
            arrival_ns=arrival_ns,
            priority=self.priority,
            timeout_us=self.timeout,
            correlation_id=self.correlation,
        )


class Layouts:
    MAX_LAYOUTS = 64
    MAX_PREFIX_BYTES = 4096

    def __init__(self) -> None:
        self.layouts: dict[bytes, Layout] = {}
        self.last: Layout | None = None

    def match(self, data: bytes) -> Layout | None:
        """The known layout of this message, or None (the general path then handles it)."""
        layout = self.last
        if layout is None or len(data) != layout.size or not data.startswith(layout.prefix):
            start = raw_start(data)
            if start < 0 or start > self.MAX_PREFIX_BYTES:
                return None
            layout = self.layouts.get(data[:start])
            if layout is None or len(data) != layout.size:
                return None
        for offset, frame in layout.framing:
            if data[offset : offset + len(frame)] != frame:
                return None
        self.last = layout
        return layout

    def learn(self, data: bytes, request: pb.ModelInferRequest, accepted: InferRequest) -> None:
        """Keep the layout of a message the general path parsed and accepted, if it has one."""
        start = raw_start(data)
        if start < 0 or start > self.MAX_PREFIX_BYTES:
            return
        prefix = data[:start]
        if prefix in self.layouts or len(request.raw_input_contents) != len(request.inputs):
            return
        inputs, framing = [], []
        offset = start
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
        if offset != len(data):  # something other than raw fields follows them
            return
        if len(self.layouts) >= self.MAX_LAYOUTS:
            del self.layouts[next(iter(self.layouts))]  # the oldest goes
        fields = pb.ModelInferRequest.FromString(prefix)
        self.layouts[prefix] = Layout(
            prefix=prefix,
            size=len(data),
            fields=fields,
            model_name=accepted.model_name,
            model_version=request.model_version,
            inputs=tuple(inputs),
            framing=tuple(framing),
            wire_types=accepted.wire_types,
            requested=accepted.requested_outputs,
            output_names=tuple(o.name for o in fields.outputs),
            request_id=accepted.id,
            params=accepted.parameters,
            priority=accepted.priority,
            timeout=accepted.timeout_us,
            correlation=accepted.correlation_id,
            checked={},
        )
