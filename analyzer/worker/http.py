"""KServe v2 REST API with Triton's extensions, over the httptools transport.

Routes: health, server/model metadata, model ready, model config, statistics, infer (JSON tensors
and the binary tensor data extension), and the repository API (index, load, unload).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from analyzer.config.model_config import model_config_to_dict
from analyzer.datatypes import numpy_to_wire, tensor_from_bytes, tensor_to_bytes, wire_to_numpy
from analyzer.worker.errors import InferError, Status
from analyzer.worker.http_server import HttpRequest, HttpResponse, Respond, error_response
from analyzer.worker.manager import ModelManager
from analyzer.worker.request import InferRequest
from analyzer.worker.restrict import Restrictions

HEADER_LENGTH = "inference-header-content-length"
JSON_TYPE = "application/json"


def server_metadata(version: str) -> dict[str, Any]:
    return {
        "name": "triton",
        "version": "2.41.0",
        "implementation": f"model-analyzer {version}",
        "extensions": [
            "binary_tensor_data",
            "model_repository",
            "model_repository(unload_dependents)",
            "schedule_policy",
            "model_configuration",
            "statistics",
            "parameters",
        ],
    }


def _json(data: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, [json.dumps(data, separators=(",", ":")).encode()])


def _error(err: InferError) -> HttpResponse:
    return error_response(err.status.http, err.message)


class RestApi:
    """Routes one parsed HTTP request; answers through `respond` (now or from a callback)."""

    def __init__(
        self,
        manager: ModelManager,
        loop: asyncio.AbstractEventLoop,
        version: str,
        restrictions: Restrictions | None = None,
    ):
        self.manager = manager
        self.restrictions = restrictions or Restrictions()
        self.loop = loop
        self.metadata = _json(server_metadata(version))
        self.live = True
        self.ready = False

    def __call__(self, request: HttpRequest, respond: Respond) -> None:
        parts = request.path.strip("/").split("/")
        try:
            if parts[0] != "v2":
                raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
            if len(parts) >= 3 and parts[1] == "models":
                self._model_route(request, parts, respond)
            elif len(parts) == 1:
                respond(self.metadata)
            elif parts[1] == "health" and len(parts) == 3:
                ok = self.live if parts[2] == "live" else self.ready and parts[2] == "ready"
                respond(HttpResponse(200 if ok else 400))
            elif parts[1] == "repository":
                self._repository_route(request, parts, respond)
            else:
                raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
        except InferError as err:
            respond(_error(err))

    # -- /v2/models/... ---------------------------------------------------------------------
    def _model_route(self, request: HttpRequest, parts: list[str], respond: Respond) -> None:
        if parts[2] == "stats" and len(parts) == 3:
            respond(_json({"model_stats": [m.stats.as_dict() for m in self.manager.loaded()]}))
            return
        name = parts[2]
        version = ""
        rest = parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = rest[0] if rest else ""
        if action == "infer" and request.method == "POST":
            self._infer(request, name, version, respond)
        elif action == "" and request.method == "GET":
            model = self.manager.get(name, version)
            respond(_json(model.metadata(self.manager.versions(name))))
        elif action == "ready":
            respond(HttpResponse(200 if self.manager.is_ready(name, version) else 400))
        elif action == "config":
            respond(_json(model_config_to_dict(self.manager.get(name, version).config)))
        elif action == "stats":
            if version:
                models = [self.manager.get(name, version)]
            else:
                self.manager.get(name)
                models = [self.manager.get(name, str(v)) for v in self.manager.versions(name)]
            respond(_json({"model_stats": [m.stats.as_dict() for m in models]}))
        else:
            raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)

    # -- /v2/repository/... -----------------------------------------------------------------
    def _repository_route(self, request: HttpRequest, parts: list[str], respond: Respond) -> None:
        body = _parse_json(request.body) if request.body else {}
        if parts[2:] == ["index"] and request.method == "POST":
            respond(_json(self.manager.index(bool(body.get("ready", False)))))
            return
        if len(parts) == 5 and parts[2] == "models" and request.method == "POST":
            name, action = parts[3], parts[4]
            params = body.get("parameters", {}) or {}
            if action == "load":
                config = params.get("config")
                files = {k: v for k, v in params.items() if k.startswith("file:")}
                job = lambda: self.manager.load(name, config, files or None)  # noqa: E731
            elif action == "unload":
                job = lambda: self.manager.unload(name)  # noqa: E731
            else:
                raise InferError(f"no route for POST {request.path}", Status.NOT_FOUND)
            future = self.loop.run_in_executor(None, job)
            future.add_done_callback(lambda f: respond(_done_response(f)))
            return
        raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)

    # -- infer --------------------------------------------------------------------------------
    def _infer(self, http: HttpRequest, name: str, version: str, respond: Respond) -> None:
        model = self.manager.get(name, version)
        arrival = time.perf_counter_ns()
        header, binary = _split_body(http)
        inputs, wire_types = _decode_inputs(header, binary)
        outputs_spec = header.get("outputs")
        requested = [o["name"] for o in outputs_spec] if outputs_spec else None
        params = header.get("parameters") or {}
        binary_default = bool(params.get("binary_data_output", False))
        request_id = header.get("id", "")
        loop = self.loop

        def finish(outputs, error) -> None:
            if error is not None:
                status = error.status.http if isinstance(error, InferError) else 500
                respond(error_response(status, str(error)))
                return
            respond(
                _encode_outputs(model, request_id, outputs, outputs_spec, binary_default)
            )

        def on_done(outputs, error) -> None:
            loop.call_soon_threadsafe(finish, outputs, error)

        request = InferRequest(
            model_name=name,
            inputs=inputs,
            wire_types=wire_types,
            requested_outputs=requested,
            on_done=on_done,
            id=request_id,
            parameters=params,
            arrival_ns=arrival,
            priority=int(params.get("priority", 0) or 0),
            timeout_us=int(params.get("timeout", 0) or 0),
            correlation_id=params.get("sequence_id", 0),
        )
        model.submit(request)


def _done_response(future: asyncio.Future) -> HttpResponse:
    err = future.exception()
    if err is None:
        return HttpResponse(200, [b"{}"])
    if isinstance(err, InferError):
        return _error(err)
    return error_response(400, str(err))


def _parse_json(body) -> dict:
    try:
        data = json.loads(bytes(body))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InferError(f"malformed JSON in request body: {err}") from None
    if not isinstance(data, dict):
        raise InferError("request body must be a JSON object")
    return data


def _split_body(http: HttpRequest) -> tuple[dict, memoryview]:
    body = http.body
    length = http.headers.get(HEADER_LENGTH)
    if length is None:
        return _parse_json(body), memoryview(b"")
    try:
        n = int(length)
    except ValueError:
        raise InferError(f"invalid Inference-Header-Content-Length '{length}'") from None
    if n < 0 or n > len(body):
        raise InferError(
            f"Inference-Header-Content-Length {n} exceeds the request body of {len(body)} bytes"
        )
    view = memoryview(body)
    return _parse_json(view[:n]), view[n:]


def _decode_inputs(header: dict, binary: memoryview) -> tuple[dict, dict]:
    inputs: dict[str, np.ndarray] = {}
    wire_types: dict[str, str] = {}
    offset = 0
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise InferError("inference request has no 'inputs'")
    for spec in specs:
        try:
            name, wire, shape = spec["name"], spec["datatype"], tuple(int(d) for d in spec["shape"])
        except (KeyError, TypeError, ValueError):
            raise InferError("each input needs 'name', 'datatype' and an integer 'shape'") from None
        if name in inputs:
            raise InferError(f"input '{name}' is given twice")
        try:
            wire_to_numpy(wire)
        except ValueError:
            raise InferError(f"input '{name}' has unknown datatype '{wire}'") from None
        if any(d < 0 for d in shape):
            raise InferError(f"input '{name}' has a negative dimension in shape {list(shape)}")
        size = (spec.get("parameters") or {}).get("binary_data_size")
        try:
            if size is not None:
                size = int(size)
                if offset + size > len(binary):
                    raise InferError(
                        f"unexpected end of binary data for input '{name}': needs {size} bytes, "
                        f"{len(binary) - offset} remain"
                    )
                array = tensor_from_bytes(binary[offset : offset + size], wire, shape)
                offset += size
            elif "data" in spec:
                array = _from_json_data(spec["data"], wire, shape)
            else:
                raise InferError(f"input '{name}' has neither 'data' nor binary data")
        except ValueError as err:
            raise InferError(f"input '{name}': {err}") from None
        inputs[name] = array
        wire_types[name] = wire
    if offset != len(binary):
        raise InferError(f"{len(binary) - offset} unexpected bytes after the binary input data")
    return inputs, wire_types


def _from_json_data(data, wire: str, shape: tuple[int, ...]) -> np.ndarray:
    flat = np.asarray(data, dtype=np.object_ if wire == "BYTES" else None).ravel()
    count = int(np.prod(shape)) if shape else 1
    if flat.size != count:
        raise ValueError(f"shape {list(shape)} needs {count} values, 'data' has {flat.size}")
    if wire == "BYTES":
        out = np.empty(count, dtype=np.object_)
        out[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
        return out.reshape(shape)
    try:
        return flat.astype(wire_to_numpy(wire)).reshape(shape)
    except (TypeError, ValueError) as err:
        raise ValueError(f"'data' does not convert to {wire}: {err}") from None


def _encode_outputs(model, request_id, outputs: dict, spec, binary_default: bool) -> HttpResponse:
    if spec:
        wanted = [(o["name"], (o.get("parameters") or {})) for o in spec]
    else:
        wanted = [(name, {}) for name in outputs]
    entries, blobs = [], []
    for name, params in wanted:
        if name not in outputs:
            return error_response(500, f"model '{model.name}' did not produce output '{name}'")
        array = outputs[name]
        wire = numpy_to_wire(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": wire, "shape": list(array.shape)}
        if params.get("binary_data", binary_default):
            blob = tensor_to_bytes(array, wire)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif wire == "BYTES":
            entry["data"] = [
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in array.ravel()
            ]
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    header: dict[str, Any] = {
        "model_name": model.name,
        "model_version": str(model.version),
        "outputs": entries,
    }
    if request_id:
        header["id"] = request_id
    head = json.dumps(header, separators=(",", ":")).encode()
    if not blobs:
        return HttpResponse(200, [head])
    return HttpResponse(
        200,
        [head, *blobs],
        content_type="application/octet-stream",
        headers=[("Inference-Header-Content-Length", str(len(head)))],
    )
