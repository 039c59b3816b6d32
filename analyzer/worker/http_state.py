"""The state of one HTTP connection, declared once for the mixins that share it.

http_server._Protocol holds this state in its slots and mixes in the request checks
(http_limits.RequestChecks) and the sending side (http_flow.Flow); each part reads and writes the
others' state and calls a few of their methods. The state's slots live here, with their types,
so that the type checker sees every part against the same names; the methods one part calls on
another are declared for the checker only.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import TYPE_CHECKING, Any

from analyzer.worker.http_message import Handler, HttpRequest, HttpResponse
from analyzer.worker.limits import Limits

if TYPE_CHECKING:
    from analyzer.worker.http_server import _Repeat, _Server

# one request's place in line: [its response once answered, the request until then]
Slot = list[Any]


class ConnectionState:
    handler: Handler
    server: _Server
    limits: Limits
    transport: asyncio.Transport | None
    parser: Any  # httptools.HttpRequestParser (untyped)
    # the request being received
    url: bytes
    headers: dict[str, str]
    body: list[bytes]
    receiving: bool  # a request has begun and is not complete
    in_head: bool  # ... and its head is not complete
    measure: bool  # heads completed now may exceed the cap: measure them
    count: int  # requests begun on this connection
    began: float  # when the request being received (or the connection) began
    raw_head: int  # bytes of whole chunks that fell inside one request's head ...
    raw_count: int  # ... the request `count` they belong to
    # bytes of the trailer lines of a chunked request; -1 outside a chunk's size line and trailers
    trailer: int
    body_bytes: int
    encoded: bool  # this request has a Content-Encoding
    inflater: zlib._Decompress | None
    inflated: int
    bad: HttpResponse | None  # the answer to this request, decided early
    held: int  # bytes of the body being received, counted in the server's budget
    unsent: int  # bytes of replies the client has not read, counted in the server's `unsent`
    # (-1: closed for holding the most)
    held_back: int  # bytes of answers waiting for an earlier request's (answers go in order)
    # the caps, read on every request
    head_cap: int
    body_cap: int
    pending_cap: int
    length_digits: int
    # answers, in request order
    slots: deque[Slot]
    waiting: deque[Slot]  # the tail of `slots` not yet handed to the handler
    releasing: bool
    burst: int  # requests handed to the handler in this loop pass (at most http_flow.BURST)
    next_pass: asyncio.Handle | None  # the next pass's release, when one is due
    closing: bool  # close once every slot is answered
    refused: bool  # an error ends this connection: what the client sends is dropped
    lingering: bool
    paused: int  # why reading is paused (http_flow's bits)
    # the clock
    timer: asyncio.TimerHandle | None
    idle_count: int  # `count` when the timer last saw the connection idle ...
    idle_since: float  # ... and since when
    # repeated heads
    repeat: _Repeat | None
    learned: HttpRequest | None
    relearn: int

    __slots__ = tuple(__annotations__)  # every name declared above, and only those

    if TYPE_CHECKING:  # each defined by one of the parts, called by the others

        def _refuse(self, status: int, message: str) -> None: ...  # http_flow

        def _flush(self) -> None: ...  # http_flow

        def _pause(self, why: int) -> None: ...  # http_flow

        def _resume(self, why: int) -> None: ...  # http_flow

        def _arm(self, delay: float) -> None: ...  # http_flow

        def _let_go(self) -> None: ...  # http_limits

        def _release(self) -> None: ...  # http_server

        def drop(self) -> None: ...  # http_flow
