"""What the gRPC server keeps per connection and per call, and the HTTP/2 settings it announces.

A connection's handling is layered over this state, each layer a class over the one below, all one
object, so a call costs the same method lookups as in a single class: grpc_calls.py answers a call,
grpc_requests.py reads it, grpc_frames.py dispatches frames, grpc_server.py owns the socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


class ConnectionFault(Exception):
    """A protocol violation that ends the connection with GOAWAY(code)."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


class Inbox:
    """A ModelStreamInfer stream's serialized requests as an async iterator; taking one returns
    its window."""

    def __init__(self, conn: RequestReading, stream: Stream) -> None:
        self.conn, self.stream = conn, stream
        self.items: list[tuple[bytes, int]] = []  # (message, bytes it took on the wire)
        self.ended = False
        self.error: str | None = None
        self.waiter: asyncio.Future[None] | None = None

    def put(self, message: bytes, wire: int) -> None:
        self.items.append((message, wire))
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        wake(self.waiter)

    def __aiter__(self) -> Inbox:
        return self

    def fail(self, error: str) -> None:
        """A message was no ModelInferRequest: the stream takes no more and ends with `error`."""
        self.ended, self.error = True, error
        self.items.clear()

    async def __anext__(self) -> bytes:
        while not self.items:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        message, wire = self.items.pop(0)
        self.conn.return_window(self.stream, wire)
        return message


class Stream:
    """One RPC: what arrived of its request, and what waits to be sent of its answer."""

    __slots__ = (
        "id", "method", "metadata", "encoding", "buf", "message", "inbox", "task", "cancel",
        "timer", "send_window", "out", "trailers", "headers_sent", "remote_done", "answered",
        "window", "owed", "counted", "started", "drained",
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
        self.blocked: set[Stream] = set()
        self.closing = False
        self.last_active = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None


def wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
