"""The load generator's own HTTP/2 gRPC client against grpcio's server (another implementation
of the protocol: HPACK with a dynamic table, its own windows and stream limits), and against ours.
"""

from __future__ import annotations

import asyncio
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from analyzer.loadgen import grpc_client
from analyzer.loadgen.payload import grpc_request

now_ns = time.monotonic_ns


class Peer:
    """A grpcio server whose ModelInfer echoes sizes, fails on request, or answers big."""

    def __init__(self, **options) -> None:
        self.calls = 0
        self.max_active = 0
        self.active = 0
        handler = grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {"ModelInfer": grpc.unary_unary_rpc_method_handler(self.infer)},
        )
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        opts += list(options.items())
        self.server = grpc.server(futures.ThreadPoolExecutor(16), options=opts)
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def infer(self, request: bytes, context) -> bytes:
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            message = pb.ModelInferRequest.FromString(request)
            if message.id == "fail":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input 'ü' 100%")
            if message.id == "slow":
                time.sleep(0.05)
            size = int(message.id) if message.id.isdigit() else 0
            answer = pb.ModelInferResponse(model_name=message.model_name, id=message.id)
            answer.raw_output_contents.append(b"x" * size)
            answer.raw_output_contents.append(str(len(request)).encode())
            return answer.SerializeToString()
        finally:
            self.active -= 1

    def stop(self) -> None:
        self.server.stop(0)


def message(request_id: str = "", payload_bytes: int = 16) -> bytes:
    array = np.zeros(payload_bytes // 4, np.float32)
    body = grpc_request("m", "", {"IN": array}, {"IN": "FP32"})
    request = pb.ModelInferRequest.FromString(body[5:])
    request.id = request_id
    return grpc_client.grpc_message(request.SerializeToString())


def answered(result: object) -> bool:
    """A finished call: written to the kernel, then answered (its times in that order)."""
    return isinstance(result, grpc_client.Call) and 0 < result.sent <= result.first_byte


async def calls(port: int, messages: list[bytes]) -> list[object]:
    conn = await grpc_client.connect("127.0.0.1", port, now_ns)
    try:
        gathered = asyncio.gather(*(conn.start(m) for m in messages), return_exceptions=True)
        return await asyncio.wait_for(gathered, 30)  # a flow-control bug stalls, never hangs
    finally:
        conn.close()


@pytest.fixture
def peer():
    server = Peer()
    yield server
    server.stop()


def test_many_calls_on_one_connection_succeed(peer):
    results = asyncio.run(calls(peer.port, [message(str(i)) for i in range(200)]))
    assert all(answered(r) for r in results), results[:3]
    assert peer.calls == 200


def test_error_status_and_message_are_decoded(peer):
    results = asyncio.run(calls(peer.port, [message("fail"), message("1"), message("fail")]))
    assert answered(results[1])
    for failed in (results[0], results[2]):
        assert isinstance(failed, grpc_client.GrpcCallError)
        assert str(failed) == "gRPC INVALID_ARGUMENT: bad input 'ü' 100%"


def test_request_larger_than_the_server_windows_is_sent_in_pieces(peer):
    big = message("3", payload_bytes=12 << 20)  # grpcio announces 4 MiB windows and frames
    results = asyncio.run(calls(peer.port, [big, message("1"), big]))
    assert all(answered(r) for r in results), results
    assert peer.calls == 3


def test_answer_larger_than_our_stream_window_is_received(peer):
    size = grpc_client.RECV_STREAM_WINDOW + (4 << 20)  # needs our WINDOW_UPDATEs to arrive
    results = asyncio.run(calls(peer.port, [message(str(size)), message(str(size))]))
    assert all(answered(r) for r in results), results


def test_server_stream_limit_queues_calls_instead_of_failing():
    peer = Peer(**{"grpc.max_concurrent_streams": 2})
    try:
        results = asyncio.run(calls(peer.port, [message("slow") for _ in range(8)]))
        assert all(answered(r) for r in results), results
        assert peer.max_active <= 2
    finally:
        peer.stop()


def test_server_going_away_fails_calls_without_hanging():
    peer = Peer()

    async def run() -> list[object]:
        conn = await grpc_client.connect("127.0.0.1", peer.port, now_ns)
        pending = [conn.start(message("slow")) for _ in range(4)]
        await asyncio.sleep(0.01)
        peer.server.stop(0)
        done = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
        later = await asyncio.wait_for(asyncio.gather(conn.start(message("1")),
                                                      return_exceptions=True), 10)  # fmt: skip
        return [*done, *later]

    results = asyncio.run(run())
    assert all(isinstance(r, ConnectionError | grpc_client.GrpcCallError) or answered(r)
               for r in results), results  # fmt: skip
    assert isinstance(results[-1], ConnectionError)


def test_calls_to_our_worker_succeed_and_reuse_one_header_block(examples_worker):
    from analyzer.http2 import table_neutral

    first, later, _, _ = grpc_client.request_headers("127.0.0.1:1")
    assert not table_neutral(first) and table_neutral(later)
    array = {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)}
    body = grpc_request("add_sub", "", array, {"INPUT0": "FP32", "INPUT1": "FP32"})
    port = int(examples_worker.grpc.rsplit(":", 1)[1])
    bad = grpc_request("no_such_model", "", array, {"INPUT0": "FP32", "INPUT1": "FP32"})
    results = asyncio.run(calls(port, [body] * 50 + [bad]))
    assert all(answered(r) for r in results[:50]), results[:3]
    assert isinstance(results[50], grpc_client.GrpcCallError)
    assert "no_such_model" in str(results[50])


def test_unreadable_answer_ends_the_calls_with_an_error():
    """A server that answers with a header block HPACK cannot decode: calls fail, none hangs."""
    from analyzer.http2 import END_HEADERS, HEADERS, SETTINGS, frame

    async def run() -> list[object]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(frame(SETTINGS, 0, 0))
            await reader.read(65536)  # the preface, settings and the first call
            writer.write(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\xff"))
            await writer.drain()
            await reader.read(65536)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await calls(port, [message("1"), message("2")])
        finally:
            server.close()

    results = asyncio.run(run())
    assert all(isinstance(r, ConnectionError) for r in results), results
    assert "unreadable HTTP/2" in str(results[0])


def test_shard_ends_when_its_parent_leaves_while_the_server_is_down():
    """A client process must not outlive the profile that started it, even while every call
    fails to reconnect (seen: orphaned shards spinning at 80% of a core after a Ctrl-C)."""
    import subprocess

    from analyzer.loadgen.client import LoadClient

    peer = Peer()
    client = LoadClient("grpc", f"127.0.0.1:{peer.port}", [message("1")], processes=1)
    client.start()
    try:
        client.set_concurrency(64)
        time.sleep(0.3)
        assert peer.calls > 0
        peer.server.stop(0)  # every call now fails and reconnects at once
        time.sleep(0.3)
        client.drain()
        shard = client.shards[0]
        shard.sock.close()  # the parent goes away without a word
        try:
            shard.process.wait(15)
        except subprocess.TimeoutExpired:
            shard.process.kill()
            pytest.fail("the shard kept running after its parent left")
        client.shards = []
    finally:
        client.close()
        peer.stop()
