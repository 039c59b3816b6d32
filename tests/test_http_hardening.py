"""Hostile clients of the REST API, found by review: each test fails on the code before its fix.

Transport faults run against an in-process server with small caps (fast); the REST API's run
against a worker (tests/serving.py) or its functions in-process.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest

from analyzer.datatypes import CHUNK_ELEMENTS
from analyzer.worker import http_tensors
from analyzer.worker.http_message import HttpRequest, HttpResponse
from analyzer.worker.http_server import start_http_server
from analyzer.worker.limits import Limits

KIB, MIB = 1 << 10, 1 << 20


def _exchange(payload: bytes | list[bytes], limits: Limits | None = None,
              seen: list[HttpRequest] | None = None) -> bytes:  # fmt: skip
    """What an in-process server (each request answered 200 with its path, after its body
    was read whole) writes back to `payload`, sent in pieces, until it closes (or 10 s)."""

    def handler(request: HttpRequest, respond) -> None:
        if seen is not None:
            seen.append(request)
        respond(HttpResponse(200, [json.dumps({"path": request.path}).encode()]))

    async def run() -> bytes:
        server = await start_http_server(handler, "127.0.0.1", 0, limits)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for piece in [payload] if isinstance(payload, bytes) else payload:
                writer.write(piece)
                await writer.drain()
            try:
                return await asyncio.wait_for(reader.read(), 10)
            except TimeoutError:
                return b"(no end)"
            finally:
                writer.close()
        finally:
            server.close()

    return asyncio.run(run())


def _post(body: bytes = b"", headers: dict[str, str] | None = None, close: bool = True) -> bytes:
    lines = ["POST /p HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if "Transfer-Encoding" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _statuses(data: bytes) -> list[int]:
    return [int(line.split()[1]) for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


CHUNKED = {"Transfer-Encoding": "chunked"}


# -- 2: trailers -------------------------------------------------------------------------------
def test_chunked_trailers_count_against_the_head_cap():
    limits = Limits(max_header_bytes=1024)
    head = _post(headers=CHUNKED)
    # a few small trailers: accepted, and not taken for headers (RFC 9110 6.5)
    seen: list[HttpRequest] = []
    ok = _exchange(head + b"2\r\n{}\r\n0\r\nX-Check: 1\r\n\r\n", limits, seen)
    assert _statuses(ok) == [200] and "x-check" not in seen[0].headers
    # many short lines, in one piece and a line at a time: 431 once past the cap
    lines = [f"X-T{i}: {i}\r\n".encode() for i in range(400)]
    for pieces in ([head + b"0\r\n" + b"".join(lines) + b"\r\n"], [head + b"0\r\n", *lines]):
        data = _exchange(pieces, limits)
        assert _statuses(data) == [431] and b"request trailers exceed the limit of 1024" in data
    # one endless line, a piece at a time (the parser would buffer it whole)
    drip = [head + b"0\r\nX-Long: "] + [b"v" * 100] * 50
    assert _statuses(_exchange(drip, limits)) == [431]


# -- 3: encoded bodies -------------------------------------------------------------------------
def test_an_identity_body_is_held_against_the_buffered_budget_as_a_plain_one_is():
    limits = Limits(max_input_bytes=4 * MIB, max_buffered_bytes=MIB)
    half = f"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: {2 * MIB}\r\n"
    for extra in ("", "Content-Encoding: identity\r\n"):
        data = _exchange((half + extra + "\r\n").encode() + bytes(MIB + KIB), limits)
        assert _statuses(data) == [503] and b"--http-max-buffered-size" in data, extra


@pytest.mark.parametrize("encoding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_data_after_the_end_of_a_compressed_body_is_refused(encoding, pack):
    packed = pack(b'{"a": 1}')
    headers = {"Content-Encoding": encoding}
    assert _statuses(_exchange(_post(packed, headers))) == [200]
    for junk in (b"x", bytes(64 * KIB)):
        data = _exchange(_post(packed + junk, headers))
        assert _statuses(data) == [400] and b"data after the end of the compressed" in data
    # the junk in a chunk of its own, after the stream ended in an earlier one
    chunks = f"{len(packed):x}\r\n".encode() + packed + b"\r\n5\r\njunk!\r\n0\r\n\r\n"
    data = _exchange(_post(chunks, {**headers, **CHUNKED}))
    assert _statuses(data) == [400]


# -- 9: protocol faults ------------------------------------------------------------------------
def test_head_gets_no_body_and_the_connection_stays_in_step():
    head = b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"
    get = b"GET /g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    data = _exchange(head + get)
    first, rest = data.split(b"\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 200") and b"Content-Length: 14" in first  # GET's length
    assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b'{"path": "/g"}')
    data = _exchange(head * 100 + get)  # past a pass's 64: the rest wait, then are answered
    assert _statuses(data) == [200] * 101 and data.count(b'{"path"') == 1


def test_connect_and_upgrade_get_one_answer():
    for request in (b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n"):  # fmt: skip
        data = _exchange(request)
        assert _statuses(data) == [400] and b"upgrade is not supported" in data


@pytest.mark.parametrize("codings", [["gzip, chunked"], ["gzip", "chunked"]])
def test_a_transfer_coding_besides_chunked_is_refused(codings):
    lines = "".join(f"Transfer-Encoding: {c}\r\n" for c in codings)
    body = gzip.compress(b"{}")
    request = (f"POST /p HTTP/1.1\r\nHost: x\r\n{lines}\r\n{len(body):x}\r\n").encode()
    data = _exchange(request + body + b"\r\n0\r\n\r\n")
    assert _statuses(data) == [400] and b"unsupported Transfer-Encoding" in data


# -- the REST API in process -------------------------------------------------------------------
class _Manager:
    """What RestApi asks of the model manager on the routes below."""

    def __init__(self) -> None:
        from analyzer.worker.limits import HeldBytes

        self.held = HeldBytes()
        self.loads: list[tuple[str, str | None, Any]] = []

    def load(self, name: str, config: str | None, files: Any) -> None:
        self.loads.append((name, config, files))


def _call(path: str, body: bytes, manager: _Manager | None = None) -> tuple[int, dict]:
    """One POST through RestApi on a running loop: (status, JSON answer)."""
    from analyzer.worker.http import RestApi

    async def run() -> HttpResponse:
        loop = asyncio.get_running_loop()
        api = RestApi(manager or _Manager(), loop, "test")  # type: ignore[arg-type]
        answered: asyncio.Future[HttpResponse] = loop.create_future()
        api(HttpRequest("POST", path, "", {}, body), answered.set_result)
        return await asyncio.wait_for(answered, 30)

    response = asyncio.run(run())
    return response.status, json.loads(b"".join(response.body))


# -- 1: shared-memory keys ---------------------------------------------------------------------
def test_a_shared_memory_key_that_is_no_file_name_is_a_400_and_echoes_are_cut():
    register = "/v2/systemsharedmemory/region/r/register"
    status, answer = _call(register, b'{"key": "\\ud800x", "byte_size": 4}')  # a lone surrogate
    assert status == 400 and "is not valid UTF-8 text" in answer["error"], answer
    for body in ({"key": "k" * 10_000, "byte_size": 4}, {"key": ["k"] * 5000},
                 {"key": "k", "byte_size": ["1"] * 5000}):  # fmt: skip
        status, answer = _call(register, json.dumps(body).encode())
        assert status == 400 and len(answer["error"]) < 300, answer["error"][:300]


# -- 7: bodies parsed on the event loop ------------------------------------------------------
def test_a_shared_memory_body_over_64_kib_is_refused_unparsed():
    body = json.dumps({"key": "k", "byte_size": 4, "pad": "x" * (64 * KIB)}).encode()
    status, answer = _call("/v2/systemsharedmemory/region/r/register", body)
    assert status == 413 and f"{len(body)} bytes exceeds its limit of 65536" in answer["error"]


def test_a_large_repository_body_is_parsed_off_the_event_loop(monkeypatch):
    """A load may carry a config and base64 model files: not capped, but a body this large
    is parsed in a child process, not by json.loads on the loop."""
    from analyzer.worker import http as http_api
    from analyzer.worker.json_process import PROCESS_JSON_BYTES

    on_loop: list[int] = []
    parse = http_api._parse_json
    monkeypatch.setattr(http_api, "_parse_json",
                        lambda body: on_loop.append(len(body)) or parse(body))  # fmt: skip
    config = json.dumps({"max_batch_size": 8, "parameters": {"pad": {"string_value": "x" * MIB}}})
    files = {"file:1/model.onnx": "QUJD" * (MIB // 4)}
    body = json.dumps({"parameters": {"config": config, **files}}).encode()
    manager = _Manager()
    assert _call("/v2/repository/models/m/load", body, manager) == (200, {})
    assert manager.loads == [("m", config, files)]
    assert all(size < PROCESS_JSON_BYTES for size in on_loop), on_loop
    status, answer = _call("/v2/repository/models/m/load", body[:-1], manager)  # cut short
    assert status == 400 and answer["error"].startswith("malformed JSON in request body")


# -- 5: JSON input data ------------------------------------------------------------------------
class _CountingNumpy:
    """numpy, with the size of each array np.asarray makes recorded."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def asarray(self, values: Any, dtype: Any = None) -> np.ndarray:
        array = np.asarray(values, dtype=dtype)
        self.sizes.append(array.size)
        return array


