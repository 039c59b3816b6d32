"""A seeded mutation fuzz of the worker's own HTTP/2 transport, below gRPC: 2,000 connections.

`test_fuzz.py` mutates the requests a real gRPC client frames; this one mutates the frames. Valid
conversations (perf_analyzer's frame order, CONTINUATION and padding, two calls in one write, a
streaming call, an ensemble over a stream and a BLS model, unary calls, PING, SETTINGS,
RST_STREAM) are broken at the byte, field and frame level -- lengths, types, flags, stream ids,
window increments, SETTINGS values, HPACK blocks, gRPC length prefixes, truncation, duplication,
reordering -- and sent on fresh connections.

The oracle, per connection: after the mutated bytes and a PING, the worker either answers the PING
or ends the connection, and never with GOAWAY INTERNAL_ERROR (the transport's "a bug" path). Over
the run: no traceback or ERROR line in the worker's output (asyncio logs a task collected while
still pending as one), and a valid call still answered between batches. A truncated frame may
rightly leave its connection waiting for the rest; those are counted, and bounded. The mutator
is a seeded random.Random, so a failure names the case that reproduces it.
"""

from __future__ import annotations

import asyncio
import random
import struct

import numpy as np
import pytest
from hpack import Decoder, Encoder
from serving import EXAMPLES, start_worker
from tritonclient.grpc import service_pb2 as pb
from wire_fuzz import faults, in_batches, until

SEED = 20_261_127
CASES = 2000
WAIT_S = 2.0  # for the PING's answer or the end of the connection
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)  # fmt: skip
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
INTERNAL_ERROR = 2
PING_PAYLOAD = b"fuzzping"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) \
        + payload  # fmt: skip


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def add_sub(rng: random.Random) -> bytes:
    request = pb.ModelInferRequest(model_name="add_sub", id=f"f{rng.randrange(1000)}")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.full(4, rng.random(), np.float32).tobytes())
    return grpc_message(request.SerializeToString())


def image(rng: random.Random, model: str) -> bytes:
    """A classifier request: the ensemble (`classifier`) or the BLS model (`classifier_bls`)."""
    request = pb.ModelInferRequest(model_name=model, id=f"i{rng.randrange(1000)}")
    request.inputs.add(name="IMAGE", datatype="UINT8", shape=[1, 32, 32, 3])
    request.raw_input_contents.append(rng.randbytes(3072))
    return grpc_message(request.SerializeToString())


def head(encoder: Encoder, method: str, extra: tuple = ()) -> bytes:
    return encoder.encode([
        (":method", "POST"), (":scheme", "http"),
        (":path", f"/inference.GRPCInferenceService/{method}"), (":authority", "localhost"),
        ("te", "trailers"), ("content-type", "application/grpc"), *extra,
    ])  # fmt: skip


