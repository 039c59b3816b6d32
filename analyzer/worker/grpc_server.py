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

This module holds the server, a connection's socket lifecycle (limits, back-pressure, timers) and
the frame reader. The connection's class is layered over the modules beside it: grpc_frames.py
dispatches frames, grpc_requests.py reads a request, grpc_calls.py runs and answers a call,
grpc_state.py holds what a connection and a call keep.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import traceback
from typing import Any

import grpc

from analyzer.http2 import (
    DEFAULT_WINDOW,
    FRAME_SIZE_ERROR,
    GOAWAY,
    INTERNAL_ERROR,
    NO_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    settings_payload,
)
from analyzer.http2 import FRAME as _FRAME
from analyzer.http2 import U32 as _U32
from analyzer.http2 import frame as _frame
from analyzer.worker.grpc import InferenceService
from analyzer.worker.grpc_frames import FrameHandling
from analyzer.worker.grpc_state import (
    OUR_CONNECTION_WINDOW,
    OUR_MAX_FRAME,
    OUR_STREAM_WINDOW,
    ConnectionFault,
)
from analyzer.worker.http import RestApi
from analyzer.worker.limits import Limits, UnsentReplies, reply_high_water
from analyzer.worker.manager import ModelManager
from analyzer.worker.restrict import Restrictions


class GrpcServer:
    """Triton's GRPCInferenceService on an asyncio server; `start()` returns the bound port."""

    def __init__(
        self,
        manager: ModelManager,
        api: RestApi | None,  # health, shared memory and repository state both protocols share
        host: str,
        port: int,
        limits: Limits | None = None,
        restrictions: Restrictions | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.tls = tls  # --grpc-use-ssl: HTTP/2 over TLS (ALPN h2)
        self.service = InferenceService(manager, api, restrictions, self.limits)
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[_Connection] = set()
        self.active = 0  # RPCs between arrival and answer, all connections
        self.buffered = 0  # bytes of half-received messages, all connections
        self.loop: asyncio.AbstractEventLoop | None = None
        self.unsent: UnsentReplies | None = None  # replies the clients have not read

    async def start(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.unsent = UnsentReplies(self.limits.max_unsent_bytes, self.loop)
        self.server = await self.loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True, ssl=self.tls
        )
        return int(self.server.sockets[0].getsockname()[1])

    def make_room(self) -> bool:
        """At the connection cap: the connection idle longest (no call open, or no preface
        yet) is sent away for a newcomer; False when every connection has a call open. (They
        were never given up: one client's connections that only sent the preface, kept for
        --http-idle-timeout, kept every other client out.)"""
        idle = [c for c in self.connections if not c.streams and not c.closing]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.last_active)
        victim.go_away(NO_ERROR, "the server is at its connection limit: idle connections "
                                 "make room")  # fmt: skip
        self.connections.discard(victim)
        return True

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


class _Connection(FrameHandling, asyncio.Protocol):
    """One client's connection: the asyncio protocol (the socket's lifecycle, write
    back-pressure, timers, the frame reader) over the layers that handle its frames."""

    # -- connection lifecycle -------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        server = self.server
        if len(server.connections) >= self.limits.max_connections and not server.make_room():
            self.closing = True
            why = (f"the server is at its limit of {self.limits.max_connections} open "
                   "connections (--http-max-connections); retry later").encode()
            transport.write(_frame(SETTINGS, 0, 0, b"")
                            + _frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(NO_ERROR) + why))
            transport.close()
            return
        server.connections.add(self)
        transport.set_write_buffer_limits(high=reply_high_water(self.limits))
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

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        for stream in list(self.streams.values()):
            self._close(stream)  # withdraws what the call still runs
        self.blocked.clear()
        self.write_paused = False
        if self.unsent > 0:
            self._count_unsent()  # nothing held any more: 0

    def pause_writing(self) -> None:  # the client does not read: stop reading its requests
        self.transport.pause_reading()
        self.write_paused = True
        self._count_unsent()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._count_unsent()
        if not self.closing:
            self.transport.resume_reading()

    def _wrote_paused(self) -> None:
        self._count_unsent()

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
            if stream.remote_done:
                continue
            if stream.inbox is None:  # a unary call, from its start
                late = now - stream.started >= limits.header_timeout_s
            else:  # a stream may stay open; a message that began arriving must end
                late = bool(stream.partial_since) and (
                    now - stream.partial_since >= limits.header_timeout_s)
            if late:
                self._refuse(stream, grpc.StatusCode.DEADLINE_EXCEEDED,
                             "the request did not arrive in time")  # fmt: skip
        self._arm(min(limits.header_timeout_s, limits.idle_timeout_s) / 3)

    # -- reading frames -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        buf: bytes | bytearray
        if self.buf or not self.preface:
            self.buf += data
            buf = self.buf
        else:  # the usual case: whole frames in one read, parsed where they arrived
            buf = data
        try:
            if not self.preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[: len(PREFACE)] != PREFACE:
                    raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                del self.buf[: len(PREFACE)]  # `buf` is this buffer until the preface came
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
                        raise ConnectionFault(FRAME_SIZE_ERROR, f"frame of {length} bytes")
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
        except ConnectionFault as err:
            self.go_away(err.code, str(err))
        except Exception:  # a bug must not leave the connection half-alive
            traceback.print_exc()
            self.go_away(INTERNAL_ERROR, "internal error")
