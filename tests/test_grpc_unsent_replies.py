"""gRPC answers nobody reads are bounded in total (--http-max-unsent-size), as HTTP's are.

A client may open its flow-control windows wide, send calls on many connections and read no
answer: each connection stopped reading at its own high water, but nothing bounded the sum. Past
the cap the connection holding most is closed; a client that reads is still served. Answers a
client's flow-control windows hold back count too.
"""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import tritonclient.grpc as grpcclient
from hpack import Encoder
from serving import python_models, start_worker
from tritonclient.grpc import service_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, WINDOW_UPDATE = 0, 1, 4, 8
END_STREAM, END_HEADERS = 0x1, 0x4
S_INITIAL_WINDOW_SIZE = 4
MAX_WINDOW = (1 << 31) - 1
MIB = 1 << 20

ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""
CONFIG = ('max_batch_size: 0 input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ] '
          'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]')  # fmt: skip


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(
        ">I", stream) + payload


def call(encoder: Encoder, stream: int, message: bytes) -> bytes:
    """One ModelInfer call: its headers, then its message in DATA frames of 16 KiB."""
    head = encoder.encode([
        (":method", "POST"), (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ModelInfer"),
        (":authority", "localhost"), ("te", "trailers"), ("content-type", "application/grpc"),
    ])  # fmt: skip
    body = b"\x00" + struct.pack(">I", len(message)) + message
    chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    frames = [frame(HEADERS, END_HEADERS, stream, head)]
    frames += [frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, stream, chunk)
               for i, chunk in enumerate(chunks)]  # fmt: skip
    return b"".join(frames)


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closed the connection: reading to its end (everything it sent, then
    EOF or a reset) takes less than `within` seconds."""
    sock.settimeout(within)
    end = time.monotonic() + within
    try:
        while time.monotonic() < end:
            if not sock.recv(1 << 20):
                return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return False


def test_answers_unread_on_many_connections_are_bounded_in_total(tmp_path):
    python_models(tmp_path, {"echo": ECHO}, CONFIG)
    served = start_worker(tmp_path, "--http-max-unsent-size", "8MB")
    try:
        host, port = served.grpc.rsplit(":", 1)
        request = pb.ModelInferRequest(model_name="echo")
        request.inputs.add(name="X", datatype="FP32", shape=[3 * MIB // 2])  # 6 MiB each way
        request.raw_input_contents.append(np.ones(3 * MIB // 2, np.float32).tobytes())
        message = request.SerializeToString()
        peers = []
        for _ in range(6):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel keeps little
            sock.connect((host, int(port)))
            encoder = Encoder()
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(
                ">HI", S_INITIAL_WINDOW_SIZE, MAX_WINDOW))  # our windows: as wide as can be
                + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))  # fmt: skip
            sock.sendall(call(encoder, 1, message))
            peers.append(sock)
        # a client that reads is served meanwhile, and the worker outlives what the others do
        with grpcclient.InferenceServerClient(served.grpc) as client:
            x = grpcclient.InferInput("X", [4], "FP32")
            x.set_data_from_numpy(np.arange(4, dtype=np.float32))
            assert client.infer("echo", [x]).as_numpy("Y").tolist() == [0, 1, 2, 3]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            "over --http-max-unsent-size" in line for line in served.output
        ):
            time.sleep(0.1)
        warnings = [line for line in served.output if "over --http-max-unsent-size" in line]
        assert warnings, "no connection was closed for the replies it did not read"
        # the connections it closed are closed: their reads end (the others stay open)
        gone = sum(closed(sock, 5) for sock in peers)
        assert gone >= len(warnings) >= 1
        assert gone < len(peers)  # it closed the ones holding most, not every one
        for sock in peers:
            sock.close()
        with grpcclient.InferenceServerClient(served.grpc) as client:
            assert client.is_server_live()
    finally:
        served.stop()


def test_answers_a_client_gives_no_window_for_are_bounded_in_total(tmp_path):
    """A client that reads its socket but opens no flow-control window: each answer's DATA waits
    in the worker, on a stream whose call is answered (its RPC slot free), so calls could be
    sent until the worker ran out of memory. Those bytes count as unsent replies too."""
    python_models(tmp_path, {"echo": ECHO}, CONFIG)
    served = start_worker(tmp_path, "--http-max-unsent-size", "16MB")
    try:
        host, port = served.grpc.rsplit(":", 1)
        request = pb.ModelInferRequest(model_name="echo")
        request.inputs.add(name="X", datatype="FP32", shape=[MIB // 2])  # 2 MiB each way
        request.raw_input_contents.append(np.ones(MIB // 2, np.float32).tobytes())
        message = request.SerializeToString()
        sock = socket.create_connection((host, int(port)))
        encoder = Encoder()
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 0)))
        sent = 0
        for n in range(40):  # 80 MiB of answers asked for, five times the cap
            try:
                sock.sendall(call(encoder, 2 * n + 1, message))
            except ConnectionError:
                break
            sent += 1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            "over --http-max-unsent-size" in line for line in served.output
        ):
            time.sleep(0.1)
        assert any("over --http-max-unsent-size" in line for line in served.output), (
            f"{sent} calls of 2 MiB answers held back by flow control and no connection closed")
        assert closed(sock, 10)
        sock.close()
        with grpcclient.InferenceServerClient(served.grpc) as client:  # others are served
            x = grpcclient.InferInput("X", [4], "FP32")
            x.set_data_from_numpy(np.arange(4, dtype=np.float32))
            assert client.infer("echo", [x]).as_numpy("Y").tolist() == [0, 1, 2, 3]
    finally:
        served.stop()
