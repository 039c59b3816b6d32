"""The sending side of an HTTP connection and its clock.

Answers go out in request order, each exactly once, as one `writelines` of head and body; reading
pauses while requests wait, replies go unread, or after a refusal; a connection that ends in an
error half-closes and drops what still arrives (the lingering close); and one timer per connection
keeps the header-read and idle deadlines, re-arming itself from timestamps. Mixed into
http_server._Protocol.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from analyzer.worker.http_message import HttpResponse, error_response
from analyzer.worker.http_state import ConnectionState, Slot

log = logging.getLogger(__name__)

# After an error that ends a connection, what the client still sends is read and dropped this long,
# so that it sees our answer instead of a reset that can discard it (Apache's lingering close).
_LINGER_S = 1.0
# why a connection's reading is paused (bits of _Protocol.paused)
_PENDING, _WRITES, _REFUSED = 1, 2, 4
_now = time.monotonic

_REASONS = {s.value: s.phrase for s in HTTPStatus}
# per response this would be rebuilt: each (status, content type)'s status line and headers up to
# Content-Length's value; bounded
_PREFIXES: dict[tuple[int, str], str] = {}
_MAX_PREFIXES = 256


class Flow(ConnectionState):
    """Ordered answers, pausing and resuming reading, the lingering close and the connection's one
    timer. Mixed into http_server._Protocol; the state it shares is
    http_state.ConnectionState."""

    __slots__ = ()

    # -- responses --------------------------------------------------------------------------
    def _fill(self, slot: Slot, response: HttpResponse) -> None:
        if slot[0] is not None:
            return  # answered already: each request gets exactly one response
        slot[0] = response
        # answered: let go of the request. It holds its hooks, a hook holds the model's request,
        # whose callback holds this slot -- a reference cycle that only the garbage collector
        # would free, keeping every request's body alive until it ran (and paying for the runs)
        slot[1] = None
        slots = self.slots
        if slots and slots[0] is not slot:
            # an earlier request is unanswered: this answer waits in the worker, outside the
            # socket's buffer, and counts as unsent (up to --http-max-pending of any size each)
            size = sum(map(len, response.body))
            if size:
                slot[1] = size
                self.held_back += size
                self._count_unsent()
        self._flush()

    def _count_unsent(self) -> None:
        """This connection's replies its client has not taken, in the server's total
        (--http-max-unsent-size): answers waiting for an earlier one and, while writing is
        paused, the socket's buffer (below its high water it is not counted)."""
        size = self.held_back
        if self.paused & _WRITES and self.transport is not None:
            size += self.transport.get_write_buffer_size()
        self.server.unsent.count(self, size)

    def _flush(self) -> None:
        slots = self.slots
        counted = False
        while slots and slots[0][0] is not None:
            response, waited = slots.popleft()
            if waited is not None:  # an answer that waited, counted as unsent
                self.held_back -= waited
                counted = True
            try:
                self._write(response)
            except Exception as err:  # e.g. a header that is not latin-1: still one answer
                log.exception("cannot write an HTTP %d response", response.status)
                self._write(error_response(500, f"internal error: cannot encode response: {err}"))
        if counted:
            self._count_unsent()
        if self.waiting:
            self._release()
        if self.closing and not slots and self.transport is not None:
            if self.refused:
                self._linger()
            else:
                self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer the request being received with an error, after the answers owed before it,
        then close: what the client still sends is not parsed."""
        self.refused = self.closing = True
        self._let_go()
        self.receiving = self.in_head = False
        self.inflater = None
        self.encoded = False
        self.body = []
        self._pause(_REFUSED)
        self.slots.append([error_response(status, message), None])
        self._flush()

    def _write(self, response: HttpResponse) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        close = self.closing and len(self.slots) == 0
        cell = response.wire
        if cell is not None and not close:
            encoded = cell[0]
            if encoded is not None:
                transport.writelines([encoded, *response.body])
                if self.paused & _WRITES:  # over its high water: the server counts it
                    self._count_unsent()
                return
        length = sum(len(b) for b in response.body)
        key = (response.status, response.content_type)
        prefix = _PREFIXES.get(key)
        if prefix is None:
            prefix = (
                f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
                f"Content-Type: {response.content_type}\r\nContent-Length: "
            )
            if len(_PREFIXES) < _MAX_PREFIXES:
                _PREFIXES[key] = prefix
        head = [prefix, str(length), "\r\n"]
        for name, value in response.headers:
            head.append(f"{name}: {value}\r\n")
        if close:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        encoded = "".join(head).encode("latin-1")
        if cell is not None and not close:
            cell[0] = encoded
        if response.head_only:
            transport.write(encoded)
        else:
            transport.writelines([encoded, *response.body])
        if self.paused & _WRITES:  # over its high water: the server counts it
            self._count_unsent()

    # -- flow control and clocks ------------------------------------------------------------
    def _pause(self, why: int) -> None:
        transport = self.transport
        if not self.paused and transport is not None and not transport.is_closing():
            transport.pause_reading()
        self.paused |= why

    def _resume(self, why: int) -> None:
        if not self.paused & why:
            return
        self.paused &= ~why
        transport = self.transport
        if not self.paused and transport is not None and not transport.is_closing():
            transport.resume_reading()
            self.began = _now()  # the time spent paused was ours, not the client's

    def _linger(self) -> None:
        """Half-close after the error answer and drop what still arrives, for a bounded time."""
        transport = self.transport
        if transport is None or self.lingering:
            return
        self.lingering = True
        self._resume(_PENDING | _WRITES | _REFUSED)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._arm(_LINGER_S)

    def _arm(self, delay: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.server.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        """The connection's one clock: header-read deadline, idle deadline, end of lingering."""
        self.timer = None
        transport = self.transport
        if transport is None:
            return
        if self.lingering:
            transport.abort()
            return
        now = _now()
        limits = self.limits
        if self.receiving and not self.paused:
            left = self.began + limits.header_timeout_s - now
            if left <= 0:
                wait = limits.header_timeout_s
                self._refuse(408, f"the request did not arrive whole within {wait:g} s "
                                  "(--http-header-timeout)")  # fmt: skip
                return
            self._arm(left)
        elif self.slots or self.receiving or self.refused:
            self._arm(self.server.tick)
        else:
            if self.idle_count != self.count:  # new requests since last seen idle
                self.idle_count, self.idle_since = self.count, now
            left = self.idle_since + limits.idle_timeout_s - now
            if left > 0:
                self._arm(min(left, self.server.tick))
            elif transport.get_write_buffer_size():
                transport.abort()  # replies nobody reads: close() would wait for them forever
            else:
                transport.close()

    def stalled(self) -> bool:
        """Half-sent (or silent since connecting) through no fault of ours."""
        return (self.receiving or self.count == 0) and not self.paused and not self.slots

    def idle(self) -> bool:
        """Kept alive between requests: every answer written, nothing arriving."""
        return self.count > 0 and not self.receiving and not self.slots and not self.paused

    def drop(self) -> None:
        self.server.open.discard(self)
        if self.transport is not None:
            self.transport.abort()
