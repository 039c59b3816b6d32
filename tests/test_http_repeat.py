"""Repeated heads: a client that sends the same head again (perf_analyzer, tritonclient) has its
requests routed once and handed on without the parser -- with the same answers, limits and
order as the parser's path, and nothing learned from a chunk whose split is in doubt."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import struct
from contextlib import contextmanager

import numpy as np
import pytest
from serving import EXAMPLES, start_worker

from analyzer.worker import http_server
from analyzer.worker.http_message import HttpRequest, HttpResponse
from analyzer.worker.limits import Limits


def request(path: str, body: bytes, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Transport:
    """What the protocol writes, in order; `is_closing` stays False (the protocol's own state
    decides), `ended` says whether it closed or ended its side."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.ended = False  # write_eof or close: a real transport delivers nothing more

    def writelines(self, parts) -> None:
        self.out.append(b"".join(bytes(p) for p in parts))

    def write(self, data) -> None:  # 100 Continue
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name):
        return None

    def set_write_buffer_limits(self, high=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.ended = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.ended = True

    def bodies(self) -> list[bytes]:
        return [o.split(b"\r\n\r\n", 1)[1] for o in self.out]


class Echo:
    """Answers every request with `<who>:<path>:<body>`; its `route` hands out a second
    handler for /routed paths only, and counts how often it was asked."""

    def __init__(self) -> None:
        self.routes = 0

    def __call__(self, req: HttpRequest, respond) -> None:
        respond(HttpResponse(200, [b"parser:" + req.path.encode() + b":" + bytes(req.body)]))

    def route(self, req: HttpRequest):
        self.routes += 1
        if not req.path.startswith("/routed"):
            return None

        def routed(again: HttpRequest, respond) -> None:
            assert again.headers == req.headers and again.headers is not req.headers
            body = b"routed:" + again.path.encode() + b":" + bytes(again.body)
            respond(HttpResponse(200, [body]))

        return routed


@contextmanager
def connection(limits: Limits | None = None, echo: Echo | None = None):
    """(Echo handler, protocol, transport, server) of one connection, closed afterwards."""
    echo = echo or Echo()
    loop = asyncio.new_event_loop()
    server = http_server._Server(limits or Limits(), loop)
    protocol = http_server._Protocol(echo, server)
    transport = Transport()
    protocol.connection_made(transport)
    try:
        yield echo, protocol, transport, server
    finally:
        server.held = 0
        protocol.connection_lost(None)
        loop.close()


def test_a_repeated_head_is_routed_once_and_each_body_answered_as_sent():
    with connection() as (echo, protocol, transport, _):
        for body in (b"aaa", b"bbb", b"ccc"):
            protocol.data_received(request("/routed/x", body, X_Id="7"))
        assert transport.bodies() == [b"parser:/routed/x:aaa", b"routed:/routed/x:bbb",
                                      b"routed:/routed/x:ccc"]  # fmt: skip
        assert echo.routes == 1 and protocol.repeat.hits == 2
        assert not hasattr(protocol.repeat, "body")  # the first request's body is not kept


def test_anything_but_the_same_head_and_length_goes_through_the_parser():
    with connection() as (echo, protocol, transport, _):
        protocol.data_received(request("/routed/x", b"aaa", X_Id="7"))
        protocol.data_received(request("/routed/x", b"bbb", X_Id="8"))  # another head
        protocol.data_received(request("/routed/x", b"cc", X_Id="8"))  # another length
        again = request("/routed/x", b"ddd", X_Id="8")
        protocol.data_received(again[:20])  # the same request, in two chunks
        protocol.data_received(again[20:])
        # two whole requests in one chunk, with the learned head
        protocol.data_received(request("/routed/x", b"eee", X_Id="8") * 2)
        assert transport.bodies() == [
            b"parser:/routed/x:aaa", b"parser:/routed/x:bbb", b"parser:/routed/x:cc",
            b"parser:/routed/x:ddd", b"parser:/routed/x:eee", b"parser:/routed/x:eee",
        ]  # fmt: skip


@pytest.mark.parametrize("chunk", [
    b"\r\n" + request("/routed/x", b"abc"),  # a blank line before the request line
    request("/routed/x", b"abc") + b"\r\n",  # and after the body
], ids=["leading-crlf", "trailing-crlf"])  # fmt: skip
def test_a_chunk_whose_split_is_in_doubt_is_not_learned(chunk):
    with connection() as (echo, protocol, transport, _):
        protocol.data_received(chunk)
        protocol.data_received(chunk)
        assert transport.bodies() == [b"parser:/routed/x:abc"] * 2
        assert protocol.repeat is None


def test_unrepeatable_heads_and_unrouted_paths_are_not_learned():
    with connection() as (echo, protocol, transport, _):
        body = b"x" * 10
        for _ in range(2):
            protocol.data_received(request("/elsewhere", body))
            protocol.data_received(request("/routed/x", body, Expect="100-continue"))
        assert protocol.repeat is None
        answers = [o for o in transport.out if not o.startswith(b"HTTP/1.1 100")]
        assert len(answers) == 4
        assert all(o.split(b"\r\n\r\n", 1)[1].startswith(b"parser:") for o in answers)


def test_heads_that_never_repeat_are_learned_ever_less_often():
    with connection() as (echo, protocol, transport, _):
        for i in range(300):
            protocol.data_received(request("/routed/x", b"abc", X_Id=f"{i:05d}"))
        assert len(transport.out) == 300
        assert echo.routes < 20  # the gap doubles to 64 while nothing repeats


def test_the_buffered_budget_answers_a_repeated_request_as_the_parser_would():
    with connection(Limits(max_buffered_bytes=100)) as (echo, protocol, transport, server):
        protocol.data_received(request("/routed/x", b"a" * 50))
        protocol.data_received(request("/routed/x", b"b" * 50))
        server.held = 60  # other connections' bodies still arriving
        protocol.data_received(request("/routed/x", b"c" * 50))
        assert transport.out[-1].startswith(b"HTTP/1.1 503")
        assert b"--http-max-buffered-size" in transport.out[-1]
        assert transport.bodies()[:2] == [b"parser:/routed/x:" + b"a" * 50,
                                          b"routed:/routed/x:" + b"b" * 50]  # fmt: skip


# -- through the worker -------------------------------------------------------------------------
def add_sub_request(a: np.ndarray, b: np.ndarray, **headers: str) -> bytes:
    inputs = [{"name": n, "datatype": "FP32", "shape": [1, 4],
               "parameters": {"binary_data_size": 16}} for n in ("INPUT0", "INPUT1")]  # fmt: skip
    outputs = [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")]
    head = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    body = head + a.astype("<f4").tobytes() + b.astype("<f4").tobytes()
    return request("/v2/models/add_sub/infer", body,
                   Inference_Header_Content_Length=str(len(head)), **headers)  # fmt: skip


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    length = int(fields["Content-Length"])
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), fields, rest


def add_sub_outputs(fields: dict[str, str], body: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = int(fields["Inference-Header-Content-Length"])
    values = struct.unpack("<8f", body[n:])
    return np.array(values[:4]), np.array(values[4:])


def test_a_client_repeating_its_head_gets_its_own_answers_from_the_worker():
    rng = np.random.default_rng(3)
    served = start_worker(EXAMPLES, "--load-model=add_sub", "--model-control-mode=explicit",
                          "--http-restricted-api=inference:key=secret")  # fmt: skip
    try:
        host, port = served.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(6):
                a, b = rng.standard_normal(4), rng.standard_normal(4)
                sock.sendall(add_sub_request(a, b, Key="secret"))
                status, fields, body = read_response(sock)
                assert status == 200
                total, difference = add_sub_outputs(fields, body)
                np.testing.assert_allclose(total, a + b, rtol=1e-6)
                np.testing.assert_allclose(difference, a - b, rtol=1e-6)
            # JSON tensors: the same head and length, other values (the body is JSON's to read)
            for first in (1, 7):
                values = {"inputs": [
                    {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [first, 2, 3, 4]}
                    for n in ("INPUT0", "INPUT1")]}  # fmt: skip
                sock.sendall(request("/v2/models/add_sub/infer", json.dumps(values).encode(),
                                     Key="secret"))  # fmt: skip
                status, _, body = read_response(sock)
                assert status == 200
                outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
                assert outputs["OUTPUT0"] == [2 * first, 4, 6, 8]
            # the restriction is checked per head: without its header's value, a 403 as before
            sock.sendall(add_sub_request(a, b, Key="wrong!"))
            status, _, body = read_response(sock)
            assert status == 403 and b"key" in body
    finally:
        served.stop()


# -- a differential fuzz of the short path --------------------------------------------------------
class Mirror(Echo):
    """Answers with all it was given (method, path, query, headers, body). When `learn`, every
    head may be routed to itself, so the short path and the parser answer alike and any
    difference between two connections fed the same bytes is the short path's."""

    def __init__(self, learn: bool) -> None:
        super().__init__()
        self.learn = learn

    def __call__(self, req: HttpRequest, respond) -> None:
        fields = "|".join(f"{k}={v}" for k, v in sorted(req.headers.items()))
        head = f"{req.method} {req.path}?{req.query} {fields} ".encode()
        respond(HttpResponse(200, [head + bytes(req.body)]))

    def route(self, req: HttpRequest):
        self.routes += 1
        return self if self.learn else None


def _stream(rng: random.Random) -> list[bytes]:
    """A client's pipelined requests: mostly a few heads repeated with bodies of their length
    (what perf_analyzer sends), with other lengths, other heads and mutated ones among them."""
    heads = [("/routed/a", {"X_Id": "7"}), ("/routed/b?q=1", {}),
             ("/routed/a", {"Inference_Header_Content_Length": "3"})]  # fmt: skip
    main, out = rng.choice(heads), []
    for _ in range(rng.randrange(5, 40)):
        usual = rng.random() < 0.8
        path, headers = main if usual else rng.choice(heads)
        length = 8 if usual else rng.choice([8, 3, 0, 40])
        one = bytearray(request(path, rng.randbytes(length), **headers))
        what = rng.randrange(20)
        if what == 0:  # a byte flipped (head or body)
            one[rng.randrange(len(one))] = rng.randrange(256)
        elif what == 1:  # a Content-Length that lies
            at = one.find(b"Content-Length: ") + 16
            one[at : one.find(b"\r\n", at)] = str(rng.choice([0, 1, 7, 9, 100])).encode()
        elif what == 2:  # cut short: the requests after it are read out of step
            one = one[: rng.randrange(len(one))]
        elif what == 3:
            one = bytearray(b"\r\n") + one
        out.append(bytes(one))
    return out


def _feed(learn: bool, data: bytes, cuts: list[int]) -> tuple[list[bytes], int]:
    """What a connection answers to `data` received in pieces cut at `cuts`, and how many
    requests took the short path."""
    with connection(echo=Mirror(learn)) as (_, protocol, transport, _):
        at = 0
        for cut in [*cuts, len(data)]:
            if transport.ended:
                break
            protocol.data_received(data[at:cut])
            at = cut
        return transport.out, protocol.repeat.hits if protocol.repeat is not None else 0


def test_the_short_path_answers_every_byte_stream_as_the_parser_does():
    """300 client streams, each fed the same way (a request per read, reads cut anywhere, or all
    at once) to a connection that may learn heads and to one that never does: the answers
    (statuses, heads, bodies, order) must be the same."""
    rng = random.Random(11)
    hits = 0
    for case in range(300):
        requests = _stream(rng)
        data = b"".join(requests)
        how = rng.randrange(3)
        if how == 0:  # one request per read, as perf_analyzer's arrive
            cuts = list(itertools.accumulate(len(r) for r in requests))[:-1]
        elif how == 1:  # reads cut anywhere
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(6))))
        else:  # all at once
            cuts = []
        learned, short = _feed(True, data, cuts)
        plain, _ = _feed(False, data, cuts)
        assert learned == plain, (case, data, cuts)
        hits += short
    assert hits > 100, hits  # the short path did answer a share of them (176 with this seed)