def conversation(rng: random.Random) -> list[bytes]:
    """A valid conversation after the preface, as a list of frames."""
    encoder = Encoder()
    settings = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20))
    kind = rng.randrange(7)
    if kind == 6:  # an ensemble over a stream, then a python model calling another (BLS)
        return [settings, frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelStreamInfer")),
                frame(DATA, 0, 1, image(rng, "classifier")),
                frame(DATA, END_STREAM, 1, image(rng, "classifier")),
                frame(HEADERS, END_HEADERS, 3, head(encoder, "ModelInfer")),
                frame(DATA, END_STREAM, 3, image(rng, "classifier_bls"))]  # fmt: skip
    if kind == 0:  # perf_analyzer's order: HEADERS, stream WINDOW_UPDATE, DATA, connection one
        return [settings, frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelInfer")),
                frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 16)),
                frame(DATA, END_STREAM, 1, add_sub(rng)),
                frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 16))]  # fmt: skip
    if kind == 1:  # CONTINUATION, PRIORITY flag, a padded message in two pieces
        block = head(encoder, "ModelInfer", (("grpc-timeout", "5S"),))
        message = add_sub(rng)
        cut = len(message) // 2
        pad = bytes((3,))
        return [settings,
                frame(HEADERS, PRIORITY_FLAG, 1, b"\x00\x00\x00\x00\x10" + block[:5]),
                frame(CONTINUATION, END_HEADERS, 1, block[5:]),
                frame(DATA, PADDED, 1, pad + message[:cut] + b"\x00" * 3),
                frame(DATA, END_STREAM, 1, message[cut:])]  # fmt: skip
    if kind == 2:  # two calls in one write, the second through HPACK's dynamic table
        return [settings, frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelInfer")),
                frame(DATA, END_STREAM, 1, add_sub(rng)),
                frame(HEADERS, END_HEADERS, 3, head(encoder, "ModelInfer")),
                frame(DATA, END_STREAM, 3, add_sub(rng))]  # fmt: skip
    if kind == 3:  # a streaming call: two messages, then the end
        return [settings, frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelStreamInfer")),
                frame(DATA, 0, 1, add_sub(rng)), frame(DATA, 0, 1, add_sub(rng)),
                frame(DATA, END_STREAM, 1, b"")]  # fmt: skip
    if kind == 4:  # unary calls that are not inference
        live = grpc_message(pb.ServerLiveRequest().SerializeToString())
        meta = grpc_message(pb.ModelMetadataRequest(name="add_sub").SerializeToString())
        return [settings, frame(HEADERS, END_HEADERS, 1, head(encoder, "ServerLive")),
                frame(DATA, END_STREAM, 1, live),
                frame(HEADERS, END_HEADERS, 3, head(encoder, "ModelMetadata")),
                frame(DATA, END_STREAM, 3, meta)]  # fmt: skip
    # control frames around a call the client cancels
    return [settings, frame(PING, 0, 0, b"12345678"), frame(SETTINGS, ACK, 0),
            frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelInfer")),
            frame(RST_STREAM, 0, 1, struct.pack(">I", 8)),
            frame(HEADERS, END_HEADERS, 3, head(encoder, "ModelInfer")),
            frame(DATA, END_STREAM, 3, add_sub(rng))]  # fmt: skip


def _random_frame(rng: random.Random) -> bytes:
    kind = rng.choice([DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY,
                       WINDOW_UPDATE, CONTINUATION, 10, 0xFF])  # fmt: skip
    stream = rng.choice([0, 1, 2, 3, 5, 0x7FFFFFFF, 0xFFFFFFFF, rng.randrange(1 << 32)])
    payload = {
        WINDOW_UPDATE: lambda: struct.pack(">I", rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF])),
        SETTINGS: lambda: b"".join(
            struct.pack(">HI", rng.randrange(8), rng.choice([0, 1, 1 << 14, (1 << 24) - 1,
                                                             1 << 24, 0x7FFFFFFF, 1 << 31]))
            for _ in range(rng.randrange(4))),  # fmt: skip
        RST_STREAM: lambda: struct.pack(">I", rng.randrange(16)),
        PING: lambda: rng.randbytes(rng.choice([0, 7, 8, 9])),
    }.get(kind, lambda: rng.randbytes(rng.choice([0, 1, 5, 9, 64, 300])))()
    return frame(kind, rng.randrange(256), stream, payload)


def mutate(rng: random.Random, frames: list[bytes]) -> bytes:
    """One to three mutations of a conversation, then its bytes."""
    frames = list(frames)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        what = rng.randrange(11)
        if len(f) < 9 and what not in (7, 8, 9):  # a frame cut shorter than its head already
            continue
        if what == 0:  # flip bytes anywhere in the frame
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(len(f))] = rng.randrange(256)
        elif what == 1:  # a length that lies (the frames after it are read out of step)
            f[0:3] = struct.pack(">I", max(0, len(f) - 9 + rng.choice([-9, -1, 1, 7, 100])))[1:]
        elif what == 2:  # another type, known or not
            f[3] = rng.randrange(16)
        elif what == 3:  # other flags
            f[4] = rng.randrange(256)
        elif what == 4:  # another stream id (0, even, reused, reserved bit set)
            ids = [0, 2, 1, 3, 7, 0x80000001, rng.randrange(1 << 32)]
            f[5:9] = struct.pack(">I", rng.choice(ids))
        elif what == 5:  # the payload's bytes replaced (an HPACK block, a message, a setting)
            f[9:] = rng.randbytes(len(f) - 9)
        elif what == 6:  # a gRPC length prefix or compressed flag that lies
            if len(f) > 14:
                f[9] = rng.choice([0, 1, 2, 255])
                f[10:14] = struct.pack(">I", rng.choice([0, 1, 1 << 20, 0xFFFFFFFF]))
        elif what == 7:  # a frame duplicated
            frames.insert(i, bytes(f))
        elif what == 8 and len(frames) > 1:  # two frames swapped
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
            continue
        elif what == 9:  # a frame of any kind inserted
            frames.insert(i, _random_frame(rng))
        else:  # the frame cut short (the connection may rightly wait for the rest)
            f = f[: rng.randrange(len(f))]
        frames[i] = bytes(f)
    return b"".join(frames)


