"""`--grpc-max-concurrent-rpcs`: RPCs beyond the cap are refused at once, the rest are served."""

from __future__ import annotations

import threading

import grpc
import numpy as np
from serving import start_worker
from test_worker_faults import python_repo
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

CAP = 2
SENT = 5


def request(seconds: float) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="slow")
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([seconds], np.float32).tobytes())
    return message


def call(address: str, seconds: float) -> grpc.StatusCode:
    """One unary ModelInfer on its own connection.

    Channels of one process share connections by default, and on one connection the cap is also
    HTTP/2's stream limit: the client would queue the extra calls instead of sending them.
    """
    own = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(address, options=own) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(request(seconds), timeout=60)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK


def wave(address: str) -> list[grpc.StatusCode]:
    """SENT calls at once, each holding its RPC open for 1.5 s of model time."""
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def send() -> None:
        code = call(address, 1.5)
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=send) for _ in range(SENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return codes


def test_rpcs_over_the_cap_are_refused_and_the_worker_serves_afterwards(tmp_path):
    repo, _ = python_repo(tmp_path)
    worker = start_worker(repo, f"--grpc-max-concurrent-rpcs={CAP}")
    try:
        assert call(worker.grpc, 0.0) == grpc.StatusCode.OK  # model loaded and warm
        for _ in range(2):  # a second wave: refused calls must not loosen the cap (grpc#41531)
            codes = wave(worker.grpc)
            assert len(codes) == SENT, "every RPC was answered"
            assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
            assert codes.count(grpc.StatusCode.OK) >= 1
            assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= SENT - CAP - 1, codes
        assert call(worker.grpc, 0.0) == grpc.StatusCode.OK  # the cap frees as RPCs end
    finally:
        worker.stop()


def test_at_the_connection_cap_idle_connections_make_room_and_busy_ones_do_not(tmp_path):
    """gRPC connections count against --http-max-connections too. Connections that only sent
    the preface were kept for the idle timeout and newcomers were cut off without a word, so
    one client could keep all others out; now the connection idle longest is sent away (a
    GOAWAY) for a newcomer, and a newcomer finding every connection with a call open gets a
    GOAWAY saying why."""
    import socket
    import time

    from test_grpc_stream_bound import pending

    from analyzer.http2 import PREFACE

    repo, _ = python_repo(tmp_path)
    worker = start_worker(repo, "--http-max-connections=3")
    host, port = worker.grpc.rsplit(":", 1)
    idle = []
    try:
        for _ in range(3):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an empty SETTINGS
            idle.append(sock)
        time.sleep(0.2)  # the three are in
        assert call(worker.grpc, 0.0) == grpc.StatusCode.OK  # an idle one made room
        sent_away = []
        for sock in idle:  # each holds the server's SETTINGS; one a GOAWAY too, then the close
            sock.settimeout(1.0)
            seen = b""
            try:
                while chunk := sock.recv(1 << 16):
                    seen += chunk
            except TimeoutError:
                continue  # still open
            sent_away.append(seen)
        assert len(sent_away) == 1 and b"the server is at its connection limit" in sent_away[0]
        for sock in idle:
            sock.close()
        # three calls open: a newcomer is refused with a GOAWAY that says why
        busy = [threading.Thread(target=call, args=(worker.grpc, 3.0)) for _ in range(3)]
        for thread in busy:
            thread.start()
        deadline = time.monotonic() + 30
        while pending(worker.metrics) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # one runs, two wait: every connection has its call open
        sock = socket.create_connection((host, int(port)), timeout=10)
        seen = b""
        while chunk := sock.recv(1 << 16):
            seen += chunk
        sock.close()
        assert b"limit of 3 open connections" in seen
        for thread in busy:
            thread.join(60)
    finally:
        worker.stop()
