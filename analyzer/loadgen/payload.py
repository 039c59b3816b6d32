"""Requests encoded once, before the load starts: the client's hot loop only writes bytes.

HTTP requests use the binary tensor extension and ask for every output in binary, as
perf_analyzer does; gRPC requests are serialized `ModelInferRequest` messages with gRPC's length
prefix, written as they are by our own HTTP/2 client (grpc_client.py), so no protobuf work
happens per request.
"""

from __future__ import annotations

import json

import numpy as np

from analyzer.datatypes import tensor_to_bytes
from analyzer.loadgen.grpc_call import grpc_message


def http_infer_path(model: str, version: str = "") -> str:
    base = f"/v2/models/{model}"
    return f"{base}/versions/{version}/infer" if version else f"{base}/infer"


def http_request(
    host: str, model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str]
) -> bytes:
    """One complete HTTP/1.1 POST, headers and body, ready to write to a socket."""
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
    header = json.dumps(
        {"inputs": inputs, "parameters": {"binary_data_output": True}}, separators=(",", ":")
    ).encode()
    body = header + b"".join(blobs)
    head = (
        f"POST {http_infer_path(model, version)} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def grpc_request(
    model: str, version: str, tensors: dict[str, np.ndarray], datatypes: dict[str, str]
) -> bytes:
    """A serialized inference.ModelInferRequest with raw input contents, framed for the wire."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in tensors.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.datatype = datatypes[name]
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(bytes(tensor_to_bytes(array, datatypes[name])))
    return grpc_message(request.SerializeToString())
