"""Requests encoded once, before the load starts: the client's hot loop only writes bytes.

HTTP requests use the binary tensor extension and ask for every output in binary, as
perf_analyzer does; gRPC requests are serialized `ModelInferRequest` messages with gRPC's length
prefix, written as they are by our own HTTP/2 client (grpc_client.py), so no protobuf work
happens per request.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import numpy as np

from analyzer.datatypes import tensor_to_bytes
from analyzer.loadgen.grpc_call import grpc_message
from analyzer.loadgen.inputs import InputError
from analyzer.loadgen.sequences import GrpcSequenceTemplate, HttpSequenceTemplate

Headers = tuple[tuple[str, str], ...]
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# what the load generator writes itself, or HTTP/2 and gRPC reserve
_RESERVED = {"host", "content-length", "content-type", "inference-header-content-length",
             "transfer-encoding", "connection", "te", "user-agent", "keep-alive", "upgrade",
             "expect"}  # fmt: skip


def parse_headers(values: list[str] | tuple[str, ...], flag: str = "-H") -> Headers:
    """perf_analyzer's `-H NAME:VALUE` headers (gRPC metadata over gRPC), checked: a name is an
    HTTP token the load generator does not set itself, a value has no line break."""
    out = []
    for text in values:
        name, sep, value = str(text).partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _TOKEN.match(name):
            raise InputError(f"{flag} '{text}' must be NAME:VALUE with NAME an HTTP header name")
        if any(c in value for c in "\r\n\0"):
            raise InputError(f"{flag} '{name}': the value holds a line break or NUL")
        low = name.lower()
        if low in _RESERVED or low.startswith("grpc-"):
            raise InputError(f"{flag} '{name}' is set by the load generator itself")
        out.append((name, value))
    return tuple(out)


def http_infer_path(model: str, version: str = "") -> str:
    base = f"/v2/models/{quote(model, safe='')}"  # as tritonclient does
    return f"{base}/versions/{version}/infer" if version else f"{base}/infer"


def _http_inputs(
    tensors: dict[str, np.ndarray], datatypes: dict[str, str]
) -> tuple[list[dict], bytes]:
    """The JSON header's inputs (binary tensor extension) and the tensors' bytes after it."""
    blobs: list[bytes] = []
    inputs = []
    for name, array in tensors.items():
        blob = bytes(tensor_to_bytes(array, datatypes[name]))
        blobs.append(blob)
        inputs.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatypes[name],
                "parameters": {"binary_data_size": len(blob)},
            }
        )
    return inputs, b"".join(blobs)


def _http_head(host: str, model: str, version: str, headers: Headers = ()) -> str:
    return (
        f"POST {http_infer_path(model, version)} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/octet-stream\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers)
    )


def http_request(
    host: str, model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    headers: Headers = (),
) -> bytes:  # fmt: skip
    """One complete HTTP/1.1 POST, headers and body, ready to write to a socket."""
    inputs, blobs = _http_inputs(tensors, datatypes)
    header = json.dumps(
        {"inputs": inputs, "parameters": {"binary_data_output": True}}, separators=(",", ":")
    ).encode()
    body = header + blobs
    head = (
        f"{_http_head(host, model, version, headers)}"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def http_shm_request(
    host: str, model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    placed: dict, outputs: dict, headers: Headers = (),
) -> bytes:  # fmt: skip
    """`http_request` whose tensors lie in registered shared memory (`placed`, `outputs`: name ->
    shm.Placed): a JSON body naming the regions, no tensor bytes."""
    body = json.dumps(_http_shm_fields(tensors, datatypes, placed, outputs),
                      separators=(",", ":")).encode()  # fmt: skip
    head = (f"{_http_head(host, model, version, headers)}"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    return head + body


def _http_shm_fields(tensors: dict[str, np.ndarray], datatypes: dict[str, str], placed: dict,
                     outputs: dict) -> dict:  # fmt: skip
    """The JSON body's inputs and outputs, each naming its shared-memory region."""
    return {
        "inputs": [{"name": n, "shape": list(a.shape), "datatype": datatypes[n],
                    "parameters": placed[n].parameters()} for n, a in tensors.items()],
        "outputs": [{"name": n, "parameters": p.parameters()} for n, p in outputs.items()],
    }  # fmt: skip