def test_json_input_data_is_counted_first_and_converted_a_slice_at_a_time(monkeypatch):
    spy = _CountingNumpy()
    monkeypatch.setattr(http_tensors, "np", spy)
    convert = http_tensors._from_json_data
    n = 3 * CHUNK_ELEMENTS + 4
    rows = n // 4
    for data, has in ((list(range(n + 1)), n + 1), ([[0.5] * 4] * (rows + 1), n + 4)):
        with pytest.raises(ValueError, match=rf"shape \[{n}\] needs {n} values, 'data' has {has}"):
            convert(data, "FP32", (n,), n)
    assert spy.sizes == []  # refused before any conversion
    nested = np.arange(n, dtype=np.float32).reshape(rows, 4)
    got = convert(nested.tolist(), "FP32", (rows, 4), n)
    np.testing.assert_array_equal(got, nested)
    words = [[f"w{i}", "✓"] for i in range(rows)]
    got = convert(json.loads(json.dumps(words)), "BYTES", (rows, 2), 2 * rows)
    assert got.shape == (rows, 2) and got[-1, 0] == f"w{rows - 1}".encode()
    assert got[0, 1] == "✓".encode()
    assert max(spy.sizes) <= CHUNK_ELEMENTS
    with pytest.raises(ValueError, match="not a .nested. list of values"):  # ragged
        convert([[1.0] * 4] * (rows - 2) + [[1.0] * 3, [1.0] * 5], "FP32", (n,), n)


