"""HTTP/2 wire facts (RFC 9113, RFC 7541) shared by the worker's gRPC server and the load
generator's gRPC client: frame layout, codes, HPACK integers and literals, and the check that
lets a decoded header block be reused.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types and flags
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0, 1, 2, 3, 5
FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 6, 7, 9, 11
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE = 1, 2, 3, 4
S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 5, 6

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384

FRAME = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream id
U32 = struct.Struct(">I")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def settings_payload(pairs: tuple[tuple[int, int], ...]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in pairs)


def hpack_int(value: int, prefix: int, first: int) -> bytes:
    """RFC 7541 §5.1 integer with a `prefix`-bit prefix; `first` holds the pattern bits."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes((first | value,))
    out = bytearray((first | top,))
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header as 'literal without indexing, new name': it leaves both HPACK tables alone."""
    return b"\x00" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def _read_int(block: bytes, i: int, prefix: int) -> int:
    """The offset after an RFC 7541 integer starting at `i` (its value is not needed)."""
    if block[i] & ((1 << prefix) - 1) != (1 << prefix) - 1:
        return i + 1
    i += 1
    while block[i] & 0x80:
        i += 1
    return i + 1


def _string_end(block: bytes, i: int) -> int:
    top = 0x7F
    if block[i] & top != top:
        return i + 1 + (block[i] & top)
    value, shift, j = 0, 0, i + 1
    while True:
        value |= (block[j] & 0x7F) << shift
        shift += 7
        j += 1
        if not block[j - 1] & 0x80:
            break
    return j + top + value


def table_neutral(block: bytes) -> bool:
    """Whether decoding `block` leaves the decoder's dynamic table as it was (no incremental
    indexing, no size update): then the same bytes decode the same way until a block that is not
    neutral arrives, and a decoded copy may be reused. Malformed blocks count as not neutral."""
    i, n = 0, len(block)
    try:
        while i < n:
            b = block[i]
            if b & 0x80:  # indexed field
                i = _read_int(block, i, 7)
            elif b & 0xC0 == 0x40 or b & 0xE0 == 0x20:  # incremental indexing; table size update
                return False
            else:  # literal without indexing (0000) or never indexed (0001)
                name_index = b & 0x0F
                i = _read_int(block, i, 4)
                if name_index == 0:
                    i = _string_end(block, i)
                i = _string_end(block, i)
        return i == n
    except IndexError:
        return False


class CoalescedWrites:
    """Frames queued during one pass of the event loop go out in one write (one syscall): the
    answers (or calls) a pass finishes share a TCP segment instead of paying one each."""

    loop: asyncio.AbstractEventLoop
    transport: Any
    out: list[bytes]
    flush_pending: bool
    write_paused = False  # the transport is over its write high water (the peer is not reading)

    def _emit(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_pending = False
        out, self.out = self.out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))
            if self.write_paused:
                self._wrote_paused()

    def _wrote_paused(self) -> None:
        """A write while over the high water: a server counts what its peer leaves unread."""
