"""A seeded mutation fuzz of the worker's HTTP/1.1 wire handling: 2,000 connections of raw bytes.

`test_fuzz.py` mutates what http.client frames (JSON, binary bodies, parameters); this one
mutates the bytes on the wire: request lines, header lines, Content-Length and
Inference-Header-Content-Length that lie, chunk sizes, Expect: 100-continue, gzip bodies, and
pipelined requests whose heads repeat (the worker's short path for a head it has seen) --
flipped, cut, duplicated, reordered, with garbage inserted. Each conversation is followed by a
health check on the same connection (Connection: close), sent on fresh connections 48 at a time.

The oracle: no 500 answer (a malformed request is the client's fault: 4xx; a cap: 503), no
traceback or ERROR line in the worker's output, and a valid inference still answered 200 on a
fresh connection between batches -- at small connection and half-received-body caps, so that a
leaked slot or byte count fails it. A request whose body never fully arrives may rightly leave
its connection waiting; those are counted and bounded. The mutator is a seeded random.Random, so
a failure names the case that reproduces it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import re

import numpy as np
import pytest
from serving import EXAMPLES, start_worker
from wire_fuzz import faults, in_batches, until

SEED = 20_261_127
CASES = 2000
WAIT_S = 2.0
HEALTH = b"GET /v2/health/live HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n"
STATUS = re.compile(rb"(?:^|\n)HTTP/1\.[01] (\d{3}) ")


def http(method: str, path: str, body: bytes = b"", headers: tuple = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz", *headers]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def binary_add_sub(rng: random.Random) -> bytes:
    header = json.dumps({"inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
        for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + np.float32([rng.random()] * 8).tobytes()
    return http("POST", "/v2/models/add_sub/infer", body,
                (f"Inference-Header-Content-Length: {len(header)}",
                 "Content-Type: application/octet-stream"))  # fmt: skip


def json_add_sub(rng: random.Random) -> bytes:
    return json.dumps({"id": str(rng.randrange(100)), "inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 4], "data": [rng.random()] * 4}
        for n in ("INPUT0", "INPUT1")]}).encode()  # fmt: skip


def conversation(rng: random.Random) -> list[bytes]:
    """A valid conversation as a list of requests (each a list item, so mutations can move
    whole requests)."""
    kind = rng.randrange(6)
    if kind == 0:  # the same binary head three times: the repeated-head short path
        one = binary_add_sub(rng)
        return [one, one, one]
    if kind == 1:
        return [http("POST", "/v2/models/add_sub/infer", json_add_sub(rng)),
                http("GET", "/v2/health/ready"), http("GET", "/v2/models/add_sub"),
                http("GET", "/v2/models/tiny_cnn/config")]  # fmt: skip
    if kind == 2:  # chunked
        body = json_add_sub(rng)
        cut = rng.randrange(1, len(body))
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:cut], body[cut:]))
        return [b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: fuzz\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"]  # fmt: skip
    if kind == 3:  # Expect: 100-continue
        return [http("POST", "/v2/models/add_sub/infer", json_add_sub(rng),
                     ("Expect: 100-continue",))]  # fmt: skip
    if kind == 4:  # tiny_cnn, binary, twice
        header = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32",
                                         "shape": [1, 3, 32, 32],
                                         "parameters": {"binary_data_size": 12288}}]}).encode()
        body = header + np.zeros(3072, np.float32).tobytes()
        one = http("POST", "/v2/models/tiny_cnn/infer", body,
                   (f"Inference-Header-Content-Length: {len(header)}",))  # fmt: skip
        return [one, one]
    return [http("POST", "/v2/models/add_sub/infer", gzip.compress(json_add_sub(rng)),
                 ("Content-Encoding: gzip",)),
            http("POST", "/v2/repository/index")]  # fmt: skip


def mutate(rng: random.Random, requests: list[bytes]) -> bytes:
    requests = list(requests)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(requests))
        r = bytearray(requests[i])
        what = rng.randrange(10)
        if not r:
            continue
        if what == 0:  # flip bytes anywhere
            for _ in range(rng.randrange(1, 4)):
                r[rng.randrange(len(r))] = rng.randrange(256)
        elif what in (1, 2):  # a length that lies
            name = b"Content-Length: " if what == 1 else b"Inference-Header-Content-Length: "
            at = r.find(name)
            if at >= 0:
                end = r.find(b"\r\n", at)
                value = rng.choice([b"0", b"1", b"-1", b"99999999999999999999", b"12x", b"",
                                    b" 5", b"4096", str(rng.randrange(400)).encode()])
                r[at + len(name) : end] = value
        elif what == 3:  # a header line replaced by garbage, or an odd one added
            lines = bytes(r).split(b"\r\n")
            if len(lines) < 3:
                continue
            j = rng.randrange(1, len(lines) - 1)
            lines[j] = rng.choice([rng.randbytes(rng.randrange(1, 40)), b"X-A: " + b"a" * 9000,
                                   b"Transfer-Encoding: chunked", b"Content-Length: 3",
                                   b"Connection: close", b"Expect: 100-continue",
                                   b"Content-Encoding: deflate", b" folded", b":",
                                   b"Transfer-Encoding: gzip, chunked"])
            r = bytearray(b"\r\n".join(lines))
        elif what == 4:  # another request line
            end = r.find(b"\r\n")
            r[:end] = rng.choice([b"POST /v2/models/add_sub/infer HTTP/1.0", b"GET / HTTP/1.1",
                                  b"POST /v2/models/add_sub/infer HTTP/2.0", b"BREW / HTTP/1.1",
                                  b"POST /v2/models/../../etc/infer HTTP/1.1", b"POST",
                                  b"POST /v2/models/add_sub/versions/1/infer HTTP/1.1",
                                  rng.randbytes(20)])  # fmt: skip
        elif what == 5:  # a request duplicated
            requests.insert(i, bytes(r))
        elif what == 6 and len(requests) > 1:  # two requests swapped
            j = rng.randrange(len(requests))
            requests[i], requests[j] = requests[j], requests[i]
            continue
        elif what == 7:  # random bytes between requests
            requests.insert(i, rng.randbytes(rng.randrange(1, 64)))
        elif what == 8:  # a chunk size that lies
            at = r.find(b"\r\n\r\n")
            if b"chunked" in r and at >= 0:
                r[at + 4 : at + 5] = rng.choice([b"ffffffffffff", b"z", b"-1", b"0", b"1;x=y"])
        else:  # cut short
            r = r[: rng.randrange(len(r))]
        requests[i] = bytes(r)
    return b"".join(requests)


async def _case(port: int, data: bytes) -> tuple[str, list[int]]:
    """('closed' -- the health check's Connection: close, or the worker ending it -- or
    'waiting', and the statuses seen)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    buf = b""
    try:
        writer.write(data + HEALTH)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return "waiting", [int(s) for s in STATUS.findall(buf)]
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                return "waiting", [int(s) for s in STATUS.findall(buf)]
            except ConnectionError:
                return "closed", [int(s) for s in STATUS.findall(buf)]
            if not chunk:
                return "closed", [int(s) for s in STATUS.findall(buf)]
            buf += chunk
    finally:
        writer.close()


