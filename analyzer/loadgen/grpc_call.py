"""What one call of the load generator's gRPC client is on the wire: the header blocks and the
length-prefixed message it sends, the per-call state a connection keeps, the errors a call ends
with, and the client's receive limits.
"""

from __future__ import annotations

import asyncio

from analyzer.http2 import U32, literal

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


def request_headers(
    authority: str, path: bytes = INFER_PATH, headers: tuple[tuple[str, str], ...] = ()
) -> tuple[bytes, bytes, bytes, int]:
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
        # -H: gRPC metadata, whose keys are lower case
        *((name.lower().encode(), value.encode()) for name, value in headers),
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
