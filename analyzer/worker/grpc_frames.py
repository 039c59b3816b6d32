"""Each HTTP/2 frame to its handler, and the frames that act on the whole connection.

SETTINGS (the peer's windows, frame size and HPACK table size; acknowledged), WINDOW_UPDATE
(our send windows, which let waiting DATA go), PING, RST_STREAM (the client cancels a call),
PRIORITY and PUSH_PROMISE checked, GOAWAY: the peer's is noted only (calls in flight are still
answered), ours ends the connection. A protocol violation raises ConnectionFault.
"""

from __future__ import annotations

import struct

from analyzer.http2 import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PING,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
)
from analyzer.http2 import U32 as _U32
from analyzer.http2 import frame as _frame
from analyzer.http2 import hpack_int as _hpack_int
from analyzer.worker.grpc_requests import RequestReading
from analyzer.worker.grpc_state import ConnectionFault

# seconds a connection sent away may take to read its last frames before it is dropped
GOAWAY_GRACE_S = 10.0


class FrameHandling(RequestReading):
    """Dispatches a connection's frames (see the module's docstring)."""

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise ConnectionFault(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if self.block is None or stream_id != self.block_stream:
                raise ConnectionFault(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.block += payload
            if len(self.block) > self.limits.max_header_bytes:
                raise ConnectionFault(ENHANCE_YOUR_CALM, "header block too large")
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self._header_block(stream_id, block, self.block_end_stream)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise ConnectionFault(FRAME_SIZE_ERROR, "bad PING")
            if not flags & ACK:
                self._emit(_frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise ConnectionFault(PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None:  # the client cancelled: closing withdraws its work
                self._close(stream)
        elif kind == GOAWAY:
            pass  # the client closes when it is done; streams in flight still get answers
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ConnectionFault(FRAME_SIZE_ERROR, "bad PRIORITY")
        elif kind == PUSH_PROMISE:
            raise ConnectionFault(PROTOCOL_ERROR, "clients cannot push")
        # unknown frame types are ignored (RFC 9113 §4.1)

    def _settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionFault(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ConnectionFault(FRAME_SIZE_ERROR, "SETTINGS length")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFault(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:  # RFC 9113 6.9.2: a connection error
                        raise ConnectionFault(FLOW_CONTROL_ERROR, "a stream's window overflowed")
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionFault(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == S_HEADER_TABLE_SIZE:
                # we never add to our encoder's table; a smaller one is still announced
                if value < self.peer_table_size:
                    self.table_update = _hpack_int(value, 5, 0x20)
                self.peer_table_size = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionFault(PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._emit(_frame(SETTINGS, ACK, 0))
        self._unblock()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionFault(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise ConnectionFault(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionFault(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
            if not increment or stream.send_window > MAX_WINDOW:
                self._reset(stream, PROTOCOL_ERROR if not increment else FLOW_CONTROL_ERROR)
                return
        if self.blocked:  # a client's update per call and per answer: most find nothing waiting
            self._unblock()

    def go_away(self, code: int, why: str = "") -> None:
        if self.closing:
            return
        self.closing = True
        payload = _U32.pack(self.last_stream) + _U32.pack(code) + why.encode()[:256]
        self._emit(_frame(GOAWAY, 0, 0, payload))
        self._flush()
        self.transport.close()
        # close() waits for the client to read what is written: one that reads nothing kept
        # its socket (and, at the connection cap, a newcomer's place) for ever
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(GOAWAY_GRACE_S, self.transport.abort)
