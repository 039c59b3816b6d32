"""HTTP transport bounds (issue 12): body, inflated body, head, timeouts, connections, backpressure,
Expect: 100-continue and client disconnects, against a real worker and real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import resource
import select
import socket
import threading
import time
import zlib
from collections.abc import Iterable, Iterator

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from serving import EXAMPLES, start_worker

from analyzer.loadgen.shard import Shard, ShardConfig
from analyzer.worker.http_message import HttpRequest, HttpResponse
from analyzer.worker.http_server import raise_open_file_limit, start_http_server
from analyzer.worker.limits import Limits

GIB = 1 << 30
MIB = 1 << 20
ADD_SUB = "/v2/models/add_sub/infer"
ADD_SUB_JSON = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [4, 3, 2, 1]},
        ]
    }
).encode()


# -- helpers -----------------------------------------------------------------------------------
def request_bytes(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Raw:
    """A plain client socket that reads HTTP/1.1 responses one by one."""

    def __init__(self, address: str, timeout: float = 30):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self, within: float) -> bool:
        return closed_by_server(self.sock, within)

    def close(self) -> None:
        self.sock.close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True once the server closed (EOF or reset), waiting at most `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                if not sock.recv(1 << 16):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
        if time.monotonic() > deadline:
            return False


def send_until_answered(address: str, head: bytes, pieces: Iterable[bytes]):
    """Stream a body until the server answers; returns (bytes of body sent, response or None).

    The server refuses before the body ends and then closes, so a write may fail with a reset:
    the answer is read if it arrived."""
    conn = Raw(address)
    sent = 0
    try:
        conn.send(head)
        for piece in pieces:
            if select.select([conn.sock], [], [], 0)[0]:
                break  # answered early: stop sending
            try:
                conn.send(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        try:
            return sent, conn.response()
        except (ConnectionError, OSError):
            return sent, None
    finally:
        conn.close()


def chunked(total: int, size: int = MIB) -> Iterator[bytes]:
    block = b"x" * size
    frame = f"{size:x}\r\n".encode() + block + b"\r\n"
    for _ in range(total // size):
        yield frame
    yield b"0\r\n\r\n"


class PeakRss:
    """Samples a process's RSS every 50 ms in a thread; `peak` is the largest seen."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self.start = self.peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self.process.memory_info().rss)


def assert_serves(served, timeout: float = 60) -> None:
    client = httpclient.InferenceServerClient(
        served.http, connection_timeout=timeout, network_timeout=timeout
    )
    try:
        a = np.arange(4, dtype=np.float32).reshape(1, 4)
        inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