# -- 6: JSON outputs ---------------------------------------------------------------------------
def _longest_list(value: Any) -> int:
    longest, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            longest = max(longest, len(item))
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return longest


def test_json_outputs_are_encoded_a_slice_at_a_time_and_byte_for_byte_as_before(monkeypatch):
    n = 3 * CHUNK_ELEMENTS + 5
    outputs = {"F": np.arange(n, dtype=np.float32) / 7, "I": np.arange(4, dtype=np.int32),
               "S": np.array([f"s{i}✓".encode() for i in range(CHUNK_ELEMENTS + 3)], np.object_),
               "H": (np.arange(n - 1) % 100).astype(np.float16).reshape(-1, 4), "small": np.ones(3)}
    spec = [{"name": "F"}, {"name": "I", "parameters": {"binary_data": True}}, {"name": "S"},
            {"name": "H"}, {"name": "small"}]  # fmt: skip

    def entry(name: str) -> dict[str, Any]:
        array = outputs[name]
        wire = {"F": "FP32", "S": "BYTES", "H": "FP16", "small": "FP64"}[name]
        data = [v.decode() for v in array.ravel()] if wire == "BYTES" else array.ravel().tolist()
        return {"name": name, "datatype": wire, "shape": list(array.shape), "data": data}

    binary = {"name": "I", "datatype": "INT32", "shape": [4],
              "parameters": {"binary_data_size": 16}}  # fmt: skip
    want = json.dumps({"model_name": "m", "model_version": "1",
                       "outputs": [entry("F"), binary, entry("S"), entry("H"), entry("small")],
                       "id": "r"}, separators=(",", ":")).encode()  # fmt: skip
    longest: list[int] = []

    class Json:
        @staticmethod
        def dumps(value: Any, **options: Any) -> str:
            longest.append(_longest_list(value))
            return json.dumps(value, **options)

    class Model:
        name, version = "m", 1

    monkeypatch.setattr(http_tensors, "json", Json)
    response = http_tensors._encode_outputs(Model(), "r", outputs, spec, False)  # type: ignore[arg-type]
    body = b"".join(response.body)
    length = int(dict(response.headers)["Inference-Header-Content-Length"])
    assert body[:length] == want and body[length:] == outputs["I"].tobytes()
    assert max(longest) <= CHUNK_ELEMENTS


# -- 8: priority levels ------------------------------------------------------------------------
@pytest.mark.parametrize("batching, problem", [
    ("priority_levels: 1000000", "dynamic_batching.priority_levels 1000000 is over the worker's "
                                 "limit of 1000"),
    ("priority_levels: 18446744073709551615", "priority_levels 18446744073709551615 is over"),
    ("priority_levels: 4 default_priority_level: 5", "default_priority_level 5 is not one of the "
                                                     "4 priority_levels"),
])  # fmt: skip
def test_priority_levels_past_the_bound_are_refused_at_load(batching, problem):
    from analyzer.config.config_rules import config_problems
    from analyzer.config.model_config import parse_model_config

    config = parse_model_config(f'name: "m" max_batch_size: 8 dynamic_batching {{ {batching} }}')
    assert any(problem in p for p in config_problems(config)), config_problems(config)
    fine = parse_model_config('name: "m" max_batch_size: 8 dynamic_batching { priority_levels: '
                              '1000 default_priority_level: 1000 }')  # fmt: skip
    assert config_problems(fine) == []


def test_without_priority_levels_the_default_level_is_ignored_as_in_triton():
    from analyzer.config.model_config import parse_model_config
    from analyzer.worker.batcher import Scheduler
    from analyzer.worker.request import InferRequest
    from analyzer.worker.stats import ModelStats

    config = parse_model_config('name: "m" max_batch_size: 8 '
                                'dynamic_batching { default_priority_level: 5 }')  # fmt: skip
    scheduler = Scheduler(config, ModelStats("m", 1))
    request = InferRequest(model_name="m", inputs={"X": np.zeros((1, 4), np.float32)},
                           wire_types={"X": "FP32"}, requested_outputs=None,
                           on_done=lambda o, e: None)  # fmt: skip
    scheduler.enqueue(request)  # refused: "invalid priority 0 ... it has 1 priority level(s)"
    assert scheduler.next_batch() == [request]
