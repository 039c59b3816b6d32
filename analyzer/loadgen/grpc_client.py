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
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from urllib.parse import unquote_to_bytes

from hpack import Decoder

from analyzer.http2 import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FRAME,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    CoalescedWrites,
    frame,
    literal,
    settings_payload,
    table_neutral,
)

INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"
RECV_STREAM_WINDOW = 16 << 20
RECV_CONNECTION_WINDOW = 64 << 20
RECV_MAX_FRAME = 1 << 20
LAST_STREAM_ID = (1 << 31) - 1


def status_name(code: int) -> str:
    """grpc-status as its name (grpcio is imported only when a call fails: a client process
    starts ~0.1 s sooner without it)."""
    import grpc

    names = {status.value[0]: status.name for status in grpc.StatusCode}
    return names.get(code, str(code))


class GrpcCallError(Exception):
    """A call that ended with a non-OK gRPC status (or an HTTP status / reset that maps to one)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"gRPC {code}: {details}")


class Unsent(ConnectionError):
    """The server never processed the call (GOAWAY above it, or refused): safe to send again."""


def grpc_message(message: bytes) -> bytes:
    """A gRPC message on the wire: uncompressed flag, 4-byte length, the serialized proto."""
    return b"\x00" + U32.pack(len(message)) + message


def request_headers(authority: str, path: bytes = INFER_PATH) -> tuple[bytes, bytes, bytes, int]:
    """The header blocks of a connection's calls: (first, every later one, literals, table bytes
    needed).

    The first call adds its fields to the server's HPACK table (incremental indexing) and every
    later call names them by index, as grpc's own clients do: the server then sees the same few
    bytes on every call, which a server may decode once (ours does). Where the server's table is
    too small, every call sends the fields as literals without indexing instead.
    """
    fields = (
        (b":path", path),
        (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"model-analyzer-loadgen"),
    )
    first = b"\x83\x86" + b"".join(b"\x40" + literal(n, v)[1:] for n, v in fields)
    # the newest entry is index 62: the first field added is the oldest
    later = b"\x83\x86" + bytes(0x80 | (62 + len(fields) - 1 - i) for i in range(len(fields)))
    literals = b"\x83\x86" + b"".join(literal(n, v) for n, v in fields)
    needed = sum(len(n) + len(v) + 32 for n, v in fields)  # RFC 7541 §4.1 entry sizes
    return first, later, literals, needed


class Call:
    __slots__ = ("id", "waiter", "message", "tries", "sent", "first_byte", "http_status",
                 "pending", "received", "window")

    def __init__(
        self, stream_id: int, waiter: asyncio.Future, message: bytes, tries: int, window: int
    ) -> None:
        self.id = stream_id
        self.waiter = waiter
        self.message = message  # kept (not copied) to send again if the server refuses it
        self.tries = tries
        self.sent = 0  # when its first bytes were handed to the kernel (the coalesced write)
        self.first_byte = 0
        self.http_status = 0
        self.pending = memoryview(b"")  # request bytes flow control held back
        self.received = 0  # DATA bytes not yet given back by a stream WINDOW_UPDATE
        self.window = window  # the server's window for our DATA on this stream


class GrpcConnection(CoalescedWrites, asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent unary calls."""

    def __init__(self, authority: str, clock, on_lost=None) -> None:
        self.head_first, self.head_later, self.head_literal, self.table_needed = (
            request_headers(authority)
        )
        self.peer_table = 4096  # the server's HPACK table size (SETTINGS_HEADER_TABLE_SIZE)
        self.clock = clock
        self.on_lost = on_lost
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.ready = self.loop.create_future()  # the server's SETTINGS arrived
        self.buf = bytearray()
        self.calls: dict[int, Call] = {}
        self.next_id = 1
        self.send_window = DEFAULT_WINDOW
        self.peer_window = DEFAULT_WINDOW  # the server's initial stream window
        self.peer_frame = DEFAULT_FRAME
        self.peer_streams = 1 << 31
        self.waiting: deque = deque()  # (waiter, message, tries) over the server's stream limit
        self.blocked: deque[Call] = deque()  # calls with request bytes held by flow control
        self.received = 0  # connection DATA bytes not yet given back
        self.decoder = Decoder()
        self.blocks: dict[bytes, tuple] = {}
        self.block: bytearray | None = None
        self.block_stream = 0
        self.block_end = False
        self.out: list[bytes] = []
        self.flush_pending = False
        self.unsent: list[Call] = []  # opened since the last write; stamped when it goes out
        self.usable = True
        self.lost: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = settings_payload((
            (S_ENABLE_PUSH, 0),
            (S_INITIAL_WINDOW_SIZE, RECV_STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, RECV_MAX_FRAME),
        ))  # fmt: skip
        transport.write(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, U32.pack(RECV_CONNECTION_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc) -> None:
        self.usable = False
        if self.lost is None:  # not after _broken: its reason is the one to report
            self.lost = ConnectionError(f"connection closed by the server ({exc or 'EOF'})")
        if not self.ready.done():
            self.ready.set_exception(self.lost)
        if self.on_lost is not None:
            self.on_lost(self)
        for call in list(self.calls.values()):
            self._fail(call, self.lost)
        self.calls.clear()
        self.blocked.clear()
        while self.waiting:
            waiter = self.waiting.popleft()[0]
            if not waiter.done():
                waiter.set_exception(Unsent("connection closed before the call was sent"))

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()

    def _flush(self) -> None:
        """Write what this loop pass queued, stamping its calls: a call waits here for the
        others of its pass, and that wait is the client's, not the server's."""
        if self.unsent:
            now = self.clock()
            for call in self.unsent:
                call.sent = now
            self.unsent.clear()
        super()._flush()

    # -- calls ----------------------------------------------------------------------------------
    def start(self, message: bytes) -> asyncio.Future:
        """Send one call (`message`: see grpc_message); the future ends with the finished call
        (its `sent` and `first_byte` times), or raises GrpcCallError / ConnectionError."""
        waiter = self.loop.create_future()
        if not self.usable:
            waiter.set_exception(Unsent(str(self.lost or "the connection takes no new calls")))
        elif len(self.calls) >= self.peer_streams:
            self.waiting.append((waiter, message, 1))
        else:
            self._open(waiter, message, 1)
        return waiter

    def _open(self, waiter: asyncio.Future, message: bytes, tries: int) -> None:
        sid = self.next_id
        self.next_id += 2
        if self.next_id > LAST_STREAM_ID:  # stream ids run out: new calls go to a new connection
            self.usable = False
        call = Call(sid, waiter, message, tries, self.peer_window)
        self.calls[sid] = call
        self.unsent.append(call)
        block = self.head_later
        if sid == 1:  # the server's table size is known now (SETTINGS came before any call)
            if self.peer_table < self.table_needed:
                self.head_first = self.head_later = self.head_literal
            block = self.head_first
        head = FRAME.pack(0, len(block), HEADERS, END_HEADERS, sid) + block
        n = len(message)
        if n <= call.window and n <= self.send_window and n <= self.peer_frame:
            call.window -= n
            self.send_window -= n
            self._emit(head + FRAME.pack(n >> 16, n & 0xFFFF, DATA, END_STREAM, sid) + message)
            return
        self._emit(head)
        call.pending = memoryview(message)
        self._drain(call)

    def _drain(self, call: Call) -> None:
        pending = call.pending
        while pending and call.window > 0 and self.send_window > 0:
            n = min(len(pending), call.window, self.send_window, self.peer_frame)
            last = n == len(pending)
            self._emit(frame(DATA, END_STREAM if last else 0, call.id, bytes(pending[:n])))
            pending = pending[n:]
            call.window -= n
            self.send_window -= n
        call.pending = pending
        if pending and call not in self.blocked:
            self.blocked.append(call)

    def _unblock(self) -> None:
        for _ in range(len(self.blocked)):
            if self.send_window <= 0:
                return
            call = self.blocked.popleft()
            if self.calls.get(call.id) is call:
                self._drain(call)

    def _finish(self, call: Call, grpc_status: int, details: str) -> None:
        if self.calls.pop(call.id, None) is None:
            return
        if grpc_status == 0:
            if not call.waiter.done():
                call.waiter.set_result(call)
        else:
            code = status_name(grpc_status)
            self._fail(call, GrpcCallError(code, details))
        self._next_waiting()

    def _fail(self, call: Call, error: BaseException) -> None:
        self.calls.pop(call.id, None)
        if not call.waiter.done():
            call.waiter.set_exception(error)

    def _next_waiting(self) -> None:
        while self.waiting and (len(self.calls) < self.peer_streams or not self.usable):
            waiter, message, tries = self.waiting.popleft()
            if waiter.done():
                continue
            if self.usable:
                self._open(waiter, message, tries)
            else:
                waiter.set_exception(Unsent("the connection takes no new calls"))

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
        elif kind == GOAWAY:
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

    def _broken(self, why: str) -> None:
        self.usable = False
        self.lost = ConnectionError(why)
        for call in list(self.calls.values()):
            self._fail(call, self.lost)
        if self.transport is not None:
            self.transport.abort()


async def connect(host: str, port: int, clock, on_lost=None, timeout: float = 10):
    """An open connection whose SETTINGS exchange is done. (asyncio.timeout, not wait_for: in
    Python 3.11 wait_for can swallow a cancellation that races a fast failure, and a shard whose
    parent left then spun reconnecting to a stopped server instead of ending.)"""
    loop = asyncio.get_running_loop()
    authority = f"{host}:{port}"
    conn = None
    try:
        async with asyncio.timeout(timeout):
            _, conn = await loop.create_connection(
                lambda: GrpcConnection(authority, clock, on_lost), host, port
            )
            await conn.ready
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn
