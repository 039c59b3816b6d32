"""A gRPC call from a complete request to its last frame, on the connection's state.

ModelInfer, the hot path, is parsed and handed to the batcher here and answered from the loop;
the other unary RPCs and ModelStreamInfer run as InferenceService's coroutines. An answer goes out
as HEADERS, DATA and trailers (trailers-only for an error before any message) within the client's
flow-control windows; DATA the windows hold back waits on the stream until WINDOW_UPDATE. Then the
stream is closed, its deadline timer and its RPC slot freed.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from analyzer.http2 import DATA, END_HEADERS, END_STREAM, HEADERS, NO_ERROR, RST_STREAM
from analyzer.http2 import FRAME as _FRAME
from analyzer.http2 import U32 as _U32
from analyzer.http2 import frame as _frame
from analyzer.http2 import literal as _literal
from analyzer.worker import offload
from analyzer.worker.errors import InferError, Status
from analyzer.worker.grpc_state import ConnectionState, Metadata, Stream, wake
from analyzer.worker.request import Outputs

_SERVICE = b"/inference.GRPCInferenceService/"
INFER_METHOD = _SERVICE + b"ModelInfer"
STREAM_METHOD = _SERVICE + b"ModelStreamInfer"
UNARY_METHODS = {
    _SERVICE + name.encode(): (kind, name)
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
        "SystemSharedMemoryStatus": pb.SystemSharedMemoryStatusRequest,
        "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterRequest,
        "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterRequest,
        "CudaSharedMemoryStatus": pb.CudaSharedMemoryStatusRequest,
        "CudaSharedMemoryRegister": pb.CudaSharedMemoryRegisterRequest,
        "CudaSharedMemoryUnregister": pb.CudaSharedMemoryUnregisterRequest,
    }.items()
}

_STATUS_200 = b"\x88"  # static table entry 8, ':status: 200'
_RESPONSE_HEADERS = _STATUS_200 + _literal(b"content-type", b"application/grpc")
_OK_TRAILERS = _literal(b"grpc-status", b"0")
# an answer's HEADERS frame and its DATA frame's header and message prefix, packed at once
_HEADERS_LENGTH = len(_RESPONSE_HEADERS)
_ANSWER_HEAD = struct.Struct(f">xHBBI{_HEADERS_LENGTH}sBHBBIxI")
_OK_TRAILERS_FRAME = _FRAME.pack(0, len(_OK_TRAILERS), HEADERS, END_HEADERS | END_STREAM, 0)[:5]


# the most of a status message sent: messages may quote what a client sent (a datatype, a
# tensor's name), and trailers go in one HEADERS frame, which the client's frame and header
# list limits bound (grpcio refuses metadata over 16 KiB; frame() cannot say 16 MiB or more)
MAX_STATUS_MESSAGE = 1024


def _status_block(code: int, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", _percent(message))
    return block


def _percent(text: str) -> bytes:
    """grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec), cut to
    MAX_STATUS_MESSAGE bytes before encoding (at most three times that once encoded)."""
    raw = text.encode("utf-8", "replace")
    if len(raw) > MAX_STATUS_MESSAGE:
        cut = MAX_STATUS_MESSAGE - 3
        raw = raw[:cut].decode("utf-8", "ignore").encode("utf-8") + b"..."
    out = bytearray()
    for byte in raw:
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def _code(status: grpc.StatusCode) -> int:
    return int(status.value[0])


class _Abort(Exception):
    def __init__(self, status: grpc.StatusCode, details: str):
        super().__init__(details)
        self.status, self.details = status, details


class _Context:
    """What InferenceService's coroutines use of a grpc.aio context."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Abort(code, details)


