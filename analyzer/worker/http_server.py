"""A small HTTP/1.1 server on asyncio + httptools: the transport under the KServe v2 REST API.

Written for the hot path: request bodies stay as the received bytes (tensors become numpy views of
them), responses go out with one `writelines` of header, JSON and raw tensor blobs, TCP_NODELAY is
on (without it Nagle + delayed ACK add ~40 ms to small responses), and a handler answers either at
once or later through a callback, so no coroutine is created per request. Pipelined requests on one
connection are answered in order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

from analyzer.worker.limits import Limits

log = logging.getLogger(__name__)


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes | memoryview
    # called once, on the event loop, if the client disconnects before this request is answered
    disconnect_hooks: list[Callable[[], None]] = field(default_factory=list)

    def on_disconnect(self, hook: Callable[[], None]) -> None:
        self.disconnect_hooks.append(hook)


@dataclass(slots=True)
class HttpResponse:
    status: int = 200
    body: Sequence[bytes | memoryview] = ()
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Respond = Callable[[HttpResponse], None]
Handler = Callable[[HttpRequest, Respond], None]

_REASONS = {s.value: s.phrase for s in HTTPStatus}


class _Protocol(asyncio.Protocol):
    __slots__ = ("handler", "transport", "parser", "url", "headers", "body", "slots", "closing")

    def __init__(self, handler: Handler):
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.slots: deque[list] = deque()
        self.closing = False

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply_now(HttpResponse(400, [b'{"error":"protocol upgrade is not supported"}']))
        except httptools.HttpParserError as err:
            self.closing = True
            self._reply_now(HttpResponse(400, [_error_json(f"malformed HTTP request: {err}")]))

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body: bytes = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        if not self.parser.should_keep_alive():
            self.closing = True
        url = self.url.decode("latin-1")
        path, _, query = url.partition("?")
        slot: list = [None]
        self.slots.append(slot)
        encoding = self.headers.get("content-encoding")
        if encoding:
            try:
                body = _decompress(body, encoding)
            except ValueError as err:
                self._fill(slot, HttpResponse(400, [_error_json(str(err))]))
                return
        request = HttpRequest(self.parser.get_method().decode(), path, query, self.headers, body)
        try:
            self.handler(request, lambda response: self._fill(slot, response))
        except Exception as err:  # a handler bug must not kill the connection silently
            log.exception("HTTP handler failed for %s %s", request.method, path)
            self._fill(slot, HttpResponse(500, [_error_json(f"internal error: {err}")]))

    # -- responses --------------------------------------------------------------------------
    def _fill(self, slot: list, response: HttpResponse) -> None:
        slot[0] = response
        while self.slots and self.slots[0][0] is not None:
            self._write(self.slots.popleft()[0])
        if self.closing and not self.slots and self.transport is not None:
            self.transport.close()

    def _reply_now(self, response: HttpResponse) -> None:
        self._write(response)
        if self.transport is not None:
            self.transport.close()

    def _write(self, response: HttpResponse) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        length = sum(len(b) for b in response.body)
        head = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n",
            f"Content-Type: {response.content_type}\r\nContent-Length: {length}\r\n",
        ]
        for name, value in response.headers:
            head.append(f"{name}: {value}\r\n")
        if self.closing:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        transport.writelines([("".join(head)).encode("latin-1"), *response.body])


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    try:
        if encoding == "gzip":
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            return zlib.decompress(body)
    except zlib.error as err:
        raise ValueError(f"request body is not valid {encoding} data: {err}") from None
    if encoding == "identity":
        return body
    raise ValueError(f"unsupported Content-Encoding '{encoding}'")


def _error_json(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def start_http_server(
    handler: Handler, host: str, port: int, limits: Limits | None = None
) -> asyncio.AbstractServer:
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Protocol(handler), host, port, reuse_address=True, backlog=1024
    )


def error_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, [_error_json(message)])