@contextlib.contextmanager
def worker(repository, *args: str):
    served = start_worker(repository, *args)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def served():
    """A worker with the default limits (64 MiB bodies, 64 KiB heads, 4096 connections)."""
    with worker(EXAMPLES) as s:
        yield s


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzipped while streaming (about 1 MB)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(MIB)
    parts = [packer.compress(block) for _ in range(GIB // MIB)]
    parts.append(packer.flush())
    return b"".join(parts)


# -- body size ---------------------------------------------------------------------------------
def test_3gib_chunked_body_is_refused_with_bounded_memory(served):
    head = (f"POST {ADD_SUB} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    with PeakRss(served.process.pid) as rss:
        sent, response = send_until_answered(served.http, head, chunked(3 * GIB))
    assert response is not None, "no answer to the 3 GiB body"
    status, _, body = response
    assert status == 413 and "exceeds the limit of 67108864 bytes" in error_of(body)
    assert sent < GIB  # refused at the cap, not after reading it all
    print(f"peak worker RSS {rss.peak / MIB:.0f} MiB")  # shown with -s: the figure behind the bound
    assert rss.peak < GIB, f"worker RSS reached {rss.peak / MIB:.0f} MiB"
    assert_serves(served)


def test_content_length_over_the_cap_is_refused_before_the_body(served):
    conn = Raw(served.http)
    try:
        conn.send(f"POST {ADD_SUB} HTTP/1.1\r\nContent-Length: {3 * GIB}\r\n\r\n".encode())
        status, headers, body = conn.response()  # no body was sent: the header alone decides
        assert status == 413 and headers["connection"] == "close"
        assert "3221225472 bytes exceeds the limit of 67108864" in error_of(body)
    finally:
        conn.close()


def test_1gib_gzip_bomb_is_refused_with_bounded_memory(served, gzip_bomb):
    head = (
        f"POST {ADD_SUB} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(gzip_bomb)}\r\n\r\n"
    ).encode()
    pieces = (gzip_bomb[i : i + 65536] for i in range(0, len(gzip_bomb), 65536))
    with PeakRss(served.process.pid) as rss:
        _, response = send_until_answered(served.http, head, pieces)
    assert response is not None, "no answer to the gzip bomb"
    status, _, body = response
    assert status == 413 and "inflated request body exceeds" in error_of(body)
    print(f"peak worker RSS {rss.peak / MIB:.0f} MiB")  # shown with -s: the figure behind the bound
    assert rss.peak < GIB, f"worker RSS reached {rss.peak / MIB:.0f} MiB"
    assert_serves(served)


def test_compressed_bodies_inflate_and_bad_ones_get_400_on_a_live_connection(served):
    conn = Raw(served.http)
    try:
        for encoding, data in (("gzip", gzip.compress(ADD_SUB_JSON)),
                               ("deflate", zlib.compress(ADD_SUB_JSON))):  # fmt: skip
            conn.send(request_bytes("POST", ADD_SUB, data, {"Content-Encoding": encoding}))
            status, _, body = conn.response()
            assert status == 200, body
            assert json.loads(body)["outputs"][0]["data"] == [5, 5, 5, 5]
        conn.send(request_bytes("POST", ADD_SUB, b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}))
        status, _, body = conn.response()
        assert status == 400 and "not valid gzip data" in error_of(body)
        truncated = gzip.compress(ADD_SUB_JSON)[:-8]
        conn.send(request_bytes("POST", ADD_SUB, truncated, {"Content-Encoding": "gzip"}))
        status, _, body = conn.response()
        assert status == 400 and "truncated" in error_of(body)
        conn.send(request_bytes("POST", ADD_SUB, b"abc", {"Content-Encoding": "br"}))
        status, _, body = conn.response()
        assert status == 400 and "unsupported Content-Encoding 'br'" in error_of(body)
        conn.send(request_bytes("GET", "/v2/health/live"))  # the connection is still usable
        assert conn.response()[0] == 200
    finally:
        conn.close()


# -- head size ---------------------------------------------------------------------------------
def test_long_url_and_long_headers_are_refused(served):
    status, _, body = send_until_answered(
        served.http, request_bytes("GET", "/v2/models/" + "a" * 70000), ()
    )[1]
    assert status == 414 and "URL exceeds the limit of 65536 bytes" in error_of(body)
    many = {f"X-Filler-{i}": "v" * 1000 for i in range(80)}
    status, _, body = send_until_answered(
        served.http, request_bytes("GET", "/v2/health/live", headers=many), ()
    )[1]
    assert status == 431 and "headers exceed the limit of 65536 bytes" in error_of(body)
    # one header that never ends: httptools would buffer it whole, so whole chunks are counted
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Endless: "
    sent, response = send_until_answered(served.http, head, (b"v" * 65536 for _ in range(1024)))
    assert response is not None and response[0] == 431 and sent < 64 * MIB
    assert_serves(served)


# -- Expect: 100-continue ----------------------------------------------------------------------
def test_expect_100_continue_is_honoured(served):
    conn = Raw(served.http)
    try:
        head = request_bytes("POST", ADD_SUB, ADD_SUB_JSON, {"Expect": "100-continue"})
        head = head[: len(head) - len(ADD_SUB_JSON)]
        conn.send(head)
        assert conn.response()[0] == 100  # before any body byte was sent
        conn.send(ADD_SUB_JSON)
        status, _, body = conn.response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [5, 5, 5, 5]
    finally:
        conn.close()
    too_big = (f"POST {ADD_SUB} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               f"Content-Length: {GIB}\r\n\r\n").encode()  # fmt: skip
    status, _, body = send_until_answered(served.http, too_big, ())[1]
    assert status == 413  # no 100 first: the client need not send the body at all
    odd = request_bytes("POST", ADD_SUB, ADD_SUB_JSON, {"Expect": "something-else"})
    status, _, body = send_until_answered(served.http, odd, ())[1]
    assert status == 417 and "something-else" in error_of(body)


# -- backpressure ------------------------------------------------------------------------------
def tiny_cnn_request(batch: int = 32) -> bytes:
    blob = np.ones((batch, 3, 32, 32), np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT__0",
                    "datatype": "FP32",
                    "shape": [batch, 3, 32, 32],
                    "parameters": {"binary_data_size": len(blob)},
                },  # fmt: skip
            ],
            "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return request_bytes(
        "POST", "/v2/models/tiny_cnn/infer", header + blob,
        {"Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip


def test_pipelining_client_that_never_reads_keeps_memory_bounded(served):
    one = tiny_cnn_request()  # ~384 KiB in, 1.3 KiB out
    conn = Raw(served.http, timeout=3)
    sent = 0
    deadline = time.monotonic() + 10
    with PeakRss(served.process.pid) as rss:
        try:
            while sent < 2500 and time.monotonic() < deadline:  # up to ~1 GiB
                conn.send(one)
                sent += 1
        except TimeoutError:
            pass  # the worker stopped reading from us
        assert_serves(served)  # other clients are served meanwhile
        conn.close()
    growth = rss.peak - rss.start
    assert growth < 512 * MIB, f"worker RSS grew {growth / MIB:.0f} MiB over {sent} requests"
    assert_serves(served)


# -- timeouts ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def impatient():
    with worker(EXAMPLES, "--http-header-timeout=1", "--http-idle-timeout=2") as s:
        yield s


@pytest.mark.parametrize(
    "partial",
    [
        b"GET /v2/health/live HTTP/1.1\r\nHo",
        request_bytes("POST", ADD_SUB, ADD_SUB_JSON)[:-10],
    ],  # fmt: skip
    ids=["head", "body"],
)
def test_half_sent_request_times_out(impatient, partial):
    conn = Raw(impatient.http)
    try:
        conn.send(partial)
        status, _, body = conn.response()
        assert status == 408 and "within 1 s (--http-header-timeout)" in error_of(body)
        assert conn.closed_by_server(within=15)
    finally:
        conn.close()


def test_idle_connection_is_closed_and_a_busy_one_is_not(impatient):
    conn = Raw(impatient.http)
    try:
        for _ in range(3):  # requests 1 s apart keep it open past the 2 s idle limit
            conn.send(request_bytes("GET", "/v2/health/live"))
            assert conn.response()[0] == 200
            time.sleep(1)
        assert conn.closed_by_server(within=15)
    finally:
        conn.close()


def test_loadgen_reconnects_after_the_server_closes_an_idle_connection(impatient):
    payload = request_bytes("POST", ADD_SUB, ADD_SUB_JSON)
    port = int(impatient.http.rsplit(":", 1)[1])

    async def run() -> Shard:
        shard = Shard(ShardConfig("http", "127.0.0.1", port, [payload]))
        await shard.open()
        await shard.request()
        deadline = time.monotonic() + 15
        while shard.idle and time.monotonic() < deadline:  # until the worker closed it
            await asyncio.sleep(0.1)
        assert not shard.idle, "the idle connection was not closed by the worker"
        await shard.request()
        return shard

    shard = asyncio.run(run())
    assert not shard.errors and shard.c_ok == [True, True] and shard.connections == 2


# -- connections -------------------------------------------------------------------------------
def half_sent(address: str, count: int) -> list[socket.socket]:
    host, port = address.rsplit(":", 1)
    partial = request_bytes("POST", ADD_SUB, ADD_SUB_JSON)[:-20]
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=30)
            socks.append(sock)
            sock.sendall(partial)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


@pytest.fixture
def many_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4500:
        pytest.fail(f"the hard open-file limit ({hard}) is too low for 2,000 connections")
    raise_open_file_limit(4500)
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_2000_half_sent_connections_do_not_stop_a_real_client(served, many_files):
    socks = half_sent(served.http, 2000)
    try:
        process = psutil.Process(served.process.pid)
        deadline = time.monotonic() + 30
        while process.num_fds() < 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.num_fds() >= 2000, "the worker did not accept the connections"
        assert_serves(served)
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
def capped():
    """A worker capped at 50 connections, started with a low soft open-file limit to raise."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    try:
        served = start_worker(EXAMPLES, "--http-max-connections=50")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield served
    finally:
        served.stop()


def test_connection_cap_evicts_stalled_then_answers_503(capped):
    soft, hard = psutil.Process(capped.process.pid).rlimit(psutil.RLIMIT_NOFILE)
    assert soft == hard  # raised at start, so the cap, not EMFILE, is what bites
    socks = half_sent(capped.http, 100)
    try:
        assert_serves(capped)  # at the cap: the longest-stalled connection made room
        dropped = sum(closed_by_server(s, within=0.1) for s in socks)
        assert dropped >= 50
    finally:
        for sock in socks:
            sock.close()
    # now fill the cap with connections that are idle between requests, not stalled: they
    # were never given up, so one client could keep every other out; the one idle longest
    # now makes room for a newcomer
    idle: list[Raw] = []
    try:
        for _ in range(55):
            conn = Raw(capped.http)
            idle.append(conn)
            conn.send(request_bytes("GET", "/v2/health/live"))
            status, _, _ = conn.response()
            assert status == 200
        assert_serves(capped)
        assert closed_by_server(idle[0].sock, within=5)
        assert not closed_by_server(idle[-1].sock, within=0.1)
    finally:
        for conn in idle:
            conn.close()


def test_at_the_connection_cap_with_every_connection_busy_a_newcomer_gets_503(tmp_path):
    """Connections with a request in the worker are not given up; with every slot held by
    one, a newcomer is refused with a 503 that says why."""
    from test_grpc_stream_bound import pending
    from test_worker_faults import python_repo

    repo, _ = python_repo(tmp_path)
    served = start_worker(repo, "--http-max-connections=4")
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1],
                                   "data": [2.0]}]}).encode()  # fmt: skip
    busy: list[Raw] = []
    try:
        for _ in range(4):
            conn = Raw(served.http)
            busy.append(conn)
            conn.send(request_bytes("POST", "/v2/models/slow/infer", body))
        deadline = time.monotonic() + 30
        while pending(served.metrics) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # one runs, three wait: every connection has its request in
        newcomer = Raw(served.http)
        newcomer.send(request_bytes("GET", "/v2/health/live"))
        status, _, answer = newcomer.response()
        assert status == 503 and "limit of 4 open connections" in error_of(answer)
        newcomer.close()
    finally:
        for conn in busy:
            conn.close()
        served.stop()


# -- disconnects, exactly one answer (transport alone, in this process) -------------------------
class _Held:
    """A handler that answers `GET /now` at once and keeps every other request unanswered."""

    def __init__(self):
        self.requests: list[HttpRequest] = []
        self.hooks: list[str] = []

    def __call__(self, request: HttpRequest, respond) -> None:
        self.requests.append(request)
        if request.path == "/now":
            respond(HttpResponse(200, [b"{}"]))
            return
        if request.path == "/raise":
            raise RuntimeError("handler bug")
        if request.path == "/twice":
            respond(HttpResponse(200, [b'{"n":1}']))
            respond(HttpResponse(200, [b'{"n":2}']))
            return
        request.on_disconnect(lambda: 1 / 0)  # a failing hook must not stop the next one
        request.on_disconnect(lambda: self.hooks.append(request.path))


async def _serve(handler, limits: Limits | None = None):
    server = await start_http_server(handler, "127.0.0.1", 0, limits)
    return server, server.sockets[0].getsockname()[1]


def test_disconnect_runs_hooks_of_unanswered_requests_once():
    handler = _Held()

    async def run():
        server, port = await _serve(handler)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"".join(request_bytes("GET", p) for p in ("/now", "/a", "/b")))
            await writer.drain()
            for _ in range(50):
                if len(handler.requests) == 3:
                    break
                await asyncio.sleep(0.05)
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            writer.close()
            for _ in range(100):
                if len(handler.hooks) == 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # any second call would have happened by now
        finally:
            server.close()

    asyncio.run(run())
    assert sorted(handler.hooks) == ["/a", "/b"]
    assert all(not r.disconnect_hooks for r in handler.requests)


def test_every_request_gets_exactly_one_answer_in_order():
    handler = _Held()

    async def run() -> bytes:
        server, port = await _serve(handler)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            paths = ("/raise", "/twice", "/now")
            writer.write(b"".join(request_bytes("GET", p) for p in paths))
            writer.write(request_bytes("GET", "/now", headers={"Connection": "close"}))
            return await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closes
        finally:
            server.close()

    data = asyncio.run(run())
    assert data.count(b"HTTP/1.1 ") == 4
    assert data.index(b"500 Internal Server Error") < data.index(b'{"n":1}')
    assert b'{"n":2}' not in data and b"handler bug" in data


def test_replies_nobody_reads_pause_the_connection():
    limits = Limits(max_pending_per_connection=4, write_high_water_bytes=MIB)
    calls = []

    def big(request: HttpRequest, respond) -> None:
        calls.append(request.path)
        respond(HttpResponse(200, [request.path.encode().ljust(MIB, b".")]))

    async def run() -> tuple[int, list[bytes]]:
        server, port = await _serve(big, limits)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"".join(request_bytes("GET", f"/{i}") for i in range(300)))
            await asyncio.sleep(1.5)  # the client reads nothing meanwhile
            handled_unread = len(calls)
            firsts = []
            for _ in range(300):
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                assert head.startswith(b"HTTP/1.1 200")
                firsts.append((await reader.readexactly(MIB))[:4])
            writer.close()
            return handled_unread, firsts
        finally:
            server.close()

    handled_unread, firsts = asyncio.run(run())
    assert handled_unread < 100, f"{handled_unread} of 300 handled while nothing was read"
    assert firsts == [f"/{i}".encode().ljust(4, b".")[:4] for i in range(300)]


def test_replies_unread_on_many_connections_are_bounded_in_total(monkeypatch):
    """Each connection paused at 16 MiB of unread replies, but nothing bounded their sum: a
    client pipelining requests on thousands of connections and reading none of the answers made
    the worker hold all of them. Past --http-max-unsent-size the connections holding most are
    now closed; the others' replies arrive whole."""
    from analyzer.worker import limits as limits_module

    trackers: list[limits_module.UnsentReplies] = []
    most = [0]
    count = limits_module.UnsentReplies.count

    def recording(self, conn, size: int) -> None:
        count(self, conn, size)
        if self not in trackers:
            trackers.append(self)
        most[0] = max(most[0], self.total)

    monkeypatch.setattr(limits_module.UnsentReplies, "count", recording)
    cap = 16 * MIB
    limits = Limits(max_pending_per_connection=4, max_unsent_bytes=cap, max_connections=64)
    reply = 8 * MIB  # over what the kernel's socket buffers take on loopback (~4 MiB)
    calls: list[str] = []

    def big(request: HttpRequest, respond) -> None:
        calls.append(request.path)
        respond(HttpResponse(200, [request.path.encode().ljust(reply, b".")]))

    async def run() -> tuple[list[int], int]:
        server, port = await _serve(big, limits)
        try:
            streams = []
            for i in range(8):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # keeps little
                sock.connect(("127.0.0.1", port))
                reader, writer = await asyncio.open_connection(sock=sock, limit=2 * reply)
                writer.write(b"".join(request_bytes("GET", f"/{i}-{j}") for j in range(4)))
                streams.append((reader, writer))
            for _ in range(600):  # nothing is read until every connection was answered once
                if len({path.split("-")[0] for path in calls}) == 8:
                    break
                await asyncio.sleep(0.05)
            held = trackers[0].total
            whole = []
            for i, (reader, writer) in enumerate(streams):
                got = 0
                try:
                    for j in range(4):
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                        assert head.startswith(b"HTTP/1.1 200")
                        body = await asyncio.wait_for(reader.readexactly(reply), 30)
                        assert body.startswith(f"/{i}-{j}".encode())
                        got += 1
                except (asyncio.IncompleteReadError, ConnectionError):
                    pass
                whole.append(got)
                writer.close()
            return whole, held
        finally:
            server.close()

    whole, held = asyncio.run(run())
    assert len({path.split("-")[0] for path in calls}) == 8
    assert most[0] <= cap and held <= cap
    assert whole.count(4) >= 1, whole  # the connections kept got every reply
    assert min(whole) < 4, whole  # and some were closed: 8 replies of 8 MiB went unread
    assert len(trackers) == 1 and trackers[0].total == 0 and not trackers[0].backlog


# -- disconnects against the real worker: queued inference is not run -------------------------
SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 1
dynamic_batching { }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def test_client_disconnect_cancels_its_queued_inference(tmp_path):
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (tmp_path / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    ).encode()
    infer = request_bytes("POST", "/v2/models/slow/infer", body)
    with worker(tmp_path) as served:
        first, last = Raw(served.http), Raw(served.http)
        gone = [Raw(served.http) for _ in range(4)]
        try:
            first.send(infer)
            time.sleep(0.5)  # the first one is executing
            for conn in gone:
                conn.send(infer)
            time.sleep(0.5)  # ... and these four wait in the queue
            for conn in gone:
                conn.close()
            last.send(infer)  # queued behind the four: done only after them, had they run
            assert first.response()[0] == 200
            assert last.response()[0] == 200
            last.send(request_bytes("GET", "/v2/models/slow/stats"))
            status, _, stats = last.response()
            assert status == 200
            assert json.loads(stats)["model_stats"][0]["execution_count"] == 2
        finally:
            first.close()
            last.close()
            for conn in gone:
                conn.close()


def test_head_cap_counts_heads_in_one_chunk_and_across_chunks():
    limits = Limits(max_header_bytes=1024)
    seen = []

    def ok(request: HttpRequest, respond) -> None:
        seen.append(request.path)
        respond(HttpResponse(200, [b"{}"]))

    def head(path: str, filler: int) -> bytes:
        return request_bytes("GET", path, headers={"X-Filler": "f" * filler})

    async def exchange(port: int, pieces: list[bytes]) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data

    async def run() -> list[bytes]:
        server, port = await _serve(ok, limits)
        try:
            close = request_bytes("GET", "/last", headers={"Connection": "close"})
            # three heads under the cap in one chunk longer than the cap: no false refusal
            fine = await exchange(port, [head("/a", 700) + head("/b", 700) + close])
            big = await exchange(port, [head("/big", 2000)])  # one chunk, over the cap
            drip = head("/drip", 3000)  # over the cap, a piece at a time
            dripped = await exchange(port, [drip[i : i + 100] for i in range(0, len(drip), 100)])
            return [fine, big, dripped]
        finally:
            server.close()

    fine, big, dripped = asyncio.run(run())
    assert fine.count(b"HTTP/1.1 200") == 3 and seen[:3] == ["/a", "/b", "/last"]
    assert b"431 Request Header Fields Too Large" in big and b"limit of 1024 bytes" in big
    assert b"431 Request Header Fields Too Large" in dripped
    assert "/big" not in seen and "/drip" not in seen


def test_half_sent_bodies_together_stay_within_the_buffered_budget():
    """Each body is under the per-request cap, but together they would exceed the budget."""
    with worker(EXAMPLES, "--http-max-input-size=4MB", "--http-max-buffered-size=8MB") as s:
        head = request_bytes("POST", ADD_SUB, b"")[: -len(b"Content-Length: 0\r\n\r\n")]
        head += f"Content-Length: {4 * MIB}\r\n\r\n".encode()
        conns = [Raw(s.http) for _ in range(3)]
        try:
            for conn in conns[:2]:  # 7 MiB held: under the budget
                conn.send(head + bytes(int(3.5 * MIB)))
            time.sleep(0.5)  # let the worker read them
            conns[2].send(head)
            conns[2].sock.sendall(bytes(int(3.5 * MIB)))  # would hold 10.5 MiB
            status, _, body = conns[2].response()
            assert status == 503 and "--http-max-buffered-size" in error_of(body)
            assert_serves(s)  # a small request still fits
            conns[0].send(bytes(MIB // 2))  # the first body completes: a 400 (not JSON), once
            assert conns[0].response()[0] == 400
        finally:
            for conn in conns:
                conn.close()


def test_an_answered_request_is_freed_without_the_garbage_collector():
    """The protocol layer ties request, disconnect hook and answer callback together as the
    worker's REST API does; once answered nothing may keep them in a reference cycle (each
    would hold its request body until a collection ran, and the collections cost the hot
    path)."""

    class Queued:  # stands for the model's request: its callback answers, its hook cancels
        def __init__(self, respond):
            self.respond = respond

        def cancel(self) -> None:
            pass

    def handler(request: HttpRequest, respond) -> None:
        queued = Queued(respond)
        request.on_disconnect(queued.cancel)
        queued.respond(HttpResponse(200, [b"{}"]))

    def live_requests() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is HttpRequest)

    async def run() -> None:
        server, port = await _serve(handler)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(50):
                writer.write(request_bytes("GET", "/x"))
                await reader.readuntil(b"{}")
            writer.close()
        finally:
            server.close()

    gc.collect()
    gc.disable()
    try:
        before = live_requests()
        asyncio.run(run())
        assert live_requests() - before == 0
    finally:
        gc.enable()


def test_answers_waiting_behind_an_unanswered_request_count_as_unsent():
    """Answers go out in request order, so those finished behind a request still running wait in
    the worker, out of the socket's buffer: up to --http-max-pending of them per connection, of
    any size. They count against --http-max-unsent-size like unread replies; past it the
    connection holding most is closed and the held request's disconnect hooks run."""
    cap = 16 * MIB
    limits = Limits(max_pending_per_connection=64, max_unsent_bytes=cap)
    reply = 2 * MIB
    held: list[HttpRequest] = []
    hooks: list[str] = []

    def handler(request: HttpRequest, respond) -> None:
        if request.path == "/hold":  # e.g. a long model call: answered much later, or never
            held.append(request)
            request.on_disconnect(lambda: hooks.append(request.path))
            return
        respond(HttpResponse(200, [request.path.encode().ljust(reply, b".")]))

    async def run() -> tuple[bool, int]:
        server, port = await _serve(handler, limits)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request_bytes("GET", "/hold")
                         + b"".join(request_bytes("GET", f"/{i}") for i in range(40)))  # fmt: skip
            try:  # to EOF or a reset: closed by the server, having sent nothing
                closed = not await asyncio.wait_for(reader.read(), 20)
            except ConnectionError:
                closed = True
            except TimeoutError:
                closed = False
            writer.close()
            await asyncio.sleep(0.1)
            return closed, len(hooks)
        finally:
            server.close()

    closed, hooks_run = asyncio.run(run())
    assert held and closed, "80 MiB of answers waited behind an unanswered request"
    assert hooks_run == 1
