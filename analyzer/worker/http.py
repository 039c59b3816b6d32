"""KServe v2 REST API with Triton's extensions, over the httptools transport.

Routes: health, server/model metadata, model ready, model config, statistics, infer (JSON tensors
and the binary tensor data extension), and the repository API (index, load, unload).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

from analyzer.config.model_config import model_config_to_dict
from analyzer.datatypes import (
    numpy_to_wire,
    shape_count,
    tensor_from_bytes,
    tensor_to_bytes,
    wire_to_numpy,
)
from analyzer.worker.errors import InferError, Status
from analyzer.worker.http_server import HttpRequest, HttpResponse, Respond, error_response
from analyzer.worker.manager import ModelManager
from analyzer.worker.names import check_model_name
from analyzer.worker.request import InferRequest
from analyzer.worker.restrict import Restrictions
from analyzer.worker.validate import check_once

HEADER_LENGTH = "inference-header-content-length"
JSON_TYPE = "application/json"
_BINARY_TYPE = "application/octet-stream"
# /v2/models/<name>[/versions/<v>]/<action> -> Triton's restricted-API category
_MODEL_ACTIONS = {
    "infer": "inference",
    "": "metadata",
    "ready": "health",  # Triton files model readiness under health, not metadata
    "config": "model-config",
    "stats": "statistics",
}


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


class _Refused(Exception):
    """A restricted API called without its header: Triton answers 403."""


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
        self._rules = self.restrictions.rules  # per request: one dict lookup when unrestricted
        self.loop = loop
        self.metadata = _json(server_metadata(version))
        self._plans = _Plans()
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
                self._allow("metadata", request)
                respond(self.metadata)
            elif parts[1] == "health" and len(parts) == 3:
                self._allow("health", request)
                ok = self.live if parts[2] == "live" else self.ready and parts[2] == "ready"
                respond(HttpResponse(200 if ok else 400))
            elif parts[1] == "repository":
                self._allow("model-repository", request)
                self._repository_route(request, parts, respond)
            else:
                raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
        except InferError as err:
            respond(_error(err))
        except _Refused as err:
            respond(error_response(403, str(err)))

    def _allow(self, category: str, request: HttpRequest) -> None:
        if category in self._rules:
            message = self.restrictions.check(category, request.headers)
            if message is not None:
                raise _Refused(message)

    # -- /v2/models/... ---------------------------------------------------------------------
    def _model_route(self, request: HttpRequest, parts: list[str], respond: Respond) -> None:
        if parts[2] == "stats" and len(parts) == 3:
            self._allow("statistics", request)
            respond(_json({"model_stats": [m.stats.as_dict() for m in self.manager.loaded()]}))
            return
        version = ""
        rest = parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = rest[0] if rest else ""
        category = _MODEL_ACTIONS.get(action)
        if category is None or len(rest) > 1:
            raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
        self._allow(category, request)
        name = _model_name(parts[2])
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
            ready = body.get("ready", False)
            if not isinstance(ready, bool):
                raise InferError(f"'ready' must be true or false, got {show_value(ready)}")
            respond(_json(self.manager.index(ready)))
            return
        if len(parts) == 5 and parts[2] == "models" and request.method == "POST":
            name, action = _model_name(parts[3]), parts[4]
            params = _object(body.get("parameters"), "'parameters'")
            if action == "load":
                config = params.get("config")
                if config is not None and not isinstance(config, str):
                    raise InferError(
                        f"load parameter 'config' must be a JSON string, got {show_value(config)}"
                    )
                files = {k: v for k, v in params.items() if k.startswith("file:")}
                for key, content in files.items():
                    if not isinstance(content, str):
                        raise InferError(f"load parameter '{key}' must be a base64 string")
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
        plan, header, binary = self._plans.plan(http)
        inputs, wire_types = _decode_inputs(plan, header, binary)
        request_id = plan.request_id
        outputs_spec, binary_default, heads = plan.outputs, plan.binary_default, plan.heads
        loop = self.loop

        def finish(outputs, error) -> None:
            if error is not None:
                status = error.status.http if isinstance(error, InferError) else 500
                respond(error_response(status, str(error)))
                return
            try:
                response = _encode_outputs(
                    model, request_id, outputs, outputs_spec, binary_default, heads
                )
            except Exception as err:  # the model's fault, but the client still gets an answer
                response = error_response(
                    500, f"model '{model.name}' returned outputs that cannot be sent: {err}"
                )
            respond(response)

        def on_done(outputs, error) -> None:
            loop.call_soon_threadsafe(finish, outputs, error)

        request = InferRequest(
            model_name=name,
            inputs=inputs,
            wire_types=wire_types,
            requested_outputs=plan.requested,
            on_done=on_done,
            id=request_id,
            parameters=plan.params,
            arrival_ns=arrival,
            priority=plan.priority,
            timeout_us=plan.timeout,
            correlation_id=plan.correlation,
        )
        http.on_disconnect(request.cancel)
        if plan.checked is not None:  # a kept plan: its layout is checked once per model version
            check_once(model.validator, request, plan.checked)
            model.submit(request, checked=True)
            return
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
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an int over 4300 digits
        raise InferError(f"malformed JSON in request body: {err}") from None
    except RecursionError:
        raise InferError("malformed JSON in request body: nested too deeply") from None
    if not isinstance(data, dict):
        raise InferError("request body must be a JSON object")
    return data


_CHECKED_NAMES: set[str] = set()  # URL segments that passed check_model_name (bounded)


def _model_name(segment: str) -> str:
    """The model name in a URL segment, percent-decoded the way clients encode it, checked."""
    if segment in _CHECKED_NAMES:
        return segment
    name = check_model_name(unquote(segment) if "%" in segment else segment)
    if name == segment and len(_CHECKED_NAMES) < 1024:
        _CHECKED_NAMES.add(segment)
    return name


def show_value(value: Any) -> str:
    """A client's value for an error message, short enough to stay one line."""
    if isinstance(value, str | int | float | None):
        return json.dumps(value)[:64]
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _object(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferError(f"{what} must be a JSON object, got {show_value(value)}")
    return value


def flag_param(params: dict, key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InferError(f"parameter '{key}' must be true or false, got {show_value(value)}")
    return value


def natural_param(params: dict, key: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferError(
            f"parameter '{key}' must be a non-negative integer, got {show_value(value)}"
        )
    return value


def sequence_param(params: dict) -> int | str:
    value = params.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InferError(
            f"parameter 'sequence_id' must be an integer or a string, got {show_value(value)}"
        )
    return value


def _outputs(spec: Any) -> list[dict] | None:
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
    return spec


@dataclass(slots=True)
class _InputPlan:
    name: str
    wire: str
    shape: tuple[int, ...]
    count: int
    size: int | None  # binary_data_size; None: the values are the JSON 'data' of entry `index`
    index: int


@dataclass(slots=True)
class _Plan:
    """What a request's JSON header asks for, checked once.

    Clients repeat the same header on every call (perf_analyzer, tritonclient with fixed shapes),
    so a header whose inputs are all binary is parsed and checked once and its plan reused, with
    the response heads it has produced. The dicts and lists here are shared by the requests that
    reuse the plan and are only read.
    """

    inputs: list[_InputPlan]
    outputs: list[dict] | None
    requested: list[str] | None
    params: dict
    binary_default: bool
    request_id: str
    priority: int
    timeout: int
    correlation: int | str
    heads: dict | None  # response heads by output layout; None when the plan is not kept
    checked: dict | None  # batch size by the model versions' validators that accepted it


class _Plans:
    """Plans of recent request headers: bounded in count and key size, so a client that sends
    a new header every time costs a dict lookup and nothing more."""

    MAX_PLANS = 64
    MAX_KEY_BYTES = 4096
    MAX_HEADS = 16  # response layouts per plan

    def __init__(self) -> None:
        self.plans: dict[bytes, _Plan] = {}

    def plan(self, http: HttpRequest) -> tuple[_Plan, dict | None, memoryview]:
        """(plan, the parsed header when it was parsed now, the binary part of the body)."""
        body = http.body
        length = http.headers.get(HEADER_LENGTH)
        if length is None:
            header = _parse_json(body)
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
        header = _parse_json(view[:n])
        plan = _make_plan(header, keep=key is not None)
        if plan.heads is not None:
            plans = self.plans
            if len(plans) >= self.MAX_PLANS:
                del plans[next(iter(plans))]  # the oldest goes
            plans[key] = plan
        return plan, header, view[n:]


def _make_plan(header: dict, keep: bool) -> _Plan:
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
    params = _object(header.get("parameters"), "request 'parameters'")
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
        heads={} if keep else None,
        checked={} if keep else None,
    )


def _decode_inputs(plan: _Plan, header: dict | None, binary: memoryview) -> tuple[dict, dict]:
    """The input arrays: views of the binary part, or converted JSON 'data' (header given)."""
    inputs: dict[str, np.ndarray] = {}
    wire_types: dict[str, str] = {}
    offset = 0
    available = len(binary)
    for p in plan.inputs:
        name, size = p.name, p.size
        try:
            if size is not None:
                if offset + size > available:
                    raise InferError(
                        f"unexpected end of binary data for input '{name}': needs {size} bytes, "
                        f"{available - offset} remain"
                    )
                array = tensor_from_bytes(binary[offset : offset + size], p.wire, p.shape, p.count)
                offset += size
            else:
                assert header is not None  # plans with JSON data are never kept
                array = _from_json_data(header["inputs"][p.index]["data"], p.wire, p.shape, p.count)
        except ValueError as err:
            raise InferError(f"input '{name}': {err}") from None
        inputs[name] = array
        wire_types[name] = p.wire
    if offset != available:
        raise InferError(f"{available - offset} unexpected bytes after the binary input data")
    return inputs, wire_types


def _input_spec(spec: Any) -> tuple[str, str, tuple, dict]:
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


def _from_json_data(data, wire: str, shape: tuple[int, ...], count: int) -> np.ndarray:
    """JSON 'data' as an array; only strings for BYTES and only numbers otherwise."""
    try:
        flat = np.asarray(data, dtype=np.object_ if wire == "BYTES" else None).ravel()
    except (ValueError, TypeError, OverflowError) as err:
        raise ValueError(f"'data' is not a (nested) list of values: {err}") from None
    if flat.size != count:
        raise ValueError(f"shape {list(shape)} needs {count} values, 'data' has {flat.size}")
    if wire == "BYTES":
        # bytes(n) of a number would allocate n bytes: elements must be strings
        if not all(isinstance(v, str) for v in flat):
            raise ValueError("'data' of a BYTES input must hold strings")
        out = np.empty(count, dtype=np.object_)
        out[:] = [v.encode() for v in flat]
        return out.reshape(shape)
    if flat.dtype.kind not in "biuf":
        raise ValueError(f"'data' of a {wire} input must hold numbers in range")
    try:
        return flat.astype(wire_to_numpy(wire)).reshape(shape)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"'data' does not convert to {wire}: {err}") from None


def _encode_outputs(
    model, request_id, outputs: dict, spec, binary_default: bool, heads: dict | None = None
) -> HttpResponse:
    """The response; with `heads` (a kept plan's), an all-binary head is built once per layout."""
    key = None
    if heads is not None:
        key = (model.name, model.version, *((n, a.dtype, a.shape) for n, a in outputs.items()))
        cached = heads.get(key)
        if cached is not None:
            head, sent, headers = cached
            blobs = [tensor_to_bytes(outputs[name], wire) for name, wire in sent]
            return HttpResponse(200, [head, *blobs], _BINARY_TYPE, headers)
    if spec:
        wanted = [(o["name"], (o.get("parameters") or {})) for o in spec]
    else:
        wanted = [(name, {}) for name in outputs]
    entries, blobs, sent = [], [], []
    for name, params in wanted:
        if name not in outputs:
            return error_response(500, f"model '{model.name}' did not produce output '{name}'")
        array = outputs[name]
        wire = numpy_to_wire(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": wire, "shape": list(array.shape)}
        if wire == "BF16":  # JSON has no bfloat16; its values are exact as float32
            array = array.astype(np.float32)
        if params.get("binary_data", binary_default):
            blob = tensor_to_bytes(array, wire)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
            sent.append((name, wire))
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
    headers = [("Inference-Header-Content-Length", str(len(head)))]
    # a head holds no values when every output is binary and of a fixed size per element
    if key is not None and len(sent) == len(entries) and all(
        wire not in ("BYTES", "BF16") for _, wire in sent
    ):
        if len(heads) >= _Plans.MAX_HEADS:
            del heads[next(iter(heads))]
        heads[key] = (head, sent, headers)
    return HttpResponse(200, [head, *blobs], _BINARY_TYPE, headers)
