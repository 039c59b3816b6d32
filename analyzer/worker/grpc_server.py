"""gRPC's wire protocol (HTTP/2, RFC 9113) served on the worker's event loop, beside HTTP.

Why: on the worker's one core, grpcio's server spent ~130 µs more per call than our HTTP/1.1
front end: four completion-queue events per call, C++ transport threads waking each other and
the model's thread, one socket write per answer (benchmarks/BENCHMARKS.md, "gRPC front end").
A profile over gRPC (Model Analyzer's default) measured that, not the model. Here one event loop
reads frames, decodes the few header fields gRPC uses (HPACK through the `hpack` library, with a
table lookup for the all-indexed blocks a client repeats on every call), hands ModelInfer to the
batcher and writes each answer as three frames, the answers finished in one loop pass coalesced
into one write.

What the protocol asks of a server is kept: flow control both ways, SETTINGS/PING
acknowledgement, CONTINUATION, padding, RST_STREAM cancelling the request it names, GOAWAY,
`grpc-timeout` deadlines, gzip/deflate messages, trailers-only errors with Triton's status codes.
Everything a client can grow is bounded (limits.py): streams per connection and RPCs in all,
message size before and after inflation, header block size, bytes of half-received messages in
all, connections, write buffer (reading pauses), a stream's unread requests (its window is then
not returned).
"""

from __future__ import annotations

import asyncio
import struct
import time
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from hpack import Decoder
from hpack.exceptions import HPACKError
from tritonclient.grpc import service_pb2 as pb

from analyzer.http2 import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL_ERROR,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    CoalescedWrites,
    settings_payload,
)
from analyzer.http2 import FRAME as _FRAME
from analyzer.http2 import U32 as _U32
from analyzer.http2 import frame as _frame
from analyzer.http2 import hpack_int as _hpack_int
from analyzer.http2 import literal as _literal
from analyzer.worker.errors import InferError
from analyzer.worker.grpc import InferenceService
from analyzer.worker.limits import Limits
from analyzer.worker.manager import ModelManager
from analyzer.worker.restrict import Restrictions

OUR_MAX_FRAME = 256 * 1024
OUR_STREAM_WINDOW = 8 << 20
OUR_CONNECTION_WINDOW = 64 << 20

_SERVICE = b"/inference.GRPCInferenceService/"
_INFER = _SERVICE + b"ModelInfer"
_STREAM = _SERVICE + b"ModelStreamInfer"
_UNARY = {
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
    }.items()
}
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_INFLATE_BITS = {b"gzip": 31, b"deflate": 15}

_STATUS_200 = b"\x88"  # static table entry 8, ':status: 200'
_RESPONSE_HEADERS = _STATUS_200 + _literal(b"content-type", b"application/grpc")
_OK_TRAILERS = _literal(b"grpc-status", b"0")


def _status_block(code: int, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", _percent(message))
    return block


def _percent(text: str) -> bytes:
    """grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2 spec)."""
    out = bytearray()
    for byte in text.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def _code(status: grpc.StatusCode) -> int:
    return status.value[0]


class _Abort(Exception):
    def __init__(self, status: grpc.StatusCode, details: str):
        super().__init__(details)
        self.status, self.details = status, details


class _ConnectionError(Exception):
    """A protocol violation that ends the connection with GOAWAY(code)."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


class _Context:
    """What InferenceService's coroutines use of a grpc.aio context."""

    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)


class _Inbox:
    """A ModelStreamInfer stream's requests as an async iterator; taking one returns its window."""

    def __init__(self, conn: _Connection, stream: _Stream) -> None:
        self.conn, self.stream = conn, stream
        self.items: list[tuple[bytes, int]] = []  # (message, bytes it took on the wire)
        self.ended = False
        self.error: str | None = None
        self.waiter: asyncio.Future | None = None

    def put(self, message: bytes, wire: int) -> None:
        self.items.append((message, wire))
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        _wake(self.waiter)

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> pb.ModelInferRequest:
        while not self.items:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        message, wire = self.items.pop(0)
        self.conn.return_window(self.stream, wire)
        try:
            return pb.ModelInferRequest.FromString(message)
        except DecodeError as err:
            self.ended, self.error = True, f"malformed ModelInferRequest in the stream: {err}"
            raise StopAsyncIteration from None