async def _status_of_a_valid_call(port: int) -> int:
    """The status of a well-formed inference on a fresh connection, its body sent in two
    writes (so it is held as a half-received body first)."""
    data = binary_add_sub(random.Random(0))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data[:-20])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(data[-20:])
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 30)
        return int(head.split()[1])
    finally:
        writer.close()


async def _valid_call(port: int) -> int:
    """A well-formed inference is answered 200 once the fuzz's connections are gone. The
    worker's caps are small here (see `fuzz_worker`): a connection slot or a half-received
    byte count that a fuzzed request leaked would soon refuse it with 503 for good."""
    return await until(lambda: _status_of_a_valid_call(port), lambda s: s == 200)


@pytest.fixture(scope="module")
def fuzz_worker():
    # small caps, so that leaked connection slots or half-received bytes would show
    served = start_worker(EXAMPLES, "--http-max-connections=128",
                          "--http-max-buffered-size=262144")  # fmt: skip
    yield served
    served.stop()


def test_two_thousand_mutated_http_conversations_get_no_server_fault(fuzz_worker):
    port = fuzz_worker.ports["http"]
    rng = random.Random(SEED)
    cases = [mutate(rng, conversation(rng)) for _ in range(CASES)]

    results, alive = asyncio.run(in_batches(cases, lambda data: _case(port, data),
                                            lambda: _valid_call(port)))  # fmt: skip
    outcomes: dict[str, int] = {}
    statuses: dict[int, list[int]] = {}  # status -> cases
    for i, (outcome, seen) in enumerate(results):
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        for status in seen:
            statuses.setdefault(status, []).append(i)
    bad = faults(fuzz_worker.output)
    assert not bad, bad[-40:]
    assert 500 not in statuses, f"500 for cases {statuses[500][:10]}"
    assert set(alive) == {200}, alive
    assert sum(outcomes.values()) == CASES
    assert 200 in statuses and len(statuses) > 3, sorted(statuses)  # the fuzz reached the models
    assert outcomes.get("waiting", 0) <= CASES // 2, outcomes