def test_pipelined_requests_are_handed_on_a_burst_per_loop_pass_and_dropped_when_the_client_goes():
    """Requests answered at once never fill the pending cap, so a chunk of thousands of
    pipelined GETs was handled in one go: 20 such clients kept the loop, and every other
    client's answers, for ~10 s, and went on after they had gone. Now a connection hands at
    most BURST requests to the handler per pass of the loop, in order; what it has not handed
    on when the client goes is dropped."""
    burst = http_server.BURST
    with connection() as (echo, protocol, transport, server):
        protocol.data_received(b"".join(request(f"/p/{i}", b"") for i in range(burst * 3 + 5)))
        assert len(transport.out) == burst  # the rest waits for the loop's next passes
        for passes in (1, 2, 3):
            server.loop.call_soon(server.loop.stop)
            server.loop.run_forever()  # one pass: the connection's next burst
            assert len(transport.out) == min(burst * (passes + 1), burst * 3 + 5)
        assert transport.bodies() == [f"parser:/p/{i}:".encode() for i in range(burst * 3 + 5)]
    with connection() as (echo, protocol, transport, server):
        protocol.data_received(b"".join(request(f"/p/{i}", b"") for i in range(burst * 2)))
        protocol.connection_lost(None)
        server.loop.call_soon(server.loop.stop)
        server.loop.run_forever()
        assert len(transport.out) == burst and not protocol.waiting
