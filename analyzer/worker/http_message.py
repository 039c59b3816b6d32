"""The records an HTTP handler sees: one parsed request, one response, and how it answers.

The transport (http_server.py) builds an `HttpRequest` per request and hands it, with a `Respond`
callback, to a `Handler` (the REST API, the metrics endpoint); the handler answers once, at once
or later, with an `HttpResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


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
    # a cell shared by responses whose status, content type, body length and headers are all
    # alike: the transport keeps their encoded HTTP head in it, built once
    wire: list[bytes | None] | None = None
    # an answer to HEAD: its head gives the body's length, the body is not sent (RFC 9110 9.3.2)
    head_only: bool = False


Respond = Callable[[HttpResponse], None]
Handler = Callable[[HttpRequest, Respond], None]


def _error_json(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def error_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, [_error_json(message)])
