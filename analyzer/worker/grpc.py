"""Triton's `inference.GRPCInferenceService`: the calls, written as grpc.aio-style coroutines.

`grpc_server.GrpcServer` serves them on the worker's event loop: ModelInfer through
`prepare`/`encode`, the rest as coroutines. HTTP and gRPC share the ModelManager, so validation,
scheduling, statistics and errors are the same. grpc_messages.py converts between the messages
and the worker's values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from analyzer import __version__
from analyzer.worker import offload
from analyzer.worker.errors import InferError, Status
from analyzer.worker.grpc_layouts import Layouts, varint
from analyzer.worker.grpc_messages import (
    MalformedRequest,
    decode_inputs,
    encode_outputs,
    load_params,
    param_value,
    set_parameters,
    tensor_region,
)
from analyzer.worker.grpc_stream import answer_stream
from analyzer.worker.http import RestApi, server_metadata
from analyzer.worker.limits import Limits
from analyzer.worker.manager import ModelManager, Served
from analyzer.worker.names import check_model_name
from analyzer.worker.offload import PendingInput
from analyzer.worker.params import natural_param, sequence_flags, sequence_param
from analyzer.worker.request import (
    InferRequest,
    OnDone,
    OnResponse,
    Outputs,
    response_parameters,
)
from analyzer.worker.restrict import Restrictions
from analyzer.worker.shm import CUDA_UNAVAILABLE, SharedMemoryRegistry
from analyzer.worker.validate import check_once

if TYPE_CHECKING:
    from analyzer.worker.grpc_state import Inbox, Metadata

# The protobuf messages are untyped (tritonclient ships no stubs): requests and responses are Any.


class CallContext(Protocol):
    """What the coroutines use of a call's context (grpc.aio's, or grpc_calls._Context)."""

    def invocation_metadata(self) -> Metadata | None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...


class InferenceService:
    """Every RPC first checks its restricted-API category (Triton's), then the model name.

    The methods are named as GRPCInferenceService's; grpc_calls.UNARY_METHODS lists the unary ones
    served (a method not there is answered UNIMPLEMENTED by the transport).
    """

    def __init__(
        self,
        manager: ModelManager,
        api: RestApi | None,
        restrictions: Restrictions | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.manager = manager
        self.api = api
        # one registry for both protocols, as Triton's
        self.shm = api.shm if api is not None else SharedMemoryRegistry()
        self.limits = limits or Limits()
        # serialized response heads by output layout (see encode_bytes); bounded
        self._heads: dict[tuple[Any, ...], bytes] = {}
        self.layouts = Layouts()  # repeated ModelInfer requests, parsed once
        self.restrictions = restrictions or Restrictions()
        self._rules = self.restrictions.rules
        meta = server_metadata(__version__)
        self.metadata = pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    def refusal(self, category: str, metadata: Metadata | None) -> str | None:
        """Why a call of `category` with this invocation metadata is refused, or None."""
        if category not in self._rules:  # the metadata is only read when it matters
            return None
        text = {k: v for k, v in metadata or () if isinstance(v, str)}
        return self.restrictions.check(category, text)

    async def _allow(self, category: str, context: CallContext) -> None:
        """Triton answers a restricted call without its metadata key UNAVAILABLE."""
        message = self.refusal(category, context.invocation_metadata())
        if message is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    @staticmethod
    async def _name(name: str, context: CallContext) -> None:
        try:
            check_model_name(name)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)

    # -- health and metadata ------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: CallContext) -> Any:
        await self._allow("health", context)
        # without the REST API (in-process tests and benchmarks) the service is as live as its loop
        return pb.ServerLiveResponse(live=self.api.live if self.api is not None else True)

    async def ServerReady(self, request: Any, context: CallContext) -> Any:
        await self._allow("health", context)
        ready = self.api.server_ready() if self.api is not None else self.manager.all_ready()
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(self, request: Any, context: CallContext) -> Any:
        await self._allow("health", context)  # Triton files model readiness under health
        await self._name(request.name, context)
        ready = self.manager.model_ready(request.name, request.version)
        if not isinstance(ready, bool):  # a python model's is_ready() is asked
            ready = await ready
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: CallContext) -> Any:
        await self._allow("metadata", context)
        return self.metadata

    async def ModelMetadata(self, request: Any, context: CallContext) -> Any:
        await self._allow("metadata", context)
        await self._name(request.name, context)
        model = await self._get(request.name, request.version, context)
        meta = model.metadata(self.manager.versions(request.name))
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: CallContext) -> Any:
        await self._allow("model-config", context)
        await self._name(request.name, context)
        model = await self._get(request.name, request.version, context)
        return pb.ModelConfigResponse(config=model.config)

    async def ModelStatistics(self, request: Any, context: CallContext) -> Any:
        await self._allow("statistics", context)
        if request.name:
            await self._name(request.name, context)
            if request.version:
                models = [await self._get(request.name, request.version, context)]
            else:
                await self._get(request.name, "", context)
                models = [self.manager.get(request.name, str(v))
                          for v in self.manager.versions(request.name)]  # fmt: skip
        else:
            models = self.manager.loaded()
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(
            {"model_stats": [m.stats.as_dict() for m in models]}, response,
            ignore_unknown_fields=True,
        )  # fmt: skip
        return response

    async def _get(self, name: str, version: str, context: CallContext) -> Served:
        try:
            return self.manager.get(name, version)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)

    # -- repository -----------------------------------------------------------------------------
    async def RepositoryIndex(self, request: Any, context: CallContext) -> Any:
        await self._allow("model-repository", context)
        rows = self.manager.index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows]
        )

    # -- shared memory (Triton's extension; one registry with HTTP) -----------------------------
    async def SystemSharedMemoryStatus(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        try:
            rows = self.shm.status(request.name)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(
            regions={row["name"]: status(**row) for row in rows})

    async def SystemSharedMemoryRegister(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        try:
            self.shm.register(request.name, request.key, request.offset, request.byte_size)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        self.shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, CUDA_UNAVAILABLE)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: CallContext) -> Any:
        await self._allow("shared-memory", context)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def RepositoryModelLoad(self, request: Any, context: CallContext) -> Any:
        await self._allow("model-repository", context)
        await self._name(request.model_name, context)
        try:
            config, files = load_params(request)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)
        await self._repository_job(
            lambda: self.manager.load(request.model_name, config, files or None), context
        )
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: CallContext) -> Any:
        await self._allow("model-repository", context)
        await self._name(request.model_name, context)
        param = request.parameters.get("unload_dependents")
        dependents = param is not None and param.WhichOneof("parameter_choice") == "bool_param"
        dependents = dependents and param.bool_param
        await self._repository_job(
            lambda: self.manager.unload(request.model_name, dependents), context
        )
        return pb.RepositoryModelUnloadResponse()

    async def _repository_job(self, job: Callable[[], object], context: CallContext) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, job)
        except InferError as err:
            await context.abort(err.status.grpc, err.message)
        except Exception as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    # -- inference ------------------------------------------------------------------------------
    async def ModelStreamInfer(
        self, request_iterator: Inbox, context: CallContext
    ) -> AsyncIterator[list[bytes]]:
        """Each request gets one response message, an error one included, in completion order
        (grpc_stream.py). `request_iterator` is the stream's Inbox of serialized requests; the
        answers are serialized ModelStreamInferResponses, as parts to join."""
        await self._allow("inference", context)
        async for parts in answer_stream(self, request_iterator):
            yield parts

    def prepare(
        self, request: Any, on_done: OnDone, arrival: int = 0
    ) -> tuple[Served, InferRequest, list[PendingInput] | None]:
        """The model, the request to submit and its inputs left to decode (offload.py);
        InferError for anything malformed."""
        arrival = arrival or time.perf_counter_ns()
        check_model_name(request.model_name)
        model = self.manager.get(request.model_name, request.model_version)
        try:
            inputs, wire_types, pending = decode_inputs(request, self.shm, model.validator)
        except InferError:
            raise
        except Exception as err:  # a malformed request must not reach the client as UNKNOWN
            raise InferError(f"malformed inference request: {err}") from None
        for output in request.outputs:  # regions named for outputs exist before the model runs
            if output.parameters and (
                region := tensor_region(output, f"output '{output.name}'")
            ) is not None:
                self.shm.check(*region)
        params = {k: param_value(v) for k, v in request.parameters.items()}
        return model, InferRequest(
            model_name=request.model_name,
            inputs=inputs,
            wire_types=wire_types,
            requested_outputs=[o.name for o in request.outputs] or None,
            on_done=on_done,
            id=request.id,
            parameters=params,
            arrival_ns=arrival,
            priority=natural_param(params, "priority"),
            timeout_us=natural_param(params, "timeout"),
            correlation_id=sequence_param(params),
            flags=sequence_flags(params),
        ), pending

    def submit_bytes(
        self, data: bytes, on_done: OnDone, on_response: OnResponse | None = None
    ) -> tuple[Served, Any, tuple[str, ...] | None, InferRequest]:
        """Parse, check and queue a serialized ModelInferRequest (`on_response`: a stream's
        callback for a decoupled model's responses).

        Returns the model, the request's fields an answer needs (model, requested outputs; no
        tensors; a kept layout's have no id: the queued request's `id` is the one to answer
        with), the requested outputs' names (None: read them from the fields) and the queued
        request. Raises InferError before anything is queued.
        """
        arrival = time.perf_counter_ns()
        layouts = self.layouts
        matched = layouts.match(data)
        if matched is None:
            try:
                fields = pb.ModelInferRequest.FromString(data)
            except DecodeError as err:
                raise MalformedRequest(str(err)) from None
            model, request, pending = self.prepare(fields, on_done, arrival)
            request.on_response = on_response
            if pending is None and not offload.waiting:  # the usual case
                model.submit(request)  # validates against the model: may raise InferError
            else:
                offload.submit(model, request, pending)
            layouts.learn(data, fields, request)
            return model, fields, None, request
        layout, base, request_id = matched
        model = self.manager.get(layout.model_name, layout.model_version)
        request = layout.request(data, on_done, arrival, base, request_id)
        request.on_response = on_response
        check_once(model.validator, request, layout.checked)
        if offload.waiting:
            offload.submit(model, request, None, checked=True)
        else:
            model.submit(request, checked=True)
        return model, layout.fields, layout.output_names, request

    def encode_bytes(self, model: Served, request: Any, outputs: Outputs) -> bytes:
        """The serialized ModelInferResponse of a unary call (see encode_parts)."""
        return b"".join(self.encode_parts(model, request, outputs))

    def encode_parts(
        self,
        model: Served,
        request: Any,
        outputs: Outputs,
        requested: tuple[str, ...] | None = None,
        request_id: str | None = None,
    ) -> list[bytes]:
        """The serialized ModelInferResponse of a unary call, as parts to concatenate.

        Everything but the id and the raw output bytes depends only on the model, the requested
        outputs (`requested`: their names when the caller knows them) and the outputs' names,
        types and shapes, which repeat call after call: that head is serialized once per layout,
        and each answer appends its id (`request_id`, else the request's) and raw_output_contents
        fields to it (protobuf merges concatenated fields, in any order).
        """
        if request_id is None:
            request_id = request.id
        parameters = response_parameters(outputs)
        if parameters:  # the model's response parameters: no head to keep per layout
            names = requested if requested is not None else [o.name for o in request.outputs]
            response = self.encode(model, request_id, outputs, list(names) or None)
            set_parameters(response.parameters, parameters)
            return [response.SerializeToString()]
        if requested is None:  # the general path (a kept layout never has output parameters)
            requested = tuple(o.name for o in request.outputs)
            if any(o.parameters for o in request.outputs):  # outputs into shared memory, maybe
                regions = {o.name: r for o in request.outputs
                           if (r := tensor_region(o, f"output '{o.name}'"))}  # fmt: skip
                return [encode_outputs(model, request_id, outputs, list(requested) or None,
                                       regions, self.shm).SerializeToString()]  # fmt: skip
        key = (model.name, model.version, requested,
               *[(n, a.dtype, a.shape) for n, a in outputs.items()])  # fmt: skip
        head = self._heads.get(key)
        if head is None:
            response = self.encode(model, "", outputs, list(requested) or None)
            if any(o.datatype in ("BYTES", "BF16") for o in response.outputs):
                response.id = request_id
                return [response.SerializeToString()]
            del response.raw_output_contents[:]
            head = response.SerializeToString()
            if len(self._heads) >= _MAX_HEADS:
                del self._heads[next(iter(self._heads))]
            self._heads[key] = head
        parts = [head]
        if request_id:
            ident = request_id.encode()
            parts.append(_ID_TAG + varint(len(ident)) + ident)
        for name in requested or outputs:
            blob = outputs[name].tobytes()  # the head's key holds a fixed-size dtype: C order
            parts += (_RAW_OUTPUT_TAG + varint(len(blob)), blob)
        return parts

    @staticmethod
    def encode(
        model: Served, request_id: str, outputs: Outputs, requested: list[str] | None
    ) -> Any:
        try:
            return encode_outputs(model, request_id, outputs, requested)
        except InferError:
            raise
        except Exception as err:  # the model's fault, but the client still gets an answer
            raise InferError(
                f"model '{model.name}' returned outputs that cannot be sent: {err}",
                Status.INTERNAL,
            ) from None


_MAX_HEADS = 256
_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents: field 6, length-delimited
_ID_TAG = b"\x1a"  # ModelInferResponse.id: field 3, length-delimited
