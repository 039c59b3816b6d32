"""A gRPC stream the transport ends early withdraws its work: no task waits on after it.

A ModelStreamInfer call can be answered by the transport itself half-way -- a message over
`--grpc-max-message-size`, the request ending inside a message -- while the stream's reader and
answering tasks still wait for messages, and its requests are still queued. Before, that stream
was closed without them: its tasks waited until the connection ended and were then collected
still pending ("Task was destroyed but it is pending!", found by test_grpc_frame_fuzz.py), and its
queued requests ran for nobody. Driven in process, on a real event loop, against a model that
holds what it is given.
"""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest
from hpack import Decoder, Encoder
from tritonclient.grpc import service_pb2 as pb

from analyzer.config.model_config import parse_model_config
from analyzer.worker import grpc_server
from analyzer.worker.limits import Limits
from analyzer.worker.validate import RequestValidator

CONFIG = parse_model_config(
    'name: "held"\nmax_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
    'output [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
)
CAP = 4096  # --grpc-max-message-size for these tests
DATA, HEADERS, SETTINGS = 0, 1, 4
END_STREAM, END_HEADERS = 0x1, 0x4


class HeldModel:
    """Queues what it is given and never answers: the stream has work in the worker."""

    name, version, decoupled = "held", 1, False
    validator = RequestValidator(CONFIG)

    def __init__(self) -> None:
        self.requests: list = []

    def submit(self, request, checked: bool = False) -> None:
        if not checked:
            self.validator.check(request)
        self.requests.append(request)


class Manager:
    def __init__(self) -> None:
        self.model = HeldModel()

    def get(self, name: str, version: str = ""):
        return self.model


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data) -> None:
        self.out += data

    def writelines(self, parts) -> None:
        for part in parts:
            self.out += part

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, key):
        return None

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) \
        + payload  # fmt: skip


def statuses(out: bytes) -> list[bytes]:
    """The grpc-status of each header block the worker sent."""
    decoder, found, i = Decoder(), [], 0
    while i + 9 <= len(out):
        n = int.from_bytes(out[i : i + 3], "big")
        if out[i + 3] == HEADERS:
            found += [v for k, v in decoder.decode(out[i + 9 : i + 9 + n], raw=True)
                      if k == b"grpc-status"]  # fmt: skip
        i += 9 + n
    return found


def message(i: int) -> bytes:
    request = pb.ModelInferRequest(model_name="held", id=str(i))
    request.inputs.add(name="X", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.float32(i).tobytes())
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


ENDINGS = {
    # a message announced over the cap: RESOURCE_EXHAUSTED (8)
    "over the cap": (frame(DATA, 0, 1, b"\x00" + struct.pack(">I", CAP * 4)), b"8"),
    # the client ends the stream inside a message: INTERNAL (13)
    "ended inside a message": (frame(DATA, END_STREAM, 1, message(9)[:12]), b"13"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_stream_the_transport_ends_leaves_no_task_and_no_queued_request(ending):
    async def run() -> None:
        manager = Manager()
        server = grpc_server.GrpcServer(manager, None, "127.0.0.1", 0,
                                        Limits(grpc_max_message_bytes=CAP))  # fmt: skip
        server.loop = asyncio.get_running_loop()
        conn = grpc_server._Connection(server)
        transport = Transport()
        conn.connection_made(transport)
        block = Encoder().encode([
            (":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
            (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
            ("te", "trailers"), ("content-type", "application/grpc"),
        ])  # fmt: skip
        conn.data_received(grpc_server.PREFACE + frame(SETTINGS, 0, 0)
                           + frame(HEADERS, END_HEADERS, 1, block)
                           + frame(DATA, 0, 1, message(1) + message(2)))  # fmt: skip
        for _ in range(20):
            await asyncio.sleep(0)
        stream = conn.streams[1]
        assert len(manager.model.requests) == 2  # both queued in the model, unanswered
        tasks = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        assert stream.task in tasks and len(tasks) == 2  # the answering task and its reader

        data, status = ENDINGS[ending]
        conn.data_received(data)
        for _ in range(20):
            await asyncio.sleep(0)
        assert statuses(bytes(transport.out)) == [status]
        assert 1 not in conn.streams
        left = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        assert not left, f"tasks still waiting after the stream ended: {left}"
        assert all(r.cancelled for r in manager.model.requests)  # withdrawn from the queue
        conn.connection_lost(None)

    asyncio.run(run())
