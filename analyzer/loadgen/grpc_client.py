"""The load generator's gRPC client: HTTP/2 frames written and read on the shard's event loop.

Why: through grpc.aio a call cost the client 210-300 µs of CPU (C-core completion queues, a
thread hop, several Python objects per call), where perf_analyzer's C++ client spends 75-120 µs
and our HTTP/1.1 client ~45 µs on the same worker (benchmarks/BENCHMARKS.md, issue 19). A client
that costs more than the server's front end measures itself. Here a call is bytes prepared once
(one header block of literal fields, so no HPACK state, and the length-prefixed message) written
in one call; an answer is read frame by frame, its message skipped, only its grpc-status decoded.

The protocol is kept: the peer's SETTINGS (frame size, initial window, concurrent streams), flow
control both ways, CONTINUATION and padding, PING, RST_STREAM, GOAWAY (calls the server never saw
fail as unsent), any HPACK the server uses (a decoded block is reused while the table holds).

Three modules: grpc_call.py (what a call is on the wire), grpc_streams.py (CallStreams: sending
calls, flow control, the connection's lifecycle) and this one (GrpcConnection: reading the
server's frames; connect). The names tests and callers use are all importable from here.
"""

from __future__ import annotations

import asyncio
import struct
from urllib.parse import unquote_to_bytes

from analyzer.http2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY_FLAG,
    RST_STREAM,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    frame,
    table_neutral,
)
from analyzer.loadgen.grpc_call import (
    RECV_CONNECTION_WINDOW,
    RECV_STREAM_WINDOW,
    Call,
    GrpcCallError,
    Unsent,
    grpc_message,
    request_headers,
)
from analyzer.loadgen.grpc_streams import CallStreams

__all__ = [
    "RECV_STREAM_WINDOW",
    "Call",
    "GrpcCallError",
    "GrpcConnection",
    "Unsent",
    "connect",
    "grpc_message",
    "request_headers",
]


