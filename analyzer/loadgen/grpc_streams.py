"""The sending half of the load generator's gRPC connection (grpc_client.GrpcConnection adds the
reading half): the connection's lifecycle, opening a stream per call, request bytes under the
server's flow control, the server's stream limit, and ending calls.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

from hpack import Decoder

from analyzer.http2 import (
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FRAME,
    HEADERS,
    PREFACE,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    CoalescedWrites,
    frame,
    settings_payload,
)
from analyzer.loadgen.grpc_call import (
    LAST_STREAM_ID,
    RECV_CONNECTION_WINDOW,
    RECV_MAX_FRAME,
    RECV_STREAM_WINDOW,
    Call,
    GrpcCallError,
    Unsent,
    request_headers,
    status_name,
)


class CallStreams(CoalescedWrites, asyncio.Protocol):
    """One HTTP/2 connection's calls, one stream each, as the client sends them: what reading the
    server's frames (GrpcConnection) updates and ends."""

    def __init__(self, authority: str, clock, on_lost=None, headers=()) -> None:
        self.head_first, self.head_later, self.head_literal, self.table_needed = (
            request_headers(authority, headers=headers)
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

    def _broken(self, why: str) -> None:
        self.usable = False
        self.lost = ConnectionError(why)
        for call in list(self.calls.values()):
            self._fail(call, self.lost)
        if self.transport is not None:
            self.transport.abort()