def grpc_shm_request(
    model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    placed: dict, outputs: dict, decoupled: bool = False,
) -> bytes:  # fmt: skip
    """`grpc_request` whose tensors lie in registered shared memory: no raw contents."""
    request, _ = _grpc_parts(model, version, tensors, datatypes, decoupled)
    _place(request, placed, outputs)
    return grpc_message(request.SerializeToString())


def _place(request, placed: dict, outputs: dict) -> None:
    """Point a ModelInferRequest's inputs and outputs at their shared-memory regions."""
    for tensor in request.inputs:
        _shm_parameters(tensor.parameters, placed[tensor.name].parameters())
    for name, where in outputs.items():
        wanted = request.outputs.add()
        wanted.name = name
        _shm_parameters(wanted.parameters, where.parameters())


def _shm_parameters(target, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, str):
            target[key].string_param = value
        else:
            target[key].int64_param = value


def http_sequence_template(
    host: str, model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    headers: Headers = (), placed: dict | None = None, outputs: dict | None = None,
) -> HttpSequenceTemplate:  # fmt: skip
    """`http_request` as a template whose sequence id and START/END flags are filled per step;
    with `placed`/`outputs` (shared memory) `http_shm_request`'s body instead."""
    if placed is not None:
        fields = json.dumps(_http_shm_fields(tensors, datatypes, placed, outputs or {}),
                            separators=(",", ":")).encode()  # fmt: skip
        json_head = fields[:-1] + b',"parameters":{"sequence_id":'
        return HttpSequenceTemplate(_http_head(host, model, version, headers), json_head, b"")
    inputs, blobs = _http_inputs(tensors, datatypes)
    json_head = (
        b'{"inputs":' + json.dumps(inputs, separators=(",", ":")).encode()
        + b',"parameters":{"binary_data_output":true,"sequence_id":'
    )  # fmt: skip
    return HttpSequenceTemplate(_http_head(host, model, version, headers), json_head, blobs)


def _grpc_parts(
    model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    decoupled: bool = False,
):  # fmt: skip
    """A ModelInferRequest without its raw contents, and one with only them. A decoupled
    model's request asks for the final flag as a response of its own when the model sends it
    alone (`triton_enable_empty_final_response`, as perf_analyzer asks): the stream then always
    says when a request is done."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    if decoupled:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    raw = service_pb2.ModelInferRequest()
    for name, array in tensors.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.datatype = datatypes[name]
        tensor.shape.extend(array.shape)
        raw.raw_input_contents.append(bytes(tensor_to_bytes(array, datatypes[name])))
    return request, raw


def grpc_request(
    model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    decoupled: bool = False,
) -> bytes:  # fmt: skip
    """A serialized inference.ModelInferRequest with raw input contents, framed for the wire."""
    request, raw = _grpc_parts(model, version, tensors, datatypes, decoupled)
    request.raw_input_contents.extend(raw.raw_input_contents)
    return grpc_message(request.SerializeToString())


def grpc_sequence_template(
    model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str],
    decoupled: bool = False, placed: dict | None = None, outputs: dict | None = None,
) -> GrpcSequenceTemplate:  # fmt: skip
    """`grpc_request` as a template: a message's fields may come in any order, so the sequence
    parameters go between the fixed fields and the raw contents (a serialized message is the
    concatenation of its fields' encodings). With `placed`/`outputs` the tensors are in shared
    memory and there are no raw contents."""
    from tritonclient.grpc import service_pb2

    request, raw = _grpc_parts(model, version, tensors, datatypes, decoupled)
    if placed is not None:
        _place(request, placed, outputs or {})
        raw = service_pb2.ModelInferRequest()

    def entry(key: str, value: bool) -> bytes:
        message = service_pb2.ModelInferRequest()
        message.parameters[key].bool_param = value
        return message.SerializeToString()

    return GrpcSequenceTemplate(
        request.SerializeToString(),
        (entry("sequence_start", False), entry("sequence_start", True)),
        (entry("sequence_end", False), entry("sequence_end", True)),
        raw.SerializeToString(),
    )