async def _case(port: int, data: bytes) -> str:
    """'answered' (our PING came back), 'closed', 'waiting', or 'internal' (GOAWAY
    INTERNAL_ERROR)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(PREFACE + data + frame(PING, 0, 0, PING_PAYLOAD))
        buf = b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                kind, flags, payload = buf[3], buf[4], buf[9 : 9 + n]
                buf = buf[9 + n :]
                if kind == GOAWAY and len(payload) >= 8:
                    if struct.unpack(">I", payload[4:8])[0] == INTERNAL_ERROR:
                        return "internal"
                if kind == PING and flags & ACK and payload == PING_PAYLOAD:
                    return "answered"
            left = deadline - loop.time()
            if left <= 0:
                return "waiting"
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                return "waiting"
            except ConnectionError:
                return "closed"
            if not chunk:
                return "closed"
            buf += chunk
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def _status_of_a_valid_call(port: int) -> bytes | None:
    """The grpc-status of a well-formed ModelInfer on a fresh connection, its message in two
    DATA frames (so it is held as a half-received message first)."""
    rng = random.Random(0)
    encoder, decoder = Encoder(), Decoder()
    message = add_sub(rng)
    data = frame(HEADERS, END_HEADERS, 1, head(encoder, "ModelInfer")) + \
        frame(DATA, 0, 1, message[:10]) + frame(DATA, END_STREAM, 1, message[10:])  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(PREFACE + frame(SETTINGS, 0, 0) + data)
        buf = b""
        while True:
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                kind, flags, stream, payload = buf[3], buf[4], buf[5:9], buf[9 : 9 + n]
                buf = buf[9 + n :]
                if kind == HEADERS and stream == b"\x00\x00\x00\x01" and flags & END_STREAM:
                    return dict(decoder.decode(payload, raw=True)).get(b"grpc-status")
                if kind == HEADERS and stream == b"\x00\x00\x00\x01":
                    decoder.decode(payload, raw=True)  # the response headers: keep HPACK in step
            chunk = await asyncio.wait_for(reader.read(65536), 30)
            if not chunk:
                return None
            buf += chunk
    finally:
        writer.close()


async def _valid_call(port: int) -> bool:
    """A well-formed call is answered OK once the fuzz's connections are gone. The worker's
    caps are small here (see `fuzz_worker`): an RPC slot or a half-received byte count that a
    fuzzed stream leaked would soon refuse it with RESOURCE_EXHAUSTED for good."""
    return await until(lambda: _status_of_a_valid_call(port), lambda s: s == b"0") == b"0"


@pytest.fixture(scope="module")
def fuzz_worker():
    # small caps, so that leaked RPC slots or half-received bytes would show (_valid_call)
    served = start_worker(EXAMPLES, "--grpc-max-concurrent-rpcs=64",
                          "--http-max-buffered-size=65536")  # fmt: skip
    yield served
    served.stop()


def test_two_thousand_mutated_conversations_never_reach_the_bug_path(fuzz_worker):
    port = fuzz_worker.ports["grpc"]
    rng = random.Random(SEED)
    cases = [mutate(rng, conversation(rng)) for _ in range(CASES)]

    results, alive = asyncio.run(in_batches(cases, lambda data: _case(port, data),
                                            lambda: _valid_call(port)))  # fmt: skip
    outcomes: dict[str, list[int]] = {}
    for i, outcome in enumerate(results):
        outcomes.setdefault(outcome, []).append(i)
    bad = faults(fuzz_worker.output)
    assert not bad, bad[-40:]
    bugs = outcomes.get("internal", [])
    assert not bugs, f"GOAWAY INTERNAL_ERROR for cases {bugs[:10]}"
    assert all(alive), alive
    counts = {k: len(v) for k, v in outcomes.items()}
    assert sum(counts.values()) == CASES
    assert counts.get("answered", 0) + counts.get("closed", 0) >= CASES // 2, counts
