"""Reading a call's request: its header block and its DATA.

The header block (HEADERS, CONTINUATION, padding) is decoded by HPACK, or looked up when it is an
all-indexed block the client repeats; the few fields gRPC uses open the stream under the RPC limits
and the call's deadline. DATA is counted against the windows we gave, cut into gRPC's
length-prefixed messages (inflated when compressed) with every size bounded, and the windows are
given back as the bytes are consumed.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterable

import grpc
from hpack.exceptions import HPACKError

from analyzer.http2 import (
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    HEADERS,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    WINDOW_UPDATE,
)
from analyzer.http2 import U32 as _U32
from analyzer.http2 import frame as _frame
from analyzer.http2 import literal as _literal
from analyzer.worker.grpc_calls import INFER_METHOD, STREAM_METHOD, UNARY_METHODS, CallHandling
from analyzer.worker.grpc_state import (
    OUR_CONNECTION_WINDOW,
    OUR_STREAM_WINDOW,
    ConnectionFault,
    Head,
    Inbox,
    Stream,
    Uninflatable,
)

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_INFLATE_BITS = {b"gzip": 31, b"deflate": 15}


class RequestReading(CallHandling):
    """Reads a connection's requests (see the module's docstring)."""

    # -- a request's headers --------------------------------------------------------------------
    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not stream_id or not stream_id & 1:
            raise ConnectionFault(PROTOCOL_ERROR, "HEADERS on a stream the client cannot open")
        if flags == END_HEADERS and len(payload) <= self.limits.max_header_bytes:
            self._header_block(stream_id, bytes(payload), False)  # a call's usual opening
            return
        start, end = 0, len(payload)
        if flags & PADDED:
            if not end:
                raise ConnectionFault(PROTOCOL_ERROR, "bad padding")
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if start > end:
            raise ConnectionFault(PROTOCOL_ERROR, "padding exceeds the frame")
        block = payload[start:end]
        if len(block) > self.limits.max_header_bytes:
            raise ConnectionFault(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._header_block(stream_id, bytes(block), bool(flags & END_STREAM))
        else:
            self.block, self.block_stream = bytearray(block), stream_id
            self.block_end_stream = bool(flags & END_STREAM)

    def _decode(self, block: bytes) -> Head:
        """The request head a header block carries (see _head), decoded by the HPACK table."""
        table = self.decoder.header_table
        if len(block) <= 64 and all(0x80 < b < 0xFF for b in block):  # indexed fields only
            try:
                fields = [table.get_by_index(b & 0x7F) for b in block]
            except HPACKError as err:
                raise ConnectionFault(COMPRESSION_ERROR, str(err)) from None
            # the cap the HPACK decoder applies (RFC 7541 sizes): a few bytes naming large
            # table entries again and again expand to any size
            size = sum(len(name) + len(value) + 32 for name, value in fields)
            limit = self.limits.max_header_bytes
            if size > limit:
                why = f"A header list larger than {limit} has been received"
                raise ConnectionFault(COMPRESSION_ERROR, why)
            head = _head(fields)
            # kept: a client's usual call heads, small and few; not any head a client invents
            if size <= _KEPT_HEAD_BYTES and len(self.blocks) < _KEPT_HEADS:
                self.blocks[block] = head
            return head
        try:
            headers = self.decoder.decode(block, raw=True)
        except HPACKError as err:
            raise ConnectionFault(COMPRESSION_ERROR, str(err)) from None
        self.blocks.clear()  # the dynamic table may have changed
        return _head(headers)

    def _header_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        head = self.blocks.get(block) or self._decode(block)  # always: HPACK's table may change
        method, post, content, timeout, encoding, metadata = head
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if not end_stream or stream.remote_done:
                self._reset(stream, PROTOCOL_ERROR)
                return
            self._remote_end(stream)
            return
        if stream_id <= self.last_stream:
            raise ConnectionFault(PROTOCOL_ERROR, f"stream {stream_id} is not new")
        self.last_stream = stream_id
        self.last_active = time.monotonic()
        if self.closing:
            return
        if len(self.streams) >= self.limits.grpc_max_concurrent_rpcs:
            self._emit(_frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = Stream(stream_id, self.peer_initial_window)
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
        if method != INFER_METHOD and method != STREAM_METHOD and method not in UNARY_METHODS:
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
        if method == STREAM_METHOD:
            stream.inbox = Inbox(self, stream)
            if stream.remote_done:
                stream.inbox.end()
            stream.task = asyncio.ensure_future(self._stream(stream))
        elif stream.remote_done:
            self._unary(stream)

    def _expired(self, stream: Stream) -> None:
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
        if flags == END_STREAM and stream is not None and stream.method == INFER_METHOD and (
            self._whole_infer(stream, payload, n)
        ):
            return
        if stream is None:
            if not stream_id or stream_id > self.last_stream:
                raise ConnectionFault(PROTOCOL_ERROR, "DATA on a stream never opened")
            return  # a stream we already answered or reset
        if stream.remote_done:
            self._reset(stream, STREAM_CLOSED)
            return
        start, end = 0, n
        if flags & PADDED:
            if not n or payload[0] >= n:
                raise ConnectionFault(PROTOCOL_ERROR, "bad padding")
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
                self._partial(stream)
        if flags & END_STREAM:
            self._remote_end(stream)

    def _whole_infer(self, stream: Stream, payload: memoryview, n: int) -> bool:
        """ModelInfer's usual request, one unpadded DATA frame holding the whole uncompressed
        message and ending the stream, submitted at once; False (nothing done) for any other."""
        if stream.remote_done or stream.answered or stream.buf or stream.message is not None or (
            n < 5 or payload[0] or n > stream.window or stream.task is not None
        ):
            return False
        size = _U32.unpack_from(payload, 1)[0]
        if size != n - 5 or size > self.limits.grpc_max_message_bytes:
            return False
        stream.remote_done = True  # the window is not given back: the stream sends no more
        stream.window -= n
        self._infer(stream, bytes(payload[5:]))
        return True

    def _take(self, stream: Stream, chunk: memoryview) -> None:
        buf = stream.buf
        if not buf and stream.message is None and stream.inbox is None and len(chunk) > 5:
            # the usual unary request: one uncompressed message in one frame
            size = _U32.unpack_from(chunk, 1)[0]
            if chunk[0] == 0 and len(chunk) == 5 + size <= self.limits.grpc_max_message_bytes:
                stream.message = bytes(chunk[5:])
                self._count_message(stream)
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
            if stream.inbox is not None:  # inflated when the service takes it
                given = min(stream.early, 5 + size)  # its window given back while it arrived
                stream.early -= given
                if not stream.inbox.put(message, 5 + size, compressed, 5 + size - given):
                    self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 "the worker is holding too many received requests")  # fmt: skip
                    return
                continue
            if compressed:
                try:
                    message = self.inflate(stream, message)
                except Uninflatable as err:
                    self._refuse(stream, err.status, str(err))
                    return
            if stream.message is None:
                stream.message = message
                self._count_message(stream)
            else:
                self._refuse(stream, grpc.StatusCode.UNIMPLEMENTED,
                             "a unary call got more than one request message")  # fmt: skip
                return

    def _partial(self, stream: Stream) -> None:
        """A stream's message still arriving gets its window back as it comes (the bytes count
        in the server's total, and the message cap bounds them): held back until the message
        was whole, a message larger than the stream's window never arrived. Its start is
        noted for the header timeout."""
        waiting = len(stream.buf)
        if not waiting:
            stream.partial_since = 0.0
            return
        if not stream.partial_since:
            stream.partial_since = time.monotonic()
        if waiting > stream.early:
            self.return_window(stream, waiting - stream.early)
            stream.early = waiting

    def _count_message(self, stream: Stream) -> None:
        """A unary call's whole message before its stream ends counts with the half-received
        bytes: it waited uncounted, so calls that never ended held any number of messages of
        up to the cap each until the header timeout. (One that ends the stream goes at once.)"""
        if stream.remote_done:
            return
        assert stream.message is not None
        size = 5 + len(stream.message)
        server = self.server
        server.buffered += size
        stream.held = size
        if server.buffered > self.limits.max_buffered_bytes:
            self._refuse(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         "the worker is holding too many half-received requests")  # fmt: skip

    def inflate(self, stream: Stream, message: bytes) -> bytes:
        """A compressed message inflated; Uninflatable when it cannot be decompressed or is
        over the cap once inflated."""
        bits = _INFLATE_BITS.get(stream.encoding)
        if bits is None:
            raise Uninflatable(grpc.StatusCode.INTERNAL,
                               "a compressed message without grpc-encoding")  # fmt: skip
        limit = self.limits.grpc_max_message_bytes
        inflater = zlib.decompressobj(bits)
        try:
            data = inflater.decompress(message, limit + 1)
        except zlib.error as err:
            raise Uninflatable(grpc.StatusCode.INTERNAL,
                               f"cannot decompress the message: {err}") from None  # fmt: skip
        if len(data) > limit or inflater.unconsumed_tail:
            raise Uninflatable(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"Received message larger than max (more than {limit} bytes "
                               "once decompressed)")  # fmt: skip
        if not inflater.eof or inflater.unused_data:  # cut short, or bytes after its end
            raise Uninflatable(grpc.StatusCode.INTERNAL, "cannot decompress the message: "
                               + ("it ends early" if not inflater.eof
                                  else "bytes follow its end"))  # fmt: skip
        return data

    def _remote_end(self, stream: Stream) -> None:
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

    def return_window(self, stream: Stream, n: int) -> None:
        """`n` bytes of the stream were consumed; the window comes back a quarter at a time."""
        stream.owed += n
        if stream.owed >= OUR_STREAM_WINDOW // 4 and not stream.remote_done and (
            self.streams.get(stream.id) is stream
        ):
            self._emit(_frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(stream.owed)))
            stream.window += stream.owed
            stream.owed = 0


# all-indexed header blocks decoded once per connection (while HPACK's table holds): a call's
# head is a few hundred bytes, and a client uses a handful of them (one per method and metadata)
_KEPT_HEADS = 16
_KEPT_HEAD_BYTES = 2048


def _head(headers: Iterable[tuple[bytes, bytes]]) -> Head:
    """(:path, POST?, gRPC content type?, grpc-timeout, grpc-encoding, other metadata)."""
    method = b""
    post = content = False
    metadata: list[tuple[str, str]] = []
    timeout: bytes | None = None
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


def _parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (gRPC over HTTP/2 spec)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]
