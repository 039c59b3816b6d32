"""The gRPC front end on grpcio's core completion queue: ModelInfer without an event loop.

Why: grpc.aio spends about four times the CPU per call of one thread that polls the core's
completion queue itself and answers with one batch of operations (benchmarks/grpc_front_end.py),
so a profile over gRPC (Model Analyzer's default protocol) measured grpc.aio more than the model.
Here ModelInfer is received, parsed and submitted on the poller thread, and answered from the
thread that finishes the batch, with no hop through a loop. Every other call (health, metadata,
configuration, statistics, repository, ModelStreamInfer) runs the coroutines of
`InferenceService` on an asyncio loop thread through a small bridge, so validation, restricted
APIs and stream bounds stay written once.

`grpc._cython.cygrpc` is grpcio's own layer under `grpc.server`; pyproject pins the grpcio range
it was checked with, and the test suite drives every call through it.
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc._cython import cygrpc
from tritonclient.grpc import service_pb2 as pb

from analyzer.worker.errors import InferError
from analyzer.worker.grpc import InferenceService
from analyzer.worker.limits import Limits
from analyzer.worker.manager import ModelManager
from analyzer.worker.restrict import Restrictions

_SERVICE = "/inference.GRPCInferenceService/"
_INFER = (_SERVICE + "ModelInfer").encode()
_STREAM = (_SERVICE + "ModelStreamInfer").encode()
_MAX_METADATA_BYTES = 64 * 1024
_NEW_CALL = object()
_SHUTDOWN = object()
# unary calls answered by InferenceService's coroutines: method path -> (request type, name)
_UNARY = {
    (_SERVICE + name).encode(): (kind, name)
    for name, kind in {
        "ServerLive": pb.ServerLiveRequest,
        "ServerReady": pb.ServerReadyRequest,
        "ModelReady": pb.ModelReadyRequest,
        "ServerMetadata": pb.ServerMetadataRequest,
        "ModelMetadata": pb.ModelMetadataRequest,
        "ModelConfig": pb.ModelConfigRequest,
        "ModelStatistics": pb.ModelStatisticsRequest,
        "RepositoryIndex": pb.RepositoryIndexRequest,
        "RepositoryModelLoad": pb.RepositoryModelLoadRequest,
        "RepositoryModelUnload": pb.RepositoryModelUnloadRequest,
    }.items()
}


def _code(status: grpc.StatusCode) -> int:
    return status.value[0]


def _finish(call, status: grpc.StatusCode, details: str, *, metadata: bool, close: bool) -> None:
    """End a call with an error status (`metadata`: initial metadata not yet sent)."""
    ops: list = [cygrpc.SendStatusFromServerOperation(None, _code(status), details.encode(), 0)]
    if metadata:
        ops.insert(0, cygrpc.SendInitialMetadataOperation(None, 0))
    if close:  # a call refused before its close was awaited
        ops.append(cygrpc.ReceiveCloseOnServerOperation(0))
    _start(call, tuple(ops))


def _reply(call, payload: bytes) -> None:
    _start(call, (
        cygrpc.SendInitialMetadataOperation(None, 0),
        cygrpc.SendMessageOperation(payload, 0),
        cygrpc.SendStatusFromServerOperation(None, _code(grpc.StatusCode.OK), b"", 0),
    ))  # fmt: skip


def _start(call, ops: tuple) -> None:
    """Start a call's final batch; a call that already ended (its client left) takes none."""
    try:
        call.start_server_batch(ops, None)
    except Exception:  # noqa: S110 -- raised from a model's thread, where nobody could act on it
        pass


class _Abort(Exception):
    def __init__(self, status: grpc.StatusCode, details: str):
        super().__init__(details)
        self.status, self.details = status, details


class _Context:
    """What InferenceService's coroutines use of a grpc.aio context."""

    def __init__(self, metadata) -> None:
        self._metadata = tuple(metadata or ())

    def invocation_metadata(self):
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)


class _Call:
    """One call's state: `answered` keeps a second status from being sent; `cancel` withdraws
    the queued request when the client leaves."""

    __slots__ = ("call", "metadata", "answered", "cancel")

    def __init__(self, call, metadata) -> None:
        self.call, self.metadata = call, metadata
        self.answered = False
        self.cancel: Callable[[], None] | None = None