class _Stream:
    """One RPC: what arrived of its request, and what waits to be sent of its answer."""

    __slots__ = (
        "id", "method", "metadata", "encoding", "buf", "message", "inbox", "task", "cancel",
        "timer", "send_window", "out", "trailers", "headers_sent", "remote_done", "answered",
        "window", "owed", "counted", "started", "drained",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.method = b""
        self.metadata: tuple = ()
        self.encoding = b"identity"
        self.buf = bytearray()
        self.message: bytes | None = None  # a unary call's one message
        self.inbox: _Inbox | None = None
        self.task: asyncio.Future | None = None
        self.cancel: Callable[[], None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.send_window = send_window
        self.out = bytearray()  # DATA bytes waiting for flow-control window
        self.trailers: bytes | None = None  # sent once `out` is empty
        self.headers_sent = False
        self.remote_done = False
        self.answered = False
        self.window = OUR_STREAM_WINDOW  # what the client may still send us
        self.owed = 0  # consumed bytes not yet given back to the client's window
        self.counted = False
        self.started = time.monotonic()
        self.drained: asyncio.Future | None = None


class GrpcServer:
    """Triton's GRPCInferenceService on an asyncio server; `start()` returns the bound port."""

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
        self.service = InferenceService(manager, api, restrictions, self.limits)
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[_Connection] = set()
        self.active = 0  # RPCs between arrival and answer, all connections
        self.buffered = 0  # bytes of half-received messages, all connections
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.server = await self.loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True
        )
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for conn in list(self.connections):
            conn.go_away(NO_ERROR, "server shutting down")
        try:
            await asyncio.wait_for(self.server.wait_closed(), 5)
        except TimeoutError:  # a client that does not read its GOAWAY does not hold us
            for conn in list(self.connections):
                conn.transport.abort()


class _Connection(CoalescedWrites, asyncio.Protocol):
    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.limits = server.limits
        self.service = server.service
        self.loop = server.loop
        self.transport: Any = None
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder(max_header_list_size=self.limits.max_header_bytes)
        self.blocks: dict[bytes, list] = {}  # all-indexed header blocks while the table holds
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION
        self.block_stream = 0
        self.block_end_stream = False
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.send_window = DEFAULT_WINDOW  # the peer's connection window for our DATA
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.peer_table_size = 4096
        self.table_update: bytes = b""  # a dynamic table size update owed to the peer
        self.recv_unreturned = 0  # connection-window bytes not yet given back
        self.out: list[bytes] = []
        self.flush_pending = False
        self.blocked: set[_Stream] = set()
        self.closing = False
        self.last_active = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None

    # -- connection lifecycle -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        server = self.server
        if len(server.connections) >= self.limits.max_connections:
            transport.abort()
            return
        server.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_high_water_bytes)
        settings = settings_payload((
            (S_MAX_CONCURRENT_STREAMS, self.limits.grpc_max_concurrent_rpcs),
            (S_INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, OUR_MAX_FRAME),
            (S_MAX_HEADER_LIST_SIZE, self.limits.max_header_bytes),
            (S_ENABLE_PUSH, 0),
        ))  # fmt: skip
        self._emit(_frame(SETTINGS, 0, 0, settings))
        self._emit(_frame(WINDOW_UPDATE, 0, 0,
                          _U32.pack(OUR_CONNECTION_WINDOW - DEFAULT_WINDOW)))  # fmt: skip
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        for stream in list(self.streams.values()):
            self._abandon(stream)
            self._close(stream)
        self.blocked.clear()

    def pause_writing(self) -> None:  # the client does not read: stop reading its requests
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.closing:
            self.transport.resume_reading()

    def go_away(self, code: int, why: str = "") -> None:
        if self.closing:
            return
        self.closing = True
        payload = _U32.pack(self.last_stream) + _U32.pack(code) + why.encode()[:256]
        self._emit(_frame(GOAWAY, 0, 0, payload))
        self._flush()
        self.transport.close()

    def _arm(self, delay: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        """Preface late, idle too long, or a request that stopped arriving half-way."""
        self.timer = None
        if self.closing:
            return
        now = time.monotonic()
        limits = self.limits
        if not self.preface:
            self.go_away(PROTOCOL_ERROR, "the connection preface did not arrive in time")
            return
        if not self.streams and now - self.last_active >= limits.idle_timeout_s:
            self.go_away(NO_ERROR, "idle")
            return
        for stream in list(self.streams.values()):
            if not stream.remote_done and stream.inbox is None and (
                now - stream.started >= limits.header_timeout_s
            ):
                self._refuse(stream, grpc.StatusCode.DEADLINE_EXCEEDED,
                             "the request did not arrive in time")  # fmt: skip
        self._arm(min(limits.header_timeout_s, limits.idle_timeout_s) / 3)

    # -- reading frames -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        buf = self.buf
        if buf or not self.preface:
            buf += data
        else:  # the usual case: whole frames in one read, parsed where they arrived
            buf = data
        try:
            if not self.preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[: len(PREFACE)] != PREFACE:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                del buf[: len(PREFACE)]
                self.preface = True
                self.last_active = time.monotonic()
                self._arm(min(self.limits.header_timeout_s, self.limits.idle_timeout_s) / 3)
            view = memoryview(buf)
            offset, size = 0, len(buf)
            limit = OUR_MAX_FRAME
            try:
                while size - offset >= 9:
                    hi, lo, kind, flags, stream_id = _FRAME.unpack_from(buf, offset)
                    length = (hi << 16) | lo
                    if length > limit:
                        raise _ConnectionError(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                    end = offset + 9 + length
                    if end > size:
                        break
                    self._frame(kind, flags, stream_id & 0x7FFFFFFF, view[offset + 9 : end])
                    offset = end
                    if self.closing:
                        return
            finally:
                view.release()
            # a new buffer, not `del buf[:offset]`: a frame's memoryview may still be referenced
            # (an error's traceback holds the frames that saw it until the error is answered)
            # (a buffer of ours in which no frame was complete is kept as it is)
            if offset or buf is not self.buf:
                self.buf = bytearray(buf[offset:]) if offset < size else bytearray()
        except _ConnectionError as err:
            self.go_away(err.code, str(err))
        except Exception:  # a bug must not leave the connection half-alive
            traceback.print_exc()
            self.go_away(INTERNAL_ERROR, "internal error")

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if self.block is None or stream_id != self.block_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.block += payload
            if len(self.block) > self.limits.max_header_bytes:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self._header_block(stream_id, block, self.block_end_stream)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise _ConnectionError(FRAME_SIZE_ERROR, "bad PING")
            if not flags & ACK:
                self._emit(_frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None:  # the client cancelled: withdraw its work
                self._abandon(stream)
                self._close(stream)
        elif kind == GOAWAY:
            pass  # the client closes when it is done; streams in flight still get answers
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "bad PRIORITY")
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "clients cannot push")
        # unknown frame types are ignored (RFC 9113 §4.1)

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS length")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == S_HEADER_TABLE_SIZE:
                # we never add to our encoder's table; a smaller one is still announced
                if value < self.peer_table_size:
                    self.table_update = _hpack_int(value, 5, 0x20)
                self.peer_table_size = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._emit(_frame(SETTINGS, ACK, 0))
        self._unblock()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
            if not increment or stream.send_window > MAX_WINDOW:
                self._reset(stream, PROTOCOL_ERROR if not increment else FLOW_CONTROL_ERROR)
                return
        self._unblock()

    # -- a request's headers --------------------------------------------------------------------
    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id or not stream_id & 1:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on a stream the client cannot open")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not end:
                raise _ConnectionError(PROTOCOL_ERROR, "bad padding")
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if start > end:
            raise _ConnectionError(PROTOCOL_ERROR, "padding exceeds the frame")
        block = payload[start:end]
        if len(block) > self.limits.max_header_bytes:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._header_block(stream_id, bytes(block), bool(flags & END_STREAM))
        else:
            self.block, self.block_stream = bytearray(block), stream_id
            self.block_end_stream = bool(flags & END_STREAM)

    def _decode(self, block: bytes) -> tuple:
        """The request head a header block carries (see _head), decoded by the HPACK table."""
        head = self.blocks.get(block)
        if head is not None:
            return head
        table = self.decoder.header_table
        if len(block) <= 64 and all(0x80 < b < 0xFF for b in block):  # indexed fields only
            try:
                head = _head([table.get_by_index(b & 0x7F) for b in block])
            except HPACKError as err:
                raise _ConnectionError(COMPRESSION_ERROR, str(err)) from None
            if len(self.blocks) < 64:
                self.blocks[block] = head
            return head
        try:
            headers = self.decoder.decode(block, raw=True)
        except HPACKError as err:
            raise _ConnectionError(COMPRESSION_ERROR, str(err)) from None
        self.blocks.clear()  # the dynamic table may have changed
        return _head(headers)

    def _header_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        method, post, content, timeout, encoding, metadata = self._decode(block)  # always
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if not end_stream or stream.remote_done:
                self._reset(stream, PROTOCOL_ERROR)
                return
            self._remote_end(stream)
            return
        if stream_id <= self.last_stream:
            raise _ConnectionError(PROTOCOL_ERROR, f"stream {stream_id} is not new")
        self.last_stream = stream_id
        self.last_active = time.monotonic()
        if self.closing:
            return
        if len(self.streams) >= self.limits.grpc_max_concurrent_rpcs:
            self._emit(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = _Stream(stream_id, self.peer_initial_window)
        self.streams[stream_id] = stream
        stream.encoding = encoding
        stream.method, stream.metadata = method, metadata
        if end_stream:
            stream.remote_done = True
        if not post or not content:
            status = _literal(b":status", b"415" if post else b"405")
            self._emit(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, self._block(status)))
            stream.answered = True
            self._close_if_done(stream)
            return
        server = self.server
        if server.active >= self.limits.grpc_max_concurrent_rpcs:
            self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         "Concurrent RPC limit exceeded!")  # fmt: skip
            return
        server.active += 1
        stream.counted = True
        if method != _INFER and method != _STREAM and method not in _UNARY:
            self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if stream.encoding not in (b"identity", b"gzip", b"deflate"):
            self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED,
                         f"message encoding '{stream.encoding.decode('latin-1')}' "
                         "is not supported")  # fmt: skip
            return
        if timeout is not None:
            seconds = _parse_timeout(timeout)
            if seconds is None:
                self._refuse(stream, grpc.StatusCode.INTERNAL, "malformed grpc-timeout")
                return
            stream.timer = self.loop.call_later(seconds, self._expired, stream)
        if method == _STREAM:
            stream.inbox = _Inbox(self, stream)
            if stream.remote_done:
                stream.inbox.end()
            stream.task = asyncio.ensure_future(self._stream(stream))
        elif stream.remote_done:
            self._unary(stream)

    def _expired(self, stream: _Stream) -> None:
        stream.timer = None
        if self.streams.get(stream.id) is stream:
            self._abandon(stream)
            self._refuse(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- a request's messages -------------------------------------------------------------------
    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        n = len(payload)
        self.recv_unreturned += n  # the connection window is given back as data arrives
        if self.recv_unreturned >= OUR_CONNECTION_WINDOW // 2:
            self._emit(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unreturned)))
            self.recv_unreturned = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if not stream_id or stream_id > self.last_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on a stream never opened")
            return  # a stream we already answered or reset
        if stream.remote_done:
            self._reset(stream, STREAM_CLOSED)
            return
        start, end = 0, n
        if flags & PADDED:
            if not n or payload[0] >= n:
                raise _ConnectionError(PROTOCOL_ERROR, "bad padding")
            start, end = 1, n - payload[0]
        stream.window -= n
        if stream.window < 0:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if flags & END_STREAM:
            stream.remote_done = True  # no window to give back any more
        if stream.answered:  # refused while the client was still sending: dropped
            pass
        elif stream.inbox is None:  # a unary call: the window comes back as data arrives
            if end > start:
                self._take(stream, payload[start:end])
            self.return_window(stream, n)
        else:  # a stream: each request's bytes come back when the service takes it
            self.return_window(stream, n - (end - start))
            if end > start:
                self._take(stream, payload[start:end])
        if flags & END_STREAM:
            self._remote_end(stream)

    def _take(self, stream: _Stream, chunk: memoryview) -> None:
        buf = stream.buf
        if not buf and stream.message is None and stream.inbox is None and len(chunk) > 5:
            # the usual unary request: one uncompressed message in one frame
            size = _U32.unpack_from(chunk, 1)[0]
            if chunk[0] == 0 and len(chunk) == 5 + size <= self.limits.grpc_max_message_bytes:
                stream.message = bytes(chunk[5:])
                return
        before = len(buf)
        buf += chunk
        server = self.server
        server.buffered += len(buf) - before
        limit = self.limits.grpc_max_message_bytes
        while len(buf) >= 5:
            size = _U32.unpack_from(buf, 1)[0]
            if size > limit:
                self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({size} vs. {limit})")  # fmt: skip
                return
            if len(buf) < 5 + size:
                if server.buffered > self.limits.max_buffered_bytes:
                    why = "the worker is holding too many half-received requests"
                    self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, why)
                return
            compressed = buf[0]
            message = bytes(buf[5 : 5 + size])
            del buf[: 5 + size]
            server.buffered -= 5 + size
            if compressed:
                message = self._inflate(stream, message)
                if message is None:
                    return
            if stream.inbox is not None:
                stream.inbox.put(message, 5 + size)
            elif stream.message is None:
                stream.message = message
            else:
                self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED,
                             "a unary call got more than one request message")  # fmt: skip
                return

    def _inflate(self, stream: _Stream, message: bytes) -> bytes | None:
        bits = _INFLATE_BITS.get(stream.encoding)
        if bits is None:
            self._refuse(stream, grpc.StatusCode.INTERNAL,
                         "a compressed message without grpc-encoding")  # fmt: skip
            return None
        limit = self.limits.grpc_max_message_bytes
        inflater = zlib.decompressobj(bits)
        try:
            data = inflater.decompress(message, limit + 1)
        except zlib.error as err:
            self._refuse(stream, grpc.StatusCode.INTERNAL, f"cannot decompress the message: {err}")
            return None
        if len(data) > limit or inflater.unconsumed_tail:
            self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Received message larger than max (more than {limit} bytes "
                         "once decompressed)")  # fmt: skip
            return None
        return data

    def _remote_end(self, stream: _Stream) -> None:
        stream.remote_done = True
        if self._unbuffer(stream) and not stream.answered:
            self._refuse(stream, grpc.StatusCode.INTERNAL, "the request ended inside a message")
            return
        if stream.inbox is not None:
            stream.inbox.end()
        elif not stream.answered and stream.task is None:
            self._unary(stream)
        elif stream.answered:
            self._close_if_done(stream)

    def _unbuffer(self, stream: _Stream) -> int:
        """Drop a stream's half-received bytes from the global count; how many there were."""
        left = len(stream.buf)
        if left:
            self.server.buffered -= left
            stream.buf = bytearray()
        return left

    def return_window(self, stream: _Stream, n: int) -> None:
        """`n` bytes of the stream were consumed; the window comes back a quarter at a time."""
        stream.owed += n
        if stream.owed >= OUR_STREAM_WINDOW // 4 and not stream.remote_done and (
            self.streams.get(stream.id) is stream
        ):
            self._emit(_frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(stream.owed)))
            stream.window += stream.owed
            stream.owed = 0

    # -- calls ----------------------------------------------------------------------------------
    def _unary(self, stream: _Stream) -> None:
        data = stream.message
        stream.message = None
        if stream.method == _INFER:
            self._infer(stream, data)
            return
        kind, name = _UNARY[stream.method]
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

    def _unary_done(self, stream: _Stream, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        err = future.exception()
        if isinstance(err, _Abort):
            self._refuse(stream, err.status, err.details)
        elif err is not None:
            self._refuse(stream, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        else:
            self._answer(stream, [future.result().SerializeToString()])

    def _infer(self, stream: _Stream, data: bytes | None) -> None:
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
        answer: list = []  # (model, request fields, requested outputs) once submitted

        def on_done(outputs, error) -> None:  # on the thread that finished the batch
            loop.call_soon_threadsafe(finished, stream, answer, outputs, error)

        try:
            model, fields, requested, request = service.submit_bytes(data, on_done)
        except InferError as err:
            self._refuse(stream, err.status.grpc, err.message)
            return
        except Exception as err:  # a bug must still answer the call
            self._refuse(stream, grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
            return
        answer += (model, fields, requested)
        stream.cancel = request.cancel

    def _infer_done(self, stream: _Stream, answer: list, outputs, error) -> None:
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        stream.cancel = None
        if error is not None:
            status = error.status.grpc if isinstance(error, InferError) else None
            self._refuse(stream, status or grpc.StatusCode.INTERNAL, str(error))
            return
        try:
            parts = self.service.encode_parts(answer[0], answer[1], outputs, answer[2])
        except InferError as err:
            self._refuse(stream, err.status.grpc, err.message)
            return
        except Exception as err:  # outputs no encoder understands: the call is still answered
            why = f"model '{answer[0].name}' returned outputs that cannot be sent: {err}"
            self._refuse(stream, grpc.StatusCode.INTERNAL, why)
            return
        self._answer(stream, parts)

    async def _stream(self, stream: _Stream) -> None:
        """ModelStreamInfer: InferenceService's generator fed from the stream's inbox."""
        inbox = stream.inbox
        assert inbox is not None
        try:
            async for response in self.service.ModelStreamInfer(inbox, _Context(stream.metadata)):
                if stream.answered:
                    return
                self._send_message(stream, [response.SerializeToString()])
                if len(stream.out) > self.limits.write_high_water_bytes:
                    stream.drained = self.loop.create_future()
                    await stream.drained  # the client must read before the stream goes on
            if inbox.error is not None:
                status, details = grpc.StatusCode.INVALID_ARGUMENT, inbox.error
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
    def _answer(self, stream: _Stream, parts: list[bytes]) -> None:
        """A unary call's message (`parts` joined) and an OK status."""
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        self._send_message(stream, parts)
        self._end(stream, _OK_TRAILERS)

    def _refuse(self, stream: _Stream, status: grpc.StatusCode, details: str) -> None:
        """End a call with `status`: trailers-only when nothing was sent yet."""
        if stream.answered or self.streams.get(stream.id) is not stream:
            return
        self._end(stream, _status_block(_code(status), details))

    def _send_message(self, stream: _Stream, parts: list[bytes]) -> None:
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
        stream.out += b"\x00" + _U32.pack(size)
        for part in parts:
            stream.out += part
        self._drain(stream)

    def _end(self, stream: _Stream, trailers: bytes) -> None:
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

    def _drain(self, stream: _Stream) -> None:
        """Send what flow control allows of a stream's waiting DATA, then its trailers."""
        out = stream.out
        while out and stream.send_window > 0 and self.send_window > 0:
            n = min(len(out), stream.send_window, self.send_window, self.peer_max_frame)
            self._emit(_frame(DATA, 0, stream.id, bytes(out[:n])))
            del out[:n]
            stream.send_window -= n
            self.send_window -= n
        if out:
            self.blocked.add(stream)
            return
        self.blocked.discard(stream)
        _wake(stream.drained)
        if stream.trailers is not None:
            self._emit(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.trailers))
            stream.trailers = None
            self._close_if_done(stream)

    def _unblock(self) -> None:
        for stream in list(self.blocked):
            if self.send_window <= 0:
                return
            self._drain(stream)

    def _close_if_done(self, stream: _Stream) -> None:
        if not stream.answered or stream.out or stream.trailers is not None:
            return
        if not stream.remote_done:  # answered early: tell the client to stop sending
            self._emit(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        self._close(stream)

    def _close(self, stream: _Stream) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        self._unbuffer(stream)
        self.blocked.discard(stream)
        self._release(stream)
        _wake(stream.drained)
        if not self.streams:
            self.last_active = time.monotonic()

    def _release(self, stream: _Stream) -> None:
        """The call is answered or gone: its deadline timer and its RPC slot are freed."""
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if stream.counted:
            stream.counted = False
            self.server.active -= 1

    def _abandon(self, stream: _Stream) -> None:
        """The client left or the deadline passed: withdraw queued work."""
        cancel, stream.cancel = stream.cancel, None
        if cancel is not None:
            cancel()
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.inbox is not None:
            stream.inbox.end()

    def _reset(self, stream: _Stream, code: int) -> None:
        self._abandon(stream)
        stream.answered = True
        self._emit(_frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._close(stream)


def _head(headers: list) -> tuple:
    """(:path, POST?, gRPC content type?, grpc-timeout, grpc-encoding, other metadata)."""
    method = b""
    post = content = False
    metadata: list = []
    timeout = None
    encoding = b"identity"
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                method = value
            elif name == b":method":
                post = value == b"POST"
        elif name == b"content-type":
            content = value.startswith(b"application/grpc")
        elif name == b"grpc-timeout":
            timeout = value
        elif name == b"grpc-encoding":
            encoding = value
        elif name != b"te":
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    return method, post, content, timeout, encoding, tuple(metadata)


def _wake(future: asyncio.Future | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (gRPC over HTTP/2 spec)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]
