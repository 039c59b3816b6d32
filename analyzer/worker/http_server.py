"""A small HTTP/1.1 server on asyncio + httptools: the transport under the KServe v2 REST API.

Written for the hot path: request bodies stay as the received bytes (tensors become numpy views of
them), responses go out with one `writelines` of header, JSON and raw tensor blobs, TCP_NODELAY is
on (without it Nagle + delayed ACK add ~40 ms to small responses), and a handler answers either at
once or later through a callback, so no coroutine is created per request. Pipelined requests on one
connection are answered in order, each exactly once.

Everything a client controls is bounded by `Limits`: body bytes (raw and inflated), head bytes,
the time a request may take to arrive, idle time, connections, unanswered pipelined requests and
unread reply bytes. The checks cost a request a few integer compares; the clocks are one timer per
connection that re-arms itself from timestamps, so nothing is scheduled per request.

Clients repeat their heads byte for byte (perf_analyzer, tritonclient): a chunk that holds one
whole request, with the head of the last one learned on this connection and the same length, is
handed to the handler that request was routed to (`handler.route`), without the parser or the
router. Only a split the parser itself would make is learned (CRLF lines, the first blank line
where the body begins, nothing before or after), so the same bytes are the same request; anything
else goes through the parser. On tiny_cnn at client batch 1 this was 3% of the served throughput
(BENCHMARKS.md).

The protocol here receives and dispatches; it mixes in the request checks (http_limits.py) and the
sending side and clock (http_flow.py), all three over one connection state (http_state.py). The
records a handler sees are in http_message.py.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import sys
from collections import deque
from dataclasses import replace
from typing import cast

import httptools

from analyzer.worker.http_flow import _PENDING, _WRITES, Flow, _now
from analyzer.worker.http_limits import RequestChecks, _Stop
from analyzer.worker.http_message import Handler, HttpRequest, Respond, error_response
from analyzer.worker.http_state import Slot
from analyzer.worker.limits import Limits, UnsentReplies, reply_high_water

log = logging.getLogger(__name__)

# descriptors the process needs besides client connections (models, stubs, logs, gRPC)
_FD_RESERVE = 256
# per request this would be rebuilt: header names as received -> lower-case str; bounded, as
# header names are the client's to choose
_HEADER_NAMES: dict[bytes, str] = {}
_MAX_HEADER_NAMES = 256


class _Server:
    """What the connections of one listening socket share: the limits and who is open."""

    __slots__ = ("limits", "loop", "open", "tick", "held", "budget", "unsent")

    def __init__(self, limits: Limits, loop: asyncio.AbstractEventLoop):
        self.limits = limits
        self.loop = loop
        self.open: set[_Protocol] = set()
        # one timer period serves both clocks: a request that starts mid-period is still caught
        # at its own deadline, because the timer re-arms to that deadline
        self.tick = min(limits.header_timeout_s, limits.idle_timeout_s)
        # bytes of request bodies still arriving, over all connections: many half-sent bodies
        # each under the body cap must not add up to more memory than the machine has
        self.held = 0
        self.budget = limits.max_buffered_bytes
        # replies the clients have not read, all connections together
        self.unsent = UnsentReplies(limits.max_unsent_bytes, loop)

    def admit(self, conn: _Protocol) -> bool:
        """At the cap, the longest-stalled half-sent connection makes room, else the one idle
        longest between requests; else no room. (Idle kept-alive connections were never given
        up: one client holding every slot with them kept all others out for as long as it
        liked, --http-idle-timeout at a time.)"""
        if len(self.open) >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                return False
            victim.drop()
        self.open.add(conn)
        return True

    def _victim(self) -> _Protocol | None:
        stalled = idle = None
        for conn in self.open:
            if conn.stalled():
                if stalled is None or conn.began < stalled.began:
                    stalled = conn
            elif stalled is None and conn.idle() and (idle is None or conn.began < idle.began):
                idle = conn
        return stalled or idle


class _Protocol(RequestChecks, Flow, asyncio.Protocol):
    __slots__ = ()  # the state's slots: http_state.ConnectionState

    def __init__(self, handler: Handler, server: _Server):
        self.handler = handler
        self.server = server
        limits = self.limits = server.limits
        # the caps, read on every request, kept here to save a lookup each
        self.head_cap = limits.max_header_bytes
        self.body_cap = limits.max_input_bytes
        self.pending_cap = limits.max_pending_per_connection
        self.length_digits = len(str(limits.max_input_bytes))  # fewer: surely under the cap
        self.held = 0  # bytes of the body being received, counted in the server's budget
        self.unsent = 0  # bytes of unread replies, counted in the server's `unsent`
        self.held_back = 0  # bytes of answers waiting for an earlier request's
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers = {}
        self.body = []
        # one [response, request] per request in arrival order; answered from the front
        self.slots = deque()
        # the tail of `slots` not yet handed to the handler: too many unanswered, or replies unread
        self.waiting = deque()
        self.releasing = False
        self.burst = 0  # requests handed to the handler in this loop pass
        self.next_pass = None
        self.closing = False  # close once every slot is answered
        self.refused = False  # an error ends this connection: what the client sends is dropped
        self.lingering = False
        self.paused = 0  # _PENDING (requests waiting) | _WRITES | _REFUSED
        self.receiving = False  # a request has begun and is not complete
        self.in_head = False  # ... and its head is not complete
        self.measure = False  # heads completed now may exceed the cap: measure them
        self.count = 0  # requests begun on this connection
        self.began = 0.0  # when the request being received (or the connection) began
        self.idle_count = 0  # `count` when the timer last saw the connection idle ...
        self.idle_since = 0.0  # ... and since when
        self.raw_head = 0  # bytes of whole chunks that fell inside one request's head ...
        self.raw_count = 0  # ... the request `count` they belong to
        self.trailer = -1  # bytes of a chunked request's trailers (-1: not in them)
        self.body_bytes = 0
        self.encoded = False  # this request has a Content-Encoding
        self.inflater = None  # zlib decompressobj for a Content-Encoding body
        self.inflated = 0
        self.bad = None  # the answer to this request, decided early
        self.timer = None
        self.repeat = None  # the head this client repeats, and where it goes
        self.learned = None  # a request that may become `repeat`
        self.relearn = 0  # `count` from which a request may be learned again

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # a stream server's connection
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.began = self.idle_since = _now()
        if not self.server.admit(self):
            cap = self.limits.max_connections
            self._refuse(503, f"the server is at its limit of {cap} open connections "
                              "(--http-max-connections); retry later")  # fmt: skip
            return
        transport.set_write_buffer_limits(high=reply_high_water(self.limits))
        self._arm(self.server.tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.open.discard(self)
        self.held_back = 0
        if self.unsent > 0:
            self.server.unsent.count(self, 0)
        self._let_go()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport = None
        if self.next_pass is not None:
            self.next_pass.cancel()
            self.next_pass = None
        self.waiting.clear()  # not handed to the handler: nobody is left to answer
        slots, self.slots = self.slots, deque()
        for response, request in slots:
            if response is None and request is not None:
                _run_disconnect_hooks(request)

    def pause_writing(self) -> None:
        self._pause(_WRITES)
        self._count_unsent()

    def resume_writing(self) -> None:
        self.server.unsent.count(self, self.held_back)
        self._resume(_WRITES)
        if self.waiting:
            self._release()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # the answer is out or queued; the rest of this client's bytes go nowhere
        self.burst = 0
        repeat = self.repeat
        if (repeat is not None and len(data) == repeat.size and not self.receiving
                and data.startswith(repeat.head) and self._repeated(data, repeat)):  # fmt: skip
            return
        fresh = not self.receiving
        count = self.count
        try:
            # a head that ends in the chunk it began in is no longer than the chunk: only a chunk
            # longer than the cap, or one that goes on a head, needs the head measured
            if self.in_head or len(data) > self.head_cap or self.trailer >= 0:
                self._feed_measured(data)
            else:
                self.parser.feed_data(data)
        except _Stop:
            pass  # refused between two feeds
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrade is not supported")
        except httptools.HttpParserCallbackError as err:
            if not self.refused:  # a bug of ours, not a bad request
                log.error("HTTP parser callback failed", exc_info=err.__context__)
                self._refuse(500, f"internal error: {err.__context__}")
        except httptools.HttpParserError as err:
            self._refuse(400, f"malformed HTTP request: {err}")
        learned, self.learned = self.learned, None
        if learned is not None and fresh and self.count == count + 1 and not self.receiving \
                and not self.refused:  # fmt: skip
            self._learn(learned, data)

    # -- repeated heads ---------------------------------------------------------------------
    def _learn(self, request: HttpRequest, data: bytes) -> None:
        """`data` held exactly `request`, whole: if its head is where the body's length says,
        a later chunk with the same head and length is the same request with another body."""
        router = getattr(self.handler, "route", None)
        if router is None:
            return
        cut = len(data) - len(request.body)
        head = bytes(data[:cut])
        # lines end in CRLF alone and the first blank line, which ends a head, is where the
        # body begins: the split is the parser's
        if (cut < 16 or head.find(b"\r\n\r\n") != cut - 4
                or head.count(b"\n") != head.count(b"\r\n")
                or not head.startswith(request.method.encode("latin-1") + b" ")):  # fmt: skip
            return
        # a client whose heads vary is not learned from on every request: the gap doubles
        # while what was learned goes unused
        old = self.repeat
        gap = 1 if old is None or old.hits else min(old.gap * 2, _MAX_LEARN_GAP)
        self.relearn = self.count + gap
        handler = router(request)
        self.repeat = _Repeat(head, len(data), request, handler, gap) if handler else None

    def _repeated(self, data: bytes, repeat: _Repeat) -> bool:
        """A chunk that repeats the learned head: the request without the parser or routing.
        Declined (the parser takes it) when the bodies arriving over all connections would
        pass their budget, so that the budget's answer is the parser's."""
        server = self.server
        body = memoryview(data)[len(repeat.head):]
        if server.held + len(body) > server.budget:
            return False
        self.count += 1
        self.began = _now()
        repeat.hits += 1
        request = HttpRequest(repeat.method, repeat.path, repeat.query, repeat.headers.copy(), body)
        self._accept(request, repeat.handler)
        return True

    def _feed_measured(self, data: bytes) -> None:
        """Feed with heads measured when complete; httptools buffers a header until it is whole,
        so a head that never ends is capped from the chunks that fell entirely inside it."""
        count, inside = self.count, self.in_head
        trailing, body = self.trailer >= 0, self.body_bytes  # after a chunk's size line
        self.measure = True
        self.parser.feed_data(data)
        if not self.in_head:
            self.measure = False
            # no body came: the chunk fell inside the trailers (a line httptools buffers)
            if trailing and self.trailer >= 0 and self.count == count \
                    and self.body_bytes == body and not self.refused:  # fmt: skip
                if self.raw_count != -count:  # (negative: the trailers', not the head's)
                    self.raw_count, self.raw_head = -count, 0
                self.raw_head += len(data)
                if self.raw_head > self.head_cap:
                    self._refuse_trailers()
        elif inside and self.count == count and not self.refused:
            if self.raw_count != count:
                self.raw_count, self.raw_head = count, 0
            self.raw_head += len(data)
            if self.raw_head > self.head_cap:
                self._refuse_head()

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []
        self.count += 1
        self.receiving = self.in_head = True
        self.began = _now()
        self.body_bytes = 0
        self.trailer = -1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.trailer >= 0:  # a trailer: counted against the head's cap, not kept
            self._trailer_line(len(name) + len(value) + 4)
            return
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _MAX_HEADER_NAMES:
                _HEADER_NAMES[name] = key
        text = value.decode("latin-1")
        if key == "transfer-encoding" and key in self.headers:  # the parser reads them joined
            text = f"{self.headers[key]}, {text}"
        self.headers[key] = text

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.measure:
            self._measure_head()
        headers = self.headers
        length = headers.get("content-length")
        if length is not None and len(length) >= self.length_digits:
            if int(length) > self.body_cap:
                self._refuse_body(f"request body of {int(length)} bytes")
        if "transfer-encoding" in headers:
            self._transfer_encoding(headers["transfer-encoding"])
        if "content-encoding" in headers:
            self.encoded = True
            self._start_inflating(headers["content-encoding"])
        if "expect" in headers:
            self._expect(headers["expect"])

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.body_cap:
            self._refuse_body("request body")
        if self.encoded:
            self._encoded_body(body)
        else:
            self.body.append(body)
            self._hold(len(body))

    def on_chunk_header(self) -> None:
        self.trailer = 0  # a chunk's size line: its body, or the trailers after the last one

    def on_chunk_complete(self) -> None:
        self.trailer = -1

    def on_message_complete(self) -> None:
        self.receiving = False
        if self.held:
            self._let_go()  # handed over: from here the model's queue bounds it
        headers = self.headers
        method = self.parser.get_method()
        if ("upgrade" in headers or method == b"CONNECT") and self.parser.should_upgrade():
            return  # refused once the parser stops at it (HttpParserUpgrade): one answer
        body: bytes = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        if not self.parser.should_keep_alive():
            self.closing = True
        if self.encoded:
            self.encoded = False
            body = self._finish_inflating(body)
            if self.bad is not None:
                bad, self.bad = self.bad, None
                slot: Slot = [bad, None]
                self.slots.append(slot)
                self._flush()
                return
        url = self.url.decode("latin-1")
        path, _, query = url.partition("?")
        request = HttpRequest(method.decode(), path, query, headers, body)
        if (body and self.count >= self.relearn and not self.closing
                and "content-length" in headers and not _UNREPEATABLE & headers.keys()):
            self.learned = request  # fmt: skip
        self._accept(request, _head_only(self.handler) if method == b"HEAD" else self.handler)

    def _accept(self, request: HttpRequest, handler: Handler) -> None:
        """A whole request: handed to `handler` now, or queued while too many are unanswered."""
        slot: Slot = [None, request]
        self.slots.append(slot)
        if self.paused or len(self.slots) > self.pending_cap or self.burst >= BURST:
            # parsing cannot stop inside a chunk, so the rest of it waits here, unhandled
            self.waiting.append(slot)
            self._pause(_PENDING)
            if self.burst >= BURST:
                self._pass_later()
            return
        self.burst += 1
        try:  # _dispatch, inlined: this is the hot path
            handler(request, lambda response: self._fill(slot, response))
        except Exception as err:  # a handler bug must not leave the request unanswered
            log.exception("HTTP handler failed for %s %s", request.method, request.path)
            self._fill(slot, error_response(500, f"internal error: {err}"))

    def _dispatch(self, slot: Slot) -> None:
        request = slot[1]
        handler = _head_only(self.handler) if request.method == "HEAD" else self.handler
        try:
            handler(request, lambda response: self._fill(slot, response))
        except Exception as err:  # a handler bug must not leave the request unanswered
            log.exception("HTTP handler failed for %s %s", request.method, request.path)
            self._fill(slot, error_response(500, f"internal error: {err}"))

    def _release(self) -> None:
        """Hand waiting requests to the handler while the client reads and few are unanswered."""
        if self.releasing:
            return  # a handler that answered at once: the loop below goes on
        self.releasing = True
        waiting, slots = self.waiting, self.slots
        cap = self.pending_cap
        try:
            while waiting and not self.paused & _WRITES and len(slots) - len(waiting) < cap:
                if self.burst >= BURST:
                    self._pass_later()
                    break
                self.burst += 1
                self._dispatch(waiting.popleft())
        finally:
            self.releasing = False
        if not waiting:
            self._resume(_PENDING)

    def _pass_later(self) -> None:
        """This pass handed BURST requests to the handler: the rest wait for the loop's next
        pass, after the other connections' turn. Requests answered at once never fill the
        pending cap, so one chunk of thousands of pipelined GETs was handled in one go, and 20
        such clients kept the loop (and everyone's answers) for ~10 s."""
        if self.next_pass is None and self.transport is not None:
            self.next_pass = self.server.loop.call_soon(self._next_pass)

    def _next_pass(self) -> None:
        self.next_pass = None
        self.burst = 0
        if self.transport is not None and self.waiting:
            self._release()


BURST = 64  # requests one connection hands to the handler in one pass of the loop

# headers after which the same head need not mean the same request (or a body as received)
_UNREPEATABLE = frozenset(("transfer-encoding", "content-encoding", "expect"))
_MAX_LEARN_GAP = 64


class _Repeat:
    """A head a client sends again and again (perf_analyzer and tritonclient repeat theirs
    byte for byte) and the handler its request was routed to."""

    __slots__ = ("head", "size", "method", "path", "query", "headers", "handler", "gap", "hits")

    def __init__(self, head: bytes, size: int, request: HttpRequest, handler: Handler, gap: int):
        self.head = head
        self.size = size  # head and body: a chunk of this length holds the request whole
        # what the head said, not the request: its body is not kept
        self.method, self.path, self.query = request.method, request.path, request.query
        self.headers = dict(request.headers)
        self.handler = handler
        self.gap = gap  # requests between the learning of this and the one before
        self.hits = 0


def _head_only(handler: Handler) -> Handler:
    """HEAD answered as GET would be, without the body (RFC 9110 9.3.2): a body after it
    would be read as the start of the next answer on a kept-alive connection."""

    def answer(request: HttpRequest, respond: Respond) -> None:
        handler(request, lambda response: respond(replace(response, head_only=True, wire=None)))

    return answer


def _run_disconnect_hooks(request: HttpRequest) -> None:
    hooks, request.disconnect_hooks = request.disconnect_hooks, []
    for hook in hooks:
        try:
            hook()
        except Exception:  # one failing hook must not keep the others from running
            log.exception("disconnect hook failed for %s %s", request.method, request.path)


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE toward the hard limit, so that the connection cap, not EMFILE,
    is what turns clients away; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


async def start_http_server(
    handler: Handler, host: str, port: int, limits: Limits | None = None
) -> asyncio.Server:
    limits = limits or Limits()
    wanted = limits.max_connections + _FD_RESERVE
    soft = raise_open_file_limit(wanted)
    if soft < wanted:
        print(f"warning: the open-file limit ({soft}) is below --http-max-connections "
              f"({limits.max_connections}) plus {_FD_RESERVE} for the worker itself; "
              "connections beyond it wait in the listen queue", file=sys.stderr)  # fmt: skip
    loop = asyncio.get_running_loop()
    server = _Server(limits, loop)
    return await loop.create_server(
        lambda: _Protocol(handler, server), host, port, reuse_address=True, backlog=1024
    )