class CoreGrpcServer:
    """Start/stop wrapper with GrpcServer's interface: `start()` returns the bound port."""

    def __init__(
        self,
        manager: ModelManager,
        api,
        host: str,
        port: int,
        limits: Limits | None = None,
        restrictions: Restrictions | None = None,
    ):
        self.limits = limits or Limits()
        self.restrictions = restrictions or Restrictions()
        self.service = InferenceService(manager, api, self.restrictions, self.limits)
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(
            target=self.loop.run_forever, name="grpc-calls", daemon=True
        )
        self.poller = threading.Thread(target=self._poll, name="grpc", daemon=True)
        self.queue = cygrpc.CompletionQueue()
        self.server: Any = None
        self.active = 0  # calls between arrival and close; the poller thread alone counts
        self.stopping = False
        self.shut = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> int:
        limits = self.limits
        options = (
            ("grpc.max_send_message_length", limits.grpc_max_message_bytes),
            ("grpc.max_receive_message_length", limits.grpc_max_message_bytes),
            ("grpc.max_concurrent_streams", limits.grpc_max_concurrent_rpcs),
            ("grpc.max_metadata_size", _MAX_METADATA_BYTES),
            ("grpc.so_reuseport", 0),
        )
        self.server = cygrpc.Server(options, False)
        self.server.register_completion_queue(self.queue)
        port = self.server.add_http2_port(f"{self.host}:{self.port}".encode())
        if not port:
            raise OSError(f"gRPC port {self.port} cannot be bound on {self.host}")
        self.server.start()
        self.server.request_call(self.queue, self.queue, _NEW_CALL)
        self.loop_thread.start()
        self.poller.start()
        return port

    def stop(self) -> None:
        if self.server is None or not self.poller.is_alive():
            return
        self.stopping = True
        self.server.shutdown(self.queue, _SHUTDOWN)
        self.server.cancel_all_calls()
        self.shut.wait(10)
        self.queue.shutdown()
        self.poller.join(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(10)

    def _poll(self) -> None:
        queue = self.queue
        while True:
            event = queue.poll()
            if event.completion_type == cygrpc.CompletionType.queue_shutdown:
                return
            tag = event.tag
            try:
                if tag is _NEW_CALL:
                    self._arrived(event)
                elif tag is _SHUTDOWN:
                    self.shut.set()
                elif tag is not None:
                    tag(event)
            except Exception:  # a bug in one call must not stop the front end
                traceback.print_exc()
            event = None  # drop the call's reference before waiting again

    # -- arrival --------------------------------------------------------------------------------
    def _arrived(self, event) -> None:
        if self.stopping or not event.success:
            return
        self.server.request_call(self.queue, self.queue, _NEW_CALL)
        call, method = event.call, event.call_details.method
        if self.active >= self.limits.grpc_max_concurrent_rpcs:
            _finish(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!",
                    metadata=True, close=True)  # fmt: skip
            return
        if method != _INFER and method != _STREAM and method not in _UNARY:
            _finish(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!",
                    metadata=True, close=True)  # fmt: skip
            return
        self.active += 1
        state = _Call(call, event.invocation_metadata)
        call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),),
                                lambda e: self._closed(state, e))  # fmt: skip
        if method == _STREAM:
            asyncio.run_coroutine_threadsafe(self._stream(state), self.loop)
            return
        handler = self._infer if method == _INFER else self._unary(method)
        call.start_server_batch((cygrpc.ReceiveMessageOperation(0),),
                                lambda e: handler(state, e.batch_operations[0].message()))

    def _closed(self, state: _Call, event) -> None:
        self.active -= 1
        if event.batch_operations[0].cancelled():  # the client left or its deadline passed
            state.answered = True
            if state.cancel is not None:
                state.cancel()

    def _error(self, state: _Call, status: grpc.StatusCode, details: str) -> None:
        if not state.answered:
            state.answered = True
            _finish(state.call, status, details, metadata=True, close=False)

    # -- ModelInfer: the hot path ---------------------------------------------------------------
    def _infer(self, state: _Call, data: bytes | None) -> None:
        if data is None:
            self._error(state, grpc.StatusCode.INVALID_ARGUMENT, "no ModelInferRequest was sent")
            return
        try:
            request = pb.ModelInferRequest.FromString(data)
        except DecodeError as err:
            self._error(state, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {err}")
            return
        service = self.service
        message = service.refusal("inference", state.metadata)
        if message is not None:
            self._error(state, grpc.StatusCode.UNAVAILABLE, message)
            return

        def on_done(outputs, error) -> None:  # on the thread that finished the batch
            if state.answered:
                return
            if error is not None:
                status = error.status.grpc if isinstance(error, InferError) else None
                self._error(state, status or grpc.StatusCode.INTERNAL, str(error))
                return
            try:
                payload = service.encode(model, request, outputs).SerializeToString()
            except InferError as err:
                self._error(state, err.status.grpc, err.message)
                return
            state.answered = True
            _reply(state.call, payload)

        try:
            model, infer_request = service.prepare(request, on_done)
            state.cancel = infer_request.cancel
            model.submit(infer_request)  # validates against the model: may raise InferError
        except InferError as err:
            self._error(state, err.status.grpc, err.message)
        except Exception as err:  # a bug must still answer the call
            self._error(state, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")

    # -- everything else: InferenceService's coroutines on the loop thread ----------------------
    def _unary(self, method: bytes) -> Callable[[_Call, bytes | None], None]:
        kind, name = _UNARY[method]
        handler = getattr(self.service, name)

        def received(state: _Call, data: bytes | None) -> None:
            if data is None:
                self._error(state, grpc.StatusCode.INVALID_ARGUMENT, "no request was sent")
                return
            try:
                request = kind.FromString(data)
            except DecodeError as err:
                self._error(state, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {err}")
                return
            done = asyncio.run_coroutine_threadsafe(
                handler(request, _Context(state.metadata)), self.loop
            )
            done.add_done_callback(lambda f: self._unary_done(state, f))

        return received

    def _unary_done(self, state: _Call, future) -> None:
        if future.cancelled():
            self._error(state, grpc.StatusCode.CANCELLED, "the call was cancelled")
            return
        err = future.exception()
        if isinstance(err, _Abort):
            self._error(state, err.status, err.details)
        elif err is not None:
            self._error(state, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        elif not state.answered:
            state.answered = True
            _reply(state.call, future.result().SerializeToString())

    async def _stream(self, state: _Call) -> None:
        """ModelStreamInfer: InferenceService's generator, fed and drained through the core."""
        loop = asyncio.get_running_loop()
        call = state.call
        task = asyncio.current_task()
        state.cancel = lambda: loop.call_soon_threadsafe(task.cancel)
        if state.answered:  # closed before the task started
            return
        reader = _StreamReader(call, loop)
        first = True
        try:
            async for response in self.service.ModelStreamInfer(reader, _Context(state.metadata)):
                ops = (cygrpc.SendMessageOperation(response.SerializeToString(), 0),)
                if first:
                    ops = (cygrpc.SendInitialMetadataOperation(None, 0), *ops)
                    first = False
                sent = loop.create_future()
                call.start_server_batch(ops, lambda e, f=sent: _settle(loop, f, e.success))
                if not await sent:
                    return  # the client is gone
            if reader.error is not None:
                status, details = grpc.StatusCode.INVALID_ARGUMENT, reader.error
            else:
                status, details = grpc.StatusCode.OK, ""
        except asyncio.CancelledError:
            return
        except _Abort as err:
            status, details = err.status, err.details
        except Exception as err:  # a bug must still end the stream with a status
            status, details = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
        if not state.answered:
            state.answered = True
            _finish(call, status, details, metadata=first, close=False)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, value) -> None:
    def set_value() -> None:
        if not future.done():
            future.set_result(value)

    loop.call_soon_threadsafe(set_value)


class _StreamReader:
    """The client's stream as an async iterator: one receive operation per message asked for."""

    def __init__(self, call, loop: asyncio.AbstractEventLoop) -> None:
        self.call, self.loop = call, loop
        self.ended = False
        self.error: str | None = None

    def __aiter__(self) -> _StreamReader:
        return self

    async def __anext__(self) -> pb.ModelInferRequest:
        if self.ended:
            raise StopAsyncIteration
        got = self.loop.create_future()
        self.call.start_server_batch(
            (cygrpc.ReceiveMessageOperation(0),),
            lambda e: _settle(self.loop, got, e.batch_operations[0].message()),
        )
        data = await got
        if data is None:  # the client closed its side (or left)
            self.ended = True
            raise StopAsyncIteration
        try:
            return pb.ModelInferRequest.FromString(data)
        except DecodeError as err:
            self.ended, self.error = True, f"malformed ModelInferRequest in the stream: {err}"
            raise StopAsyncIteration from None