class CallHandling(ConnectionState):
    """Runs a connection's calls and sends their answers (see the module's docstring)."""

    # -- calls ----------------------------------------------------------------------------------
    def _unary(self, stream: Stream) -> None:
        data = stream.message
        stream.message = None
        self._unhold(stream)
        if stream.method == INFER_METHOD:
            self._infer(stream, data)
            return
        kind, name = UNARY_METHODS[stream.method]
        if data is None:
            self._refuse(stream, grpc.StatusCode.INVALID_ARGUMENT, "no request was sent")
            return
        try:
            request = kind.FromString(data)
        except DecodeError as err:
            self._refuse(stream, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {err}")
            return
        handler = getattr(self.service, name)
        task = asyncio.ensure_future(handler(request, _Context(stream.metadata)))
        stream.task = task
        task.add_done_callback(lambda f: self._unary_done(stream, f))

    def _unary_done(self, stream: Stream, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        err = future.exception()
        if isinstance(err, _Abort):
            self._refuse(stream, err.status, err.details)
        elif err is not None:
            self._refuse(stream, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        else:
            self._answer(stream, [future.result().SerializeToString()])

    def _infer(self, stream: Stream, data: bytes | None) -> None:
        """ModelInfer, the hot path: parsed and submitted here, answered from the loop."""
        if data is None:
            self._refuse(stream, grpc.StatusCode.INVALID_ARGUMENT, "no ModelInferRequest was sent")
            return
        service = self.service
        message = service.refusal("inference", stream.metadata)
        if message is not None:
            self._refuse(stream, grpc.StatusCode.UNAVAILABLE, message)
            return
        loop = self.loop
        finished = self._infer_done
        answer: list[Any] = []  # (model, request fields, requested outputs, id) once submitted

        # on the thread that finished the batch; a large answer is encoded there (offload.py)
        def on_done(outputs: Outputs | None, error: Exception | None) -> None:
            if error is None and outputs is not None and len(answer) == 4 and (
                offload.heavy(outputs)
            ):
                encoded = self._encode(answer, outputs)
                if isinstance(encoded, InferError):
                    loop.call_soon_threadsafe(finished, stream, answer, None, encoded)
                else:
                    loop.call_soon_threadsafe(finished, stream, answer, None, None, encoded)
            else:
                loop.call_soon_threadsafe(finished, stream, answer, outputs, error)

        try:
            model, fields, requested, request = service.submit_bytes(data, on_done)
        except InferError as err:
            self._refuse(stream, err.status.grpc, err.message)
            return
        except Exception as err:  # a bug must still answer the call
            self._refuse(stream, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
            return
        answer += (model, fields, requested, request.id)
        stream.cancel = request.cancel

    def _infer_done(self, stream: Stream, answer: list[Any], outputs: Outputs | None,
                    error: Exception | None, parts: list[bytes] | None = None) -> None:  # fmt: skip
        """`parts`: the answer, encoded already on the thread that finished it."""
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        stream.cancel = None
        if parts is None:
            if error is None:
                encoded = self._encode(answer, outputs)
                if isinstance(encoded, InferError):
                    error = encoded
                else:
                    parts = encoded
            if error is not None or parts is None:
                status = error.status.grpc if isinstance(error, InferError) else None
                self._refuse(stream, status or grpc.StatusCode.INTERNAL, str(error))
                return
        size = sum(map(len, parts))
        n = size + 5
        if stream.headers_sent or stream.out or self.table_update or not stream.remote_done or (
            n > stream.send_window or n > self.send_window or n > self.peer_max_frame
        ):
            self._answer(stream, parts)  # the general path: flow control, table updates, RST
            return
        # the usual answer in one go: HEADERS, one DATA frame, the OK trailers; then closed
        sid = stream.id
        stream.send_window -= n
        self.send_window -= n
        stream.headers_sent = stream.answered = True
        self._emit(_ANSWER_HEAD.pack(_HEADERS_LENGTH, HEADERS, END_HEADERS, sid, _RESPONSE_HEADERS,
                                     n >> 16, n & 0xFFFF, DATA, 0, sid, size))  # fmt: skip
        self.out += parts
        self.out.append(_OK_TRAILERS_FRAME + _U32.pack(sid) + _OK_TRAILERS)
        self._close(stream)

    def _encode(self, answer: list[Any], outputs: Outputs | None) -> list[bytes] | InferError:
        """A unary call's answer as parts to send, or the error that answers it instead."""
        try:
            assert outputs is not None  # no error: the model answered
            return self.service.encode_parts(answer[0], answer[1], outputs, answer[2], answer[3])
        except InferError as err:
            return err
        except Exception as err:  # outputs no encoder understands: the call is still answered
            return InferError(f"model '{answer[0].name}' returned outputs that cannot be sent: "
                              f"{err}", Status.INTERNAL)  # fmt: skip

    async def _stream(self, stream: Stream) -> None:
        """ModelStreamInfer: InferenceService's generator fed from the stream's inbox."""
        inbox = stream.inbox
        assert inbox is not None
        try:
            async for parts in self.service.ModelStreamInfer(inbox, _Context(stream.metadata)):
                if stream.answered or self.streams.get(stream.id) is not stream:
                    return
                self._send_message(stream, parts)
                if len(stream.out) > self.limits.write_high_water_bytes:
                    stream.drained = self.loop.create_future()
                    await stream.drained  # the client must read before the stream goes on
            if inbox.error is not None:
                status, details = inbox.status, inbox.error
            else:
                status, details = grpc.StatusCode.OK, ""
        except asyncio.CancelledError:
            return
        except _Abort as err:
            status, details = err.status, err.details
        except Exception as err:  # a bug must still end the stream with a status
            status, details = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
        self._refuse(stream, status, details)

    # -- answers --------------------------------------------------------------------------------
    def _answer(self, stream: Stream, parts: list[bytes]) -> None:
        """A unary call's message (`parts` joined) and an OK status."""
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        self._send_message(stream, parts)
        self._end(stream, _OK_TRAILERS)

    def _refuse(self, stream: Stream, status: grpc.StatusCode, details: str) -> None:
        """End a call with `status`: trailers-only when nothing was sent yet."""
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        self._end(stream, _status_block(_code(status), details))

    def _send_message(self, stream: Stream, parts: list[bytes]) -> None:
        """One gRPC message (`parts` joined), in one DATA frame when flow control allows."""
        sid = stream.id
        if not stream.headers_sent:
            stream.headers_sent = True
            self._emit(_frame(HEADERS, END_HEADERS, sid, self._block(_RESPONSE_HEADERS)))
        size = sum(map(len, parts))
        n = size + 5
        if not stream.out and n <= stream.send_window and n <= self.send_window and (
            n <= self.peer_max_frame
        ):
            stream.send_window -= n
            self.send_window -= n
            self._emit(_FRAME.pack(n >> 16, n & 0xFFFF, DATA, 0, sid) + b"\x00" + _U32.pack(size))
            self.out += parts  # the frame's payload goes out without another copy
            return
        held = len(stream.out)
        stream.out += b"\x00" + _U32.pack(size)
        for part in parts:
            stream.out += part
        self._drain(stream, len(stream.out) - held)

    def _end(self, stream: Stream, trailers: bytes) -> None:
        stream.answered = True
        self._release(stream)
        if not stream.headers_sent:  # trailers-only
            stream.headers_sent = True
            block = self._block(_RESPONSE_HEADERS + trailers)
            self._emit(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
            self._close_if_done(stream)
            return
        stream.trailers = self._block(trailers)
        self._drain(stream)

    def _block(self, block: bytes) -> bytes:
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
        return block

    def _drain(self, stream: Stream, added: int = 0) -> None:
        """Send what flow control allows of a stream's waiting DATA (`added` bytes of it new),
        then its trailers."""
        out = stream.out
        held = len(out)
        while out and stream.send_window > 0 and self.send_window > 0:
            n = min(len(out), stream.send_window, self.send_window, self.peer_max_frame)
            self._emit(_frame(DATA, 0, stream.id, bytes(out[:n])))
            del out[:n]
            stream.send_window -= n
            self.send_window -= n
        if added != held - len(out):  # what still waits changed
            self._hold(added - (held - len(out)))
        if out:
            self.blocked.add(stream)
            return
        self.blocked.discard(stream)
        wake(stream.drained)
        if stream.trailers is not None:
            self._emit(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.trailers))
            stream.trailers = None
            self._close_if_done(stream)

    def _unblock(self) -> None:
        for stream in list(self.blocked):
            if self.send_window <= 0:
                return
            self._drain(stream)

    def _close_if_done(self, stream: Stream) -> None:
        if not stream.answered or stream.out or stream.trailers is not None:
            return
        if not stream.remote_done:  # answered early: tell the client to stop sending
            self._emit(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        self._close(stream)

    def _close(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        if stream.task is not None or stream.inbox is not None or stream.cancel is not None:
            # a call closed before its work ended (the client left or reset it, or a stream was
            # refused mid-way for a message over the cap): what it still runs is withdrawn, or
            # its tasks would wait forever
            self._abandon(stream)
        self._unbuffer(stream)
        if stream.out:  # DATA its windows held back is not sent any more
            self._hold(-len(stream.out))
            stream.out = bytearray()
        if stream.inbox is not None:  # what its inbox still holds leaves the server's total
            stream.inbox.discard()
        self.blocked.discard(stream)
        self._release(stream)
        wake(stream.drained)
        if not self.streams:
            self.last_active = time.monotonic()

    def _unbuffer(self, stream: Stream) -> int:
        """Drop a stream's half-received bytes from the global count; how many there were."""
        left = len(stream.buf)
        if left:
            self.server.buffered -= left
            stream.buf = bytearray()
        self._unhold(stream)
        return left

    def _unhold(self, stream: Stream) -> None:
        """A whole unary message that waited for its stream's end leaves the global count."""
        if stream.held:
            self.server.buffered -= stream.held
            stream.held = 0

    def _release(self, stream: Stream) -> None:
        """The call is answered or gone: its deadline timer and its RPC slot are freed."""
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if stream.counted:
            stream.counted = False
            self.server.active -= 1

    def _abandon(self, stream: Stream) -> None:
        """The client left, the deadline passed or the call was closed early: withdraw its work
        (its queued request, its task unless that is what is running, a stream's inbox)."""
        cancel, stream.cancel = stream.cancel, None
        if cancel is not None:
            cancel()
        task = stream.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if stream.inbox is not None:
            stream.inbox.end()

    def _reset(self, stream: Stream, code: int) -> None:
        stream.answered = True
        self._emit(_frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._close(stream)
