"""The request checks of the HTTP transport: what a client sends, bounded by `Limits`.

Off the hot path: the protocol (http_server.py) calls these only when a head may be over its cap,
a body arrives, or a request carries Expect or Content-Encoding. A refusal answers the request
with an error and raises `_Stop`, which ends the parsing of the chunk being fed.
"""

from __future__ import annotations

import zlib

from analyzer.worker.http_message import error_response
from analyzer.worker.http_state import ConnectionState

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Stop(Exception):
    """Raised from a parser callback after the request was refused: stops parsing this chunk."""


class RequestChecks(ConnectionState):
    """Head and body caps, the server-wide budget of bodies still arriving, Expect and
    Content-Encoding.
    Mixed into http_server._Protocol; the state it shares is http_state.ConnectionState."""

    __slots__ = ()

    def _measure_head(self) -> None:
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers.items())
        if size > self.head_cap:
            self._refuse_head()

    def _refuse_head(self) -> None:
        cap = self.head_cap
        if len(self.url) <= cap:
            self._refuse(431, f"request headers exceed the limit of {cap} bytes "
                              "(--http-max-header-size)")  # fmt: skip
        else:
            self._refuse(414, f"request URL exceeds the limit of {cap} bytes "
                              "(--http-max-header-size)")  # fmt: skip
        raise _Stop

    def _trailer_line(self, size: int) -> None:
        """A chunked request's trailer line: the trailers are capped as the head is (they are
        not kept: 800,000 lines were 12.8 MB held)."""
        self.trailer += size
        if self.trailer > self.head_cap:
            self._refuse_trailers()

    def _refuse_trailers(self) -> None:
        self._refuse(431, f"request trailers exceed the limit of {self.head_cap} bytes "
                          "(--http-max-header-size)")  # fmt: skip
        raise _Stop

    def _transfer_encoding(self, value: str) -> None:
        """Chunked alone: the parser takes 'gzip, chunked' too, and would hand the body on
        still gzipped (a lone 'gzip' it refuses itself, 400)."""
        if value.strip().lower() != "chunked":
            self._refuse(400, f"unsupported Transfer-Encoding '{value[:64]}': only chunked "
                              "is supported")  # fmt: skip
            raise _Stop

    def _refuse_body(self, what: str) -> None:
        cap = self.body_cap
        self._refuse(413, f"{what} exceeds the limit of {cap} bytes (--http-max-input-size)")
        raise _Stop

    def _hold(self, n: int) -> None:
        server = self.server
        server.held += n
        self.held += n
        if server.held > server.budget:
            budget = server.budget
            self._refuse(503, f"the server holds {budget} bytes of request bodies still arriving "
                              "(--http-max-buffered-size); retry later")  # fmt: skip
            raise _Stop

    def _let_go(self) -> None:
        self.server.held -= self.held
        self.held = 0

    def _expect(self, value: str) -> None:
        if value.strip().lower() != "100-continue":
            self._refuse(417, f"unsupported Expect '{value}': only 100-continue is known")
            raise _Stop
        # an interim answer must not overtake the answers still owed to earlier requests; a
        # client that gets none sends its body after its own wait
        transport = self.transport
        if not self.slots and self.parser.get_http_version() == "1.1" and transport is not None:
            transport.write(_CONTINUE)

    def _start_inflating(self, encoding: str) -> None:
        name = encoding.strip().lower()
        if name == "gzip":
            self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self.inflater = zlib.decompressobj()
        elif name != "identity":
            self.bad = error_response(400, f"unsupported Content-Encoding '{encoding[:64]}'")
        self.inflated = 0

    def _encoded_body(self, data: bytes) -> None:
        if self.inflater is not None:
            self._inflate(self.inflater, data)
        elif self.bad is None:  # identity: held as a plain body is
            self.body.append(data)
            self._hold(len(data))

    def _inflate(self, inflater: zlib._Decompress, data: bytes) -> None:
        """Inflate as it arrives, asking zlib for at most one byte beyond the cap."""
        room = self.body_cap - self.inflated
        try:
            out = inflater.decompress(data, room + 1)
        except zlib.error as err:
            self._bad_encoding(str(err))
            return
        self.inflated += len(out)
        if self.inflated > self.body_cap:
            self.inflater = None
            self._refuse_body("inflated request body")
        if out:
            self.body.append(out)
            self._hold(len(out))
        if inflater.eof and inflater.unused_data:  # zlib would keep it, uncounted
            self._bad_encoding("data after the end of the compressed stream")

    def _finish_inflating(self, body: bytes) -> bytes:
        inflater, self.inflater = self.inflater, None
        if inflater is not None and not inflater.eof:
            self._bad_encoding("incomplete or truncated stream")
        return body

    def _bad_encoding(self, why: str) -> None:
        encoding = self.headers.get("content-encoding", "").strip().lower()
        self.bad = error_response(400, f"request body is not valid {encoding} data: {why}")
        self.inflater = None
        self.body = []
        self._let_go()  # what was inflated is dropped