class GrpcConnection(CallStreams):
    """One HTTP/2 connection carrying many concurrent unary calls: CallStreams sends them, this
    class reads the server's frames and ends them."""

    # -- reading --------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if buf:
            buf += data
        else:
            buf = data
        now = self.clock()
        offset, size = 0, len(buf)
        view = memoryview(buf)
        try:
            while size - offset >= 9:
                hi, lo, kind, flags, sid = FRAME.unpack_from(buf, offset)
                end = offset + 9 + ((hi << 16) | lo)
                if end > size:
                    break
                self._frame(kind, flags, sid & 0x7FFFFFFF, view[offset + 9 : end], now)
                offset = end
        except Exception as exc:  # noqa: BLE001 - whatever the server sent, the calls must end
            self._broken(f"unreadable HTTP/2 from the server: {type(exc).__name__}: {exc}")
            return
        finally:
            view.release()
        self.buf = bytearray(buf[offset:]) if offset < size else bytearray()
        if self.out:
            self._flush()

    def _frame(self, kind: int, flags: int, sid: int, payload: memoryview, now: int) -> None:
        """One frame from the server. The frames every call brings stay inline (no method call
        more per frame on the hot path); the rare RST_STREAM and GOAWAY have methods of theirs."""
        if kind == DATA:
            self._data(flags, sid, len(payload))
        elif kind == HEADERS:
            start, end = 0, len(payload)
            if flags & PADDED:
                start, end = 1, end - payload[0]
            if flags & PRIORITY_FLAG:
                start += 5
            call = self.calls.get(sid)
            if call is not None and not call.first_byte:
                call.first_byte = now
            if flags & END_HEADERS:
                self._block(sid, bytes(payload[start:end]), bool(flags & END_STREAM))
            else:
                self.block, self.block_stream = bytearray(payload[start:end]), sid
                self.block_end = bool(flags & END_STREAM)
        elif kind == CONTINUATION:
            if self.block is None or sid != self.block_stream:
                raise ValueError("CONTINUATION without its HEADERS")
            self.block += payload
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self._block(sid, block, self.block_end)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            increment = U32.unpack(payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self.send_window += increment
            else:
                call = self.calls.get(sid)
                if call is not None:
                    call.window += increment
            self._unblock()
        elif kind == PING:
            if not flags & ACK:
                self._emit(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            self._reset(sid, payload)
        elif kind == GOAWAY:
            self._goaway(payload)

    def _reset(self, sid: int, payload: memoryview) -> None:
        """RST_STREAM: a refused call is sent again (up to 3 tries), any other reset fails it."""
        call = self.calls.get(sid)
        if call is not None:
            code = U32.unpack(payload)[0]
            if code == 7 and call.tries < 3:  # REFUSED_STREAM: not processed; it waits
                # for a free stream (the server's limit is at most what it had open)
                self.calls.pop(sid, None)
                self.peer_streams = max(1, min(self.peer_streams, len(self.calls)))
                self.waiting.appendleft((call.waiter, call.message, call.tries + 1))
            elif code == 7:
                self._fail(call, Unsent("the server refused the stream 3 times"))
            else:
                self._fail(call, GrpcCallError(
                    "CANCELLED" if code == 8 else "INTERNAL",
                    f"stream reset by the server (HTTP/2 error {code})",
                ))  # fmt: skip
            self._next_waiting()

    def _goaway(self, payload: memoryview) -> None:
        """GOAWAY: no new calls here; the calls above the last stream it names were never seen."""
        last = U32.unpack(payload[:4])[0] & 0x7FFFFFFF
        self.usable = False
        for call in [c for c in self.calls.values() if c.id > last]:
            self._fail(call, Unsent("the server is going away (GOAWAY)"))
        self._next_waiting()

    def _settings(self, payload: memoryview) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == S_INITIAL_WINDOW_SIZE and value <= MAX_WINDOW:
                delta, self.peer_window = value - self.peer_window, value
                for call in self.calls.values():
                    call.window += delta
            elif key == S_MAX_FRAME_SIZE:
                self.peer_frame = value
            elif key == S_MAX_CONCURRENT_STREAMS:
                self.peer_streams = max(1, value)
            elif key == S_HEADER_TABLE_SIZE:
                self.peer_table = value
        self._emit(frame(SETTINGS, ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
        self._unblock()
        self._next_waiting()

    def _data(self, flags: int, sid: int, n: int) -> None:
        """Answer bytes are not kept; the windows they used are given back."""
        self.received += n
        if self.received >= RECV_CONNECTION_WINDOW // 2:
            self._emit(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.received)))
            self.received = 0
        call = self.calls.get(sid)
        if call is None:
            return
        call.received += n
        if call.received >= RECV_STREAM_WINDOW // 2 and not flags & END_STREAM:
            self._emit(frame(WINDOW_UPDATE, 0, sid, U32.pack(call.received)))
            call.received = 0
        if flags & END_STREAM:  # a stream that ends without trailers lost its status
            self._finish(call, 13, "the answer ended without a grpc-status")

    def _block(self, sid: int, block: bytes, end_stream: bool) -> None:
        http_status, grpc_status, details = self._decode(block)
        call = self.calls.get(sid)
        if call is None:
            return
        if http_status:
            call.http_status = http_status
        if not end_stream:
            return
        if grpc_status is None:
            status = call.http_status
            self._finish(call, 13 if status == 200 else 14,
                         f"HTTP status {status} without a grpc-status")  # fmt: skip
        else:
            self._finish(call, grpc_status, details)

    def _decode(self, block: bytes) -> tuple:
        """(:status, grpc-status or None, grpc-message) of a header block."""
        found = self.blocks.get(block)
        if found is not None:
            return found
        headers = self.decoder.decode(block, raw=True)
        http_status, grpc_status, details = 0, None, ""
        for name, value in headers:
            if name == b":status":
                http_status = int(value)
            elif name == b"grpc-status":
                grpc_status = int(value)
            elif name == b"grpc-message":
                details = unquote_to_bytes(value).decode("utf-8", "replace")
        found = (http_status, grpc_status, details)
        if table_neutral(block):
            if len(self.blocks) < 64:
                self.blocks[block] = found
        else:  # the table changed: blocks decoded before may now mean something else
            self.blocks.clear()
        return found


async def connect(host: str, port: int, clock, on_lost=None, timeout: float = 10, headers=(),
                  tls=None):  # fmt: skip
    """An open connection whose SETTINGS exchange is done. (asyncio.timeout, not wait_for: in
    Python 3.11 wait_for can swallow a cancellation that races a fast failure, and a shard whose
    parent left then spun reconnecting to a stopped server instead of ending.)"""
    loop = asyncio.get_running_loop()
    authority = f"{host}:{port}"
    conn = None
    try:
        async with asyncio.timeout(timeout):
            _, conn = await loop.create_connection(
                lambda: GrpcConnection(authority, clock, on_lost, headers), host, port,
                ssl=tls, server_hostname=host if tls is not None else None,
            )  # fmt: skip
            await conn.ready
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn
