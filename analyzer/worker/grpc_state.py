"""What the gRPC server keeps per connection and per call, and the HTTP/2 settings it announces.

A connection's handling is layered over this state, each layer a class over the one below, all one
object, so a call costs the same method lookups as in a single class: grpc_calls.py answers a call,
grpc_requests.py reads it, grpc_frames.py dispatches frames, grpc_server.py owns the socket.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from hpack import Decoder

from analyzer.http2 import DEFAULT_FRAME, DEFAULT_WINDOW, CoalescedWrites

if TYPE_CHECKING:
    from analyzer.worker.grpc_requests import RequestReading
    from analyzer.worker.grpc_server import GrpcServer

OUR_MAX_FRAME = 256 * 1024
Metadata = tuple[tuple[str, str], ...]  # a call's custom headers, as grpc.aio gives them
# a request's head from its header block: (:path, POST?, gRPC content type?, grpc-timeout,
# grpc-encoding, the rest as metadata)
Head = tuple[bytes, bool, bool, bytes | None, bytes, Metadata]
OUR_STREAM_WINDOW = 8 << 20
OUR_CONNECTION_WINDOW = 64 << 20


class Uninflatable(Exception):
    """A compressed gRPC message that cannot be decompressed, or is over the cap inflated."""

    def __init__(self, status: grpc.StatusCode, why: str):
        super().__init__(why)
        self.status = status


class ConnectionFault(Exception):
    """A protocol violation that ends the connection with GOAWAY(code)."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


class Inbox:
    """A ModelStreamInfer stream's serialized requests as an async iterator; taking one returns
    its window.

    HTTP/2 flow control bounds what waits here in wire bytes (the stream's window), not in what
    it takes to hold: 8 MiB of empty 5-byte messages were 1.7 million Python objects (~20 times
    the bytes, in a list whose pop(0) made taking them quadratic), and compressed messages were
    held inflated (up to the message cap each). So messages wait as they came, compressed ones
    too (inflated when taken), in a deque, and what they hold -- their wire bytes and each
    one's overhead -- counts in the server's `buffered` total like a half-received message's
    bytes: past --http-max-buffered-size the stream is refused (RESOURCE_EXHAUSTED)."""

    OVERHEAD = 128  # bytes a waiting message costs beyond its own: its bytes object and slot

    def __init__(self, conn: RequestReading, stream: Stream) -> None:
        self.conn, self.stream = conn, stream
        # (message as it came, bytes it took on the wire, whether it is compressed, window
        # still to give back when it is taken)
        self.items: deque[tuple[bytes, int, int, int]] = deque()
        self.held = 0  # what the items count in the server's `buffered`
        self.ended = False
        self.error: str | None = None
        self.status = grpc.StatusCode.INVALID_ARGUMENT  # the stream's status with `error`
        self.waiter: asyncio.Future[None] | None = None

    def put(self, message: bytes, wire: int, compressed: int, owed: int) -> bool:
        """Queue one message (`owed`: its bytes whose window comes back when it is taken);
        False when the worker holds too much already (not queued)."""
        cost = wire + self.OVERHEAD
        server = self.conn.server
        if server.buffered + cost > self.conn.limits.max_buffered_bytes:
            return False
        server.buffered += cost
        self.held += cost
        self.items.append((message, wire, compressed, owed))
        self._wake()
        return True

    def end(self) -> None:
        self.ended = True
        self._wake()

    def discard(self) -> None:
        """The stream is gone: what still waits leaves the server's total."""
        self.items.clear()
        self.conn.server.buffered -= self.held
        self.held = 0

    def _wake(self) -> None:
        wake(self.waiter)

    def __aiter__(self) -> Inbox:
        return self

    def fail(self, error: str, status: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        """A message was no ModelInferRequest (or could not be inflated): the stream takes no
        more and ends with `status` and `error`."""
        self.ended, self.error, self.status = True, error, status
        self.discard()

    async def __anext__(self) -> bytes:
        while not self.items:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        message, wire, compressed, owed = self.items.popleft()
        cost = wire + self.OVERHEAD
        self.held -= cost
        self.conn.server.buffered -= cost
        self.conn.return_window(self.stream, owed)
        if compressed:
            try:
                message = self.conn.inflate(self.stream, message)
            except Uninflatable as err:
                self.fail(str(err), err.status)
                raise StopAsyncIteration from None
        return message


class Stream:
    """One RPC: what arrived of its request, and what waits to be sent of its answer."""

    __slots__ = (
        "id", "method", "metadata", "encoding", "buf", "message", "inbox", "task", "cancel",
        "timer", "send_window", "out", "trailers", "headers_sent", "remote_done", "answered",
        "window", "owed", "counted", "started", "drained", "held", "early", "partial_since",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.method = b""
        self.metadata: Metadata = ()
        self.encoding = b"identity"
        self.buf = bytearray()
        self.message: bytes | None = None  # a unary call's one message
        self.inbox: Inbox | None = None
        self.task: asyncio.Future[Any] | None = None
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
        self.drained: asyncio.Future[None] | None = None
        self.held = 0  # bytes of `message` counted in the server's `buffered` (not ended yet)
        # a ModelStreamInfer stream's message still arriving: bytes of it whose window was
        # given back, and since when it has been arriving (0: none)
        self.early = 0
        self.partial_since = 0.0


class ConnectionState(CoalescedWrites):
    """One connection's state: HPACK decoding, its streams, the flow-control windows both ways,
    the frames waiting for this loop pass's write, and its timer."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.limits = server.limits
        self.service = server.service
        assert server.loop is not None  # connections arrive once the server runs
        self.loop: asyncio.AbstractEventLoop = server.loop
        self.transport: Any = None
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder(max_header_list_size=self.limits.max_header_bytes)
        self.blocks: dict[bytes, Head] = {}  # all-indexed header blocks while the table holds
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION
        self.block_stream = 0
        self.block_end_stream = False
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.send_window = DEFAULT_WINDOW  # the peer's connection window for our DATA
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.peer_table_size = 4096
        self.table_update: bytes = b""  # a dynamic table size update owed to the peer
        self.recv_unreturned = 0  # connection-window bytes not yet given back
        self.out: list[bytes] = []
        self.flush_pending = False
        self.unsent = 0  # bytes of them counted in the server's `unsent` (-1: closed for them)
        # DATA of answers the client's flow-control windows hold back, all streams: a call is
        # answered (its RPC slot free) once its DATA waits here, so a client that opens no window
        # could otherwise ask for answers until the worker's memory ran out
        self.held_back = 0
        self.blocked: set[Stream] = set()
        self.closing = False
        self.last_active = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None

    def _hold(self, change: int) -> None:
        """`change` bytes more (or fewer) of DATA wait for the client's windows."""
        self.held_back += change
        if not self.closing:  # a closing connection is counted out once, when it is gone
            self._count_unsent()

    def _count_unsent(self) -> None:
        """What this connection holds of replies its client has not taken, in the protocol's
        total (--http-max-unsent-size): DATA its windows hold back and, while writing is paused,
        the socket's buffer (below its high water it is not counted: reply_high_water)."""
        unsent = self.server.unsent
        if unsent is not None:
            size = self.held_back
            if self.write_paused:
                size += self.transport.get_write_buffer_size()
            unsent.count(self, size)

    def drop(self) -> None:
        """Closed for holding the most replies unread (UnsentReplies): nothing more is sent."""
        self.server.connections.discard(self)
        self.closing = True
        self.transport.abort()


def wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
