"""KServe v2 REST API with Triton's extensions, over the httptools transport.

Routes: health, server/model metadata, model ready, model config, statistics, infer (JSON tensors
and the binary tensor data extension), and the repository API (index, load, unload). The infer
body's tensors -- header plans, decoded inputs, encoded outputs -- are http_tensors.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from analyzer.config.model_config import model_config_to_dict
from analyzer.worker import offload
from analyzer.worker.errors import InferError, Status
from analyzer.worker.http_message import (
    Handler,
    HttpRequest,
    HttpResponse,
    Respond,
    error_response,
)
from analyzer.worker.http_tensors import HEADER_LENGTH, _decode_inputs, _encode_outputs, _Plans
from analyzer.worker.json_process import PROCESS_JSON_BYTES, parse_in_child
from analyzer.worker.limits import HeldBytes
from analyzer.worker.manager import ModelManager, Served
from analyzer.worker.names import check_model_name
from analyzer.worker.params import _object, _parse_json, show_value
from analyzer.worker.request import InferRequest, Outputs
from analyzer.worker.restrict import Restrictions
from analyzer.worker.shm import CUDA_UNAVAILABLE, SharedMemoryRegistry, region_params
from analyzer.worker.validate import check_once

log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
# a shared-memory register body is a key, an offset and a size: tens of bytes, parsed on the loop
SHM_BODY_BYTES = 64 * 1024
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
            "system_shared_memory",
            "cuda_shared_memory",
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
        shm: SharedMemoryRegistry | None = None,
    ):
        self.manager = manager
        self.shm = shm or SharedMemoryRegistry()
        self.restrictions = restrictions or Restrictions()
        self._rules = self.restrictions.rules  # per request: one dict lookup when unrestricted
        self.loop = loop
        self.metadata = _json(server_metadata(version))
        self._plans = _Plans()
        self.live = True
        self.ready = False
        self.strict_readiness = True  # tritonserver's --strict-readiness
        self._repository = _Repository(manager)  # large repository bodies' turn, offloaded

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
                live = parts[2] == "live"
                ok = self.live if live else self.server_ready() and parts[2] == "ready"
                respond(HttpResponse(200 if ok else 400))
            elif parts[1] == "repository":
                self._allow("model-repository", request)
                self._repository_route(request, parts, respond)
            elif parts[1] in ("systemsharedmemory", "cudasharedmemory"):
                self._allow("shared-memory", request)
                respond(self._shm_route(request, parts))
            else:
                raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
        except InferError as err:
            respond(_error(err))
        except _Refused as err:
            respond(error_response(403, str(err)))

    def server_ready(self) -> bool:
        """Started and, with strict readiness (Triton's default), every model servable: none
        failed to load, none still loading."""
        return self.ready and (not self.strict_readiness or self.manager.all_ready())

    def _allow(self, category: str, request: HttpRequest) -> None:
        if category in self._rules:
            message = self.restrictions.check(category, request.headers)
            if message is not None:
                raise _Refused(message)

    # -- /v2/models/... ---------------------------------------------------------------------
    def route(self, request: HttpRequest) -> Handler | None:
        """The handler for requests whose head is byte for byte `request`'s (the transport's
        repeated heads): an inference call, routed and allowed once, since routing and the
        restriction check read only the head. None for anything else."""
        parts = request.path.strip("/").split("/")
        if request.method != "POST" or len(parts) < 4 or parts[:2] != ["v2", "models"]:
            return None
        try:
            action, name, version = self._model_action(request, parts)
        except (InferError, _Refused):
            return None
        if action != "infer":
            return None

        def infer(http: HttpRequest, respond: Respond) -> None:
            try:
                self._infer(http, name, version, respond)
            except InferError as err:
                respond(_error(err))

        return infer

    def _model_action(self, request: HttpRequest, parts: list[str]) -> tuple[str, str, str]:
        """/v2/models/<name>[/versions/<v>][/<action>]: (action, name, version), allowed."""
        version = ""
        rest = parts[3:]
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = rest[0] if rest else ""
        category = _MODEL_ACTIONS.get(action)
        if category is None or len(rest) > 1:
            raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)
        self._allow(category, request)
        return action, _model_name(parts[2]), version

    def _model_route(self, request: HttpRequest, parts: list[str], respond: Respond) -> None:
        if parts[2] == "stats" and len(parts) == 3:
            self._allow("statistics", request)
            respond(_json({"model_stats": [m.stats.as_dict() for m in self.manager.loaded()]}))
            return
        action, name, version = self._model_action(request, parts)
        if action == "infer" and request.method == "POST":
            self._infer(request, name, version, respond)
        elif action == "" and request.method == "GET":
            model = self.manager.get(name, version)
            respond(_json(model.metadata(self.manager.versions(name))))
        elif action == "ready":
            ready = self.manager.model_ready(name, version)
            if isinstance(ready, bool):
                respond(HttpResponse(200 if ready else 400))
            else:  # a python model's is_ready() is asked; the loop goes on meanwhile
                asyncio.ensure_future(ready).add_done_callback(
                    lambda done: respond(HttpResponse(
                        200 if not done.cancelled() and done.exception() is None
                        and done.result() else 400)))  # fmt: skip
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
        """A load's body may carry a config and model files (base64 'file:' parameters: an
        ONNX model of tens of MiB is a fair upload), so it is not capped below the body cap;
        one of PROCESS_JSON_BYTES or more is parsed as a large infer body is: in a child
        process, from the offload thread, its bytes held against --max-queued-size (a 14 MiB
        body parsed on the loop kept every client, health checks included, waiting 4.6 s)."""
        if len(request.body) < PROCESS_JSON_BYTES:
            self._repository_call(request, parts, respond,
                                  _parse_json(request.body) if request.body else {})  # fmt: skip
            return
        loop = self.loop

        def parse() -> None:
            try:
                body: dict[str, Any] | InferError = parse_in_child(request.body)
            except InferError as err:
                body = err
            except Exception as err:  # a bug must still answer the request
                log.exception("parsing a large repository request failed")
                body = InferError(f"internal error: {err}", Status.INTERNAL)
            loop.call_soon_threadsafe(self._repository_parsed, request, parts, respond, body)

        offload.defer(self._repository, len(request.body), parse)

    def _repository_parsed(self, request: HttpRequest, parts: list[str], respond: Respond,
                           body: dict[str, Any] | InferError) -> None:  # fmt: skip
        """On the loop again: a large repository body parsed (or its parser's error)."""
        try:
            if isinstance(body, InferError):
                raise body
            self._repository_call(request, parts, respond, body)
        except InferError as err:
            respond(_error(err))

    def _repository_call(self, request: HttpRequest, parts: list[str], respond: Respond,
                         body: dict[str, Any]) -> None:  # fmt: skip
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
                dependents = params.get("unload_dependents", False)
                if not isinstance(dependents, bool):
                    raise InferError(f"unload parameter 'unload_dependents' must be true or "
                                     f"false, got {show_value(dependents)}")  # fmt: skip
                job = lambda: self.manager.unload(name, dependents)  # noqa: E731
            else:
                raise InferError(f"no route for POST {request.path}", Status.NOT_FOUND)
            future = self.loop.run_in_executor(None, job)
            future.add_done_callback(lambda f: respond(_done_response(f)))
            return
        raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)

    # -- /v2/systemsharedmemory/..., /v2/cudasharedmemory/... ---------------------------------
    def _shm_route(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        """Triton's shared-memory extension: [region/<name>/]status (GET), region/<name>/register
        and [region/<name>/]unregister (POST). CUDA regions need a GPU build: none here."""
        size = len(request.body)
        if size > SHM_BODY_BYTES:  # a key, an offset, a size: parsed on the loop
            return error_response(413, f"a shared-memory request body of {size} bytes exceeds "
                                       f"its limit of {SHM_BODY_BYTES} bytes")  # fmt: skip
        system = parts[1] == "systemsharedmemory"
        name = ""
        rest = parts[2:]
        if len(rest) == 3 and rest[0] == "region":
            name, rest = unquote(rest[1]), rest[2:]
        action = rest[0] if len(rest) == 1 else ""
        if action == "status" and request.method == "GET":
            return _json(self.shm.status(name) if system else [])
        if action == "register" and name and request.method == "POST":
            if not system:
                raise InferError(CUDA_UNAVAILABLE, Status.UNSUPPORTED)
            body = _object(_parse_json(request.body) if request.body else {}, "register body")
            self.shm.register(name, body.get("key"), body.get("offset", 0),
                              body.get("byte_size"))  # fmt: skip
            return HttpResponse(200, [b"{}"])
        if action == "unregister" and request.method == "POST":
            if system:
                self.shm.unregister(name)
            return HttpResponse(200, [b"{}"])
        raise InferError(f"no route for {request.method} {request.path}", Status.NOT_FOUND)

    # -- infer --------------------------------------------------------------------------------
    def _infer(self, http: HttpRequest, name: str, version: str, respond: Respond,
               offloaded: Served | None = None, arrival: int = 0) -> None:  # fmt: skip
        """Parse, check and queue. A request whose JSON is large (~80 ms a MiB to parse) is
        handed to the offload thread, which calls this again with its model (`offloaded`):
        there pending BYTES are decoded in place and the model's order is already kept."""
        if offloaded is None:
            model = self.manager.get(name, version)
            arrival = time.perf_counter_ns()
            if len(http.body) >= offload.OFFLOAD_JSON_BYTES and _json_length(http) >= (
                offload.OFFLOAD_JSON_BYTES
            ):
                self._infer_later(http, name, model, arrival, respond)
                return
        else:
            model = offloaded
        plan, header, binary = self._plans.plan(http, offloaded is not None)
        inputs, wire_types, pending = _decode_inputs(plan, header, binary, self.shm,
                                                     model.validator)  # fmt: skip
        for spec in plan.outputs or ():  # regions named for outputs exist before the model runs
            if (region := region_params(spec.get("parameters") or {}, "")) is not None:
                self.shm.check(*region)
        request_id = plan.request_id
        outputs_spec, binary_default, heads = plan.outputs, plan.binary_default, plan.heads
        loop = self.loop

        def encode(outputs: Outputs | None, error: Exception | None) -> HttpResponse:
            if error is not None or outputs is None:  # (neither: a backend's bug, still answered)
                error = error or InferError("the model returned no outputs", Status.INTERNAL)
                status = error.status.http if isinstance(error, InferError) else 500
                return error_response(status, str(error))
            try:
                return _encode_outputs(
                    model, request_id, outputs, outputs_spec, binary_default, heads, self.shm
                )
            except InferError as err:  # an output's shared memory region: the client's
                return error_response(err.status.http, str(err))
            except Exception as err:  # the model's fault, but the client still gets an answer
                return error_response(
                    500, f"model '{model.name}' returned outputs that cannot be sent: {err}"
                )

        # on the thread that finished the request; a large answer is encoded there (offload.py)
        def on_done(outputs: Outputs | None, error: Exception | None) -> None:
            if outputs is not None and offload.heavy(outputs):
                loop.call_soon_threadsafe(respond, encode(outputs, error))
            else:
                loop.call_soon_threadsafe(_finish, respond, encode, outputs, error)

        request = InferRequest(
            name,
            inputs,
            wire_types,
            plan.requested,
            on_done,
            id=request_id,
            parameters=plan.params,
            arrival_ns=arrival,
            priority=plan.priority,
            timeout_us=plan.timeout,
            correlation_id=plan.correlation,
            flags=plan.flags,
            signature=plan.signature,
        )
        http.on_disconnect(request.cancel)
        if offloaded is not None:
            offload.decode(request, pending or [])
            model.submit(request)
            return
        if pending is None and not offload.waiting:  # the usual case
            if plan.checked is not None:  # a kept plan: its layout is checked once per model
                check_once(model.validator, request, plan.checked)
                model.submit(request, checked=True)
                return
            model.submit(request)
            return
        offload.submit(model, request, pending)

    def _infer_later(self, http: HttpRequest, name: str, model: Served, arrival: int,
                     respond: Respond) -> None:  # fmt: skip
        """`_infer` on the offload thread, in the model's order; its errors hop back here."""
        loop = self.loop

        def job() -> None:
            try:
                self._infer(http, name, "", respond, model, arrival)
            except InferError as err:
                loop.call_soon_threadsafe(respond, _error(err))
            except Exception as err:  # a bug must still answer the request
                log.exception("a large JSON request for model '%s' failed", name)
                loop.call_soon_threadsafe(respond, error_response(500, f"internal error: {err}"))

        offload.defer(model, len(http.body), job)


class _Repository:
    """The repository API as offload.defer sees it: large bodies parsed in arrival order, their
    bytes held against --max-queued-size (`held`) while they wait."""

    name = "the repository API"

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    @property
    def held(self) -> HeldBytes | None:
        return self.manager.held

    def submit(self, request: InferRequest, checked: bool = False) -> None:
        raise NotImplementedError  # only defer() is used: nothing is queued on the repository


def _json_length(http: HttpRequest) -> int:
    """The length of a request's JSON: its Inference-Header-Content-Length, else the body's
    (0 for a malformed length, which the parser answers)."""
    length = http.headers.get(HEADER_LENGTH)
    if length is None:
        return len(http.body)
    try:
        return int(length)
    except ValueError:
        return 0


def _finish(respond: Respond, encode: Callable[[Outputs | None, Exception | None], HttpResponse],
            outputs: Outputs | None, error: Exception | None) -> None:  # fmt: skip
    """On the loop: a request's answer, encoded and sent."""
    respond(encode(outputs, error))


def _done_response(future: asyncio.Future[Any]) -> HttpResponse:
    err = future.exception()
    if err is None:
        return HttpResponse(200, [b"{}"])
    if isinstance(err, InferError):
        return _error(err)
    return error_response(400, str(err))


_CHECKED_NAMES: set[str] = set()  # URL segments that passed check_model_name (bounded)


def _model_name(segment: str) -> str:
    """The model name in a URL segment, percent-decoded the way clients encode it, checked."""
    if segment in _CHECKED_NAMES:
        return segment
    name = check_model_name(unquote(segment) if "%" in segment else segment)
    if name == segment and len(_CHECKED_NAMES) < 1024:
        _CHECKED_NAMES.add(segment)
    return name
