"""The worker's own HTTP/2 transport for gRPC, frame by frame: what grpcio's clients never send.

tritonclient and perf_analyzer cover the calls; here a raw socket checks flow control both ways,
CONTINUATION, padding, PING, SETTINGS, RST_STREAM and protocol violations.
"""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest
from hpack import Decoder, Encoder
from serving import EXAMPLES, start_worker
from tritonclient.grpc import service_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9,
)  # fmt: skip
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8


@pytest.fixture(scope="module")
def worker(examples_worker):
    return examples_worker


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream)
    return head + payload


class Peer:
    """A bare HTTP/2 client: sends frames, reads frames, decodes header blocks."""

    def __init__(self, address: str, settings: dict[int, int] | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.buf = b""
        body = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, body))

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read(self) -> tuple[int, int, int, bytes] | None:
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        n = int.from_bytes(self.buf[:3], "big")
        kind, flags = self.buf[3], self.buf[4]
        stream = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
        payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
        if kind == HEADERS:
            payload = dict(self.decoder.decode(payload, raw=True))  # type: ignore[assignment]
        return kind, flags, stream, payload

    def until(self, wanted, limit: float = 10):
        """Frames up to and including the first one `wanted(frame)` accepts."""
        seen, end = [], time.monotonic() + limit
        while time.monotonic() < end:
            got = self.read()
            if got is None:
                break
            seen.append(got)
            if wanted(got):
                return seen
        raise AssertionError(f"not seen; got {[(f[0], f[1], f[2]) for f in seen]}")

    def request_headers(self, method: str = "ModelInfer", extra=()) -> bytes:
        return self.encoder.encode([
            (":method", "POST"), (":scheme", "http"),
            (":path", f"/inference.GRPCInferenceService/{method}"),
            (":authority", "localhost"), ("te", "trailers"),
            ("content-type", "application/grpc"), *extra,
        ])  # fmt: skip

    def close(self) -> None:
        self.sock.close()


def add_sub_message(a: float = 3.0, b: float = 1.0) -> bytes:
    request = pb.ModelInferRequest(model_name="add_sub", id="raw")
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.full(4, value, np.float32).tobytes())
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


def ends(stream: int):
    return lambda f: f[2] == stream and f[0] in (HEADERS, RST_STREAM) and f[1] & END_STREAM


def answer(frames: list, stream: int) -> tuple[pb.ModelInferResponse | None, dict]:
    data = b"".join(f[3] for f in frames if f[0] == DATA and f[2] == stream)
    trailers = [f[3] for f in frames if f[0] == HEADERS and f[2] == stream][-1]
    if not data:
        return None, trailers
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    return pb.ModelInferResponse.FromString(data[5:]), trailers


def check_add_sub(response: pb.ModelInferResponse, a: float = 3.0, b: float = 1.0) -> None:
    pairs = zip(response.outputs, response.raw_output_contents, strict=True)
    out = {o.name: np.frombuffer(raw, np.float32) for o, raw in pairs}
    assert out["OUTPUT0"].tolist() == [a + b] * 4 and out["OUTPUT1"].tolist() == [a - b] * 4


def still_serves(peer: Peer, stream: int) -> None:
    """The connection answers an add_sub call on `stream`."""
    peer.send(frame(HEADERS, END_HEADERS, stream, peer.request_headers()),
              frame(DATA, END_STREAM, stream, add_sub_message()))  # fmt: skip
    response, _ = answer(peer.until(ends(stream)), stream)
    check_add_sub(response)


def test_ping_and_settings_are_acknowledged(worker):
    peer = Peer(worker.grpc)
    try:
        peer.send(frame(PING, 0, 0, b"12345678"))
        frames = peer.until(lambda f: f[0] == PING)
        assert frames[-1][1] == 1 and frames[-1][3] == b"12345678"
        assert any(f[0] == SETTINGS and f[1] == 1 for f in frames) or peer.until(
            lambda f: f[0] == SETTINGS and f[1] == 1
        )
    finally:
        peer.close()


def test_headers_in_continuations_and_a_message_in_padded_pieces(worker):
    peer = Peer(worker.grpc)
    try:
        block, message = peer.request_headers(), add_sub_message()
        half = len(block) // 2
        pieces = [message[i : i + 7] for i in range(0, len(message), 7)]
        frames = [frame(HEADERS, 0, 1, block[:half]),
                  frame(CONTINUATION, END_HEADERS, 1, block[half:])]  # fmt: skip
        for i, piece in enumerate(pieces):
            last = END_STREAM if i == len(pieces) - 1 else 0
            frames.append(frame(DATA, PADDED | last, 1, b"\x03" + piece + b"\x00\x00\x00"))
        peer.send(*frames)
        response, trailers = answer(peer.until(ends(1)), 1)
        assert trailers[b"grpc-status"] == b"0"
        check_add_sub(response)
    finally:
        peer.close()


def test_repeated_calls_in_one_write_and_dribbled_byte_by_byte(worker):
    """The same request layout again and again (the kept-layout path) with new values each
    time: calls packed into one write, then a call whose frames arrive a few bytes at a time."""
    peer = Peer(worker.grpc)
    try:
        calls = []
        for i, stream in enumerate(range(1, 12, 2)):
            calls += [frame(HEADERS, END_HEADERS, stream, peer.request_headers()),
                      frame(DATA, END_STREAM, stream, add_sub_message(float(i), 0.5))]  # fmt: skip
        peer.send(*calls)
        frames = peer.until(ends(11))
        for i, stream in enumerate(range(1, 12, 2)):
            if not any(ends(stream)(f) for f in frames):
                frames += peer.until(ends(stream))
            response, trailers = answer(frames, stream)
            assert trailers[b"grpc-status"] == b"0" and response.id == "raw"
            check_add_sub(response, float(i), 0.5)
        wire = (frame(HEADERS, END_HEADERS, 13, peer.request_headers())
                + frame(DATA, END_STREAM, 13, add_sub_message(7.0, 2.0)))  # fmt: skip
        for i in range(0, len(wire), 5):
            peer.send(wire[i : i + 5])
            time.sleep(0.001)
        response, trailers = answer(peer.until(ends(13)), 13)
        assert trailers[b"grpc-status"] == b"0"
        check_add_sub(response, 7.0, 2.0)
    finally:
        peer.close()


def test_calls_in_perf_analyzers_frame_order_are_answered_in_three_frames(worker):
    """grpc-c++ sends HEADERS, the stream's WINDOW_UPDATE, the whole message in one DATA that
    ends the stream, then the connection's WINDOW_UPDATE; each answer is HEADERS, one DATA and
    the OK trailers, and the windows both ways stay counted (the connection's 65,535 bytes last
    ~700 answers of add_sub without the client's updates)."""
    peer = Peer(worker.grpc)
    try:
        for i, stream in enumerate(range(1, 1001 * 2, 2)):
            message = add_sub_message(float(i % 7), 0.25)
            peer.send(frame(HEADERS, END_HEADERS, stream, peer.request_headers()),
                      frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", 5)),
                      frame(DATA, END_STREAM, stream, message),
                      frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 200)))  # fmt: skip
            frames = [f for f in peer.until(ends(stream)) if f[2] == stream]
            assert [(f[0], f[1]) for f in frames] == [
                (HEADERS, END_HEADERS), (DATA, 0), (HEADERS, END_HEADERS | END_STREAM),
            ], f"call {i}"  # fmt: skip
            assert frames[0][3][b":status"] == b"200"
            assert frames[0][3][b"content-type"] == b"application/grpc"
            response, trailers = answer(frames, stream)
            assert trailers == {b"grpc-status": b"0"}
            check_add_sub(response, float(i % 7), 0.25)
    finally:
        peer.close()


def stream_answers(frames: list, stream: int) -> list[pb.ModelStreamInferResponse]:
    data = b"".join(f[3] for f in frames if f[0] == DATA and f[2] == stream)
    out = []
    while data:
        n = int.from_bytes(data[1:5], "big")
        out.append(pb.ModelStreamInferResponse.FromString(data[5 : 5 + n]))
        data = data[5 + n :]
    return out


def test_a_stream_answers_with_the_final_flag_and_ends_on_a_malformed_message(worker):
    peer = Peer(worker.grpc)
    try:
        def message(i: int, final: bool) -> bytes:
            request = pb.ModelInferRequest.FromString(add_sub_message(float(i), 1.0)[5:])
            request.id = str(i)
            if final:
                request.parameters["triton_enable_empty_final_response"].bool_param = True
            body = request.SerializeToString()
            return b"\x00" + struct.pack(">I", len(body)) + body

        frames = [frame(HEADERS, END_HEADERS, 1, peer.request_headers("ModelStreamInfer"))]
        frames += [frame(DATA, 0, 1, message(i, final=i % 2 == 0)) for i in range(4)]
        frames.append(frame(DATA, END_STREAM, 1, message(4, final=True)))
        peer.send(*frames)
        seen = peer.until(ends(1))
        answers = {int(a.infer_response.id): a for a in stream_answers(seen, 1)}
        assert sorted(answers) == [0, 1, 2, 3, 4]
        for i, a in answers.items():
            assert not a.error_message
            flag = a.infer_response.parameters.get("triton_final_response")
            assert (flag is not None and flag.bool_param) == (i % 2 == 0), i
            check_add_sub(a.infer_response, float(i), 1.0)
        assert seen[-1][3][b"grpc-status"] == b"0"

        bad = b"\x0a\xff\xff"  # a field longer than the message
        frames = [frame(HEADERS, END_HEADERS, 3, peer.request_headers("ModelStreamInfer")),
                  frame(DATA, 0, 3, message(7, final=False)),
                  frame(DATA, 0, 3, b"\x00" + struct.pack(">I", len(bad)) + bad),
                  frame(DATA, END_STREAM, 3, message(8, final=False))]  # fmt: skip
        peer.send(*frames)
        seen = peer.until(ends(3))
        trailers = [f[3] for f in seen if f[0] == HEADERS and f[2] == 3][-1]
        assert trailers[b"grpc-status"] == b"3" and b"malformed" in trailers[b"grpc-message"]
        assert [a.infer_response.id for a in stream_answers(seen, 3)] == ["7"]
    finally:
        peer.close()


def test_answers_wait_for_the_clients_flow_control_window(worker):
    peer = Peer(worker.grpc, {4: 10})  # SETTINGS_INITIAL_WINDOW_SIZE: 10 bytes per stream
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(DATA, END_STREAM, 1, add_sub_message()))  # fmt: skip
        got = peer.until(lambda f: f[0] == DATA and f[2] == 1)
        assert len(got[-1][3]) == 10, "no more DATA than the window allows"
        peer.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):  # nothing else until the window opens
            peer.read()
        peer.sock.settimeout(10)
        peer.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)))
        response, trailers = answer(got + peer.until(ends(1)), 1)
        assert trailers[b"grpc-status"] == b"0"
        check_add_sub(response)
    finally:
        peer.close()


def test_a_smaller_header_table_is_announced_before_the_next_block(worker):
    peer = Peer(worker.grpc, {1: 0})  # SETTINGS_HEADER_TABLE_SIZE 0
    try:
        peer.decoder.max_allowed_table_size = 0
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(DATA, END_STREAM, 1, add_sub_message()))  # fmt: skip
        response, trailers = answer(peer.until(ends(1)), 1)
        assert trailers[b"grpc-status"] == b"0"
        check_add_sub(response)
    finally:
        peer.close()


def test_errors_are_trailers_only_with_grpc_status(worker):
    peer = Peer(worker.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.request_headers("Nope")))
        trailers = peer.until(ends(1))[-1][3]
        assert trailers[b":status"] == b"200" and trailers[b"grpc-status"] == b"12"  # UNIMPLEMENTED
        bad = b"\x00" + struct.pack(">I", 3) + b"\xff\xff\xff"
        peer.send(frame(HEADERS, END_HEADERS, 3, peer.request_headers()),
                  frame(DATA, END_STREAM, 3, bad))  # fmt: skip
        trailers = peer.until(ends(3))[-1][3]
        assert trailers[b"grpc-status"] == b"3"  # INVALID_ARGUMENT
        assert b"malformed" in trailers[b"grpc-message"]
        timeout = peer.request_headers(extra=[("grpc-timeout", "x")])
        message = add_sub_message()
        peer.send(frame(HEADERS, END_HEADERS, 5, timeout), frame(DATA, END_STREAM, 5, message))
        assert peer.until(ends(5))[-1][3][b"grpc-status"] == b"13"  # INTERNAL
    finally:
        peer.close()


def test_a_message_over_the_cap_is_refused_before_it_arrives(tmp_path):
    served = start_worker(EXAMPLES, "--grpc-max-message-size", "1024")
    peer = Peer(served.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(DATA, 0, 1, b"\x00" + struct.pack(">I", 1 << 30) + b"x" * 100))  # fmt: skip
        frames = peer.until(lambda f: f[2] == 1 and f[0] == RST_STREAM)
        trailers = [f[3] for f in frames if f[0] == HEADERS][-1]
        assert trailers[b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
        still_serves(peer, 3)
    finally:
        peer.close()
        served.stop()


@pytest.mark.parametrize(
    "bad",
    [
        frame(HEADERS, END_HEADERS, 2, b"\x82"),  # an even stream id
        frame(DATA, 0, 99, b"x"),  # a stream never opened
        frame(HEADERS, 0, 1, b"\x82") + frame(PING, 0, 0, b"12345678"),  # CONTINUATION missing
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)),
        frame(PING, 0, 0, b"1234"),
        frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"),  # an HPACK index out of range
    ],
)
def test_protocol_violations_end_the_connection_with_goaway(worker, bad):
    peer = Peer(worker.grpc)
    try:
        peer.send(bad)
        assert peer.until(lambda f: f[0] == GOAWAY)[-1][0] == GOAWAY
    finally:
        peer.close()


def test_not_http2_is_closed(worker):
    host, port = worker.grpc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data  # our SETTINGS, then GOAWAY, then the close
    peer = Peer(worker.grpc)  # and the server goes on
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(DATA, END_STREAM, 1, add_sub_message()))  # fmt: skip
        response, _ = answer(peer.until(ends(1)), 1)
        check_add_sub(response)
    finally:
        peer.close()


def _indexed(name: bytes, value: bytes) -> bytes:
    """An HPACK literal with incremental indexing and a new name (RFC 7541 6.2.1), short
    lengths only."""
    assert len(name) < 127
    length = (bytes([len(value)]) if len(value) < 127
              else bytes([127]) + _varint(len(value) - 127))  # fmt: skip
    return b"\x40" + bytes([len(name)]) + name + length + value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    return bytes([*out, n])


def test_a_few_bytes_naming_a_large_table_entry_again_are_held_to_the_header_cap(worker):
    """A header block of at most 64 bytes that only names table entries took a shortcut that
    skipped the header-list cap: 64 bytes naming a 3,900-byte entry 61 times were a 240 KB head,
    served, and kept (64 per connection: 15 MB a connection). Now the decoder's cap holds."""
    path = b"/inference.GRPCInferenceService/ServerLive"
    seed = (b"\x83" + _indexed(b":path", path) + _indexed(b"content-type", b"application/grpc")
            + _indexed(b"x", b"A" * 3900))  # fmt: skip
    peer = Peer(worker.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, seed))
        assert peer.until(ends(1))[-1][3][b"grpc-status"] == b"3"  # no request message: answered
        # :method POST, then the table's newest three: :path (64), content-type (63), x (62)
        block = bytes([0x83, 0xC0, 0xBF]) + bytes([0xBE]) * 61
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, block))
        kind, _, _, payload = peer.until(lambda f: f[0] == GOAWAY)[-1]
        assert struct.unpack(">I", payload[4:8])[0] == 9  # COMPRESSION_ERROR
        assert b"A header list larger than" in payload[8:]
    finally:
        peer.close()


def test_a_status_message_quoting_a_long_client_value_is_cut(worker):
    """Messages that quote a client's value (here a datatype of 20,000 characters) went out
    whole in one trailers frame: grpcio refused the 20 KB header ("received metadata size
    exceeds hard limit"), and past 16 MiB the frame could not be written (a traceback, the
    connection closed with no status for the call)."""
    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="X" * 20_000, shape=[1, 4])
    body = request.SerializeToString()
    peer = Peer(worker.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(body)) + body))
        trailers = peer.until(ends(1))[-1][3]
        assert trailers[b"grpc-status"] == b"3"  # INVALID_ARGUMENT
        message = trailers[b"grpc-message"]
        assert message.endswith(b"...") and len(message) <= 3 * 1024, len(message)
    finally:
        peer.close()


def _data_frames(stream: int, message: bytes, end: bool, size: int = 16_384) -> list[bytes]:
    pieces = [message[i : i + size] for i in range(0, len(message), size)]
    return [frame(DATA, END_STREAM if end and i == len(pieces) - 1 else 0, stream, piece)
            for i, piece in enumerate(pieces)]  # fmt: skip


def test_whole_messages_of_calls_that_do_not_end_count_in_the_buffered_total():
    """A unary call's message that had arrived whole was held outside --http-max-buffered-size
    until its stream ended: calls that never ended held any number of messages of up to the
    message cap each until the header timeout (10 calls of 12 MiB against a 16 MB total)."""
    served = start_worker(EXAMPLES, "--http-max-buffered-size", "1MB")
    peer = Peer(served.grpc)
    try:
        request = pb.ModelInferRequest(model_name="add_sub", id="x" * 600_000)
        body = request.SerializeToString()
        message = b"\x00" + struct.pack(">I", len(body)) + body
        for stream in (1, 3):
            peer.send(frame(HEADERS, END_HEADERS, stream, peer.request_headers()),
                      *_data_frames(stream, message, end=False))  # fmt: skip
        trailers = peer.until(lambda f: f[0] == HEADERS and f[2] == 3)[-1][3]
        assert trailers[b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
        assert b"half-received" in trailers[b"grpc-message"]
        still_serves(peer, 5)
    finally:
        peer.close()
        served.stop()


def test_a_stream_message_larger_than_the_stream_window_arrives(worker):
    """A ModelStreamInfer message's window came back only once the message was whole, so one
    larger than the stream's window (8 MiB) never arrived: the call hung until its deadline."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    request = pb.ModelInferRequest.FromString(add_sub_message(2.0, 5.0)[5:])
    request.id = "i" * (9 << 20)
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(worker.grpc, options=options) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter([request]), timeout=60))
    assert len(answers) == 1 and not answers[0].error_message
    assert len(answers[0].infer_response.id) == 9 << 20
    check_add_sub(answers[0].infer_response, 2.0, 5.0)


def test_a_stream_message_that_stops_half_way_times_out():
    """ModelStreamInfer streams were exempt from the header timeout, so a message that stopped
    arriving half-way held its bytes in the worker's total for as long as the client liked."""
    served = start_worker(EXAMPLES, "--http-header-timeout", "1")
    peer = Peer(served.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers("ModelStreamInfer")),
                  frame(DATA, 0, 1, b"\x00" + struct.pack(">I", 1 << 20) + b"x" * 10_000))
        trailers = peer.until(lambda f: f[0] == HEADERS and f[2] == 1)[-1][3]
        assert trailers[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED
        assert b"did not arrive in time" in trailers[b"grpc-message"]
    finally:
        peer.close()
        served.stop()


def test_a_connection_sent_away_that_reads_nothing_is_dropped():
    """GOAWAY then close(), which waits until the client has read what was written: a client
    that read nothing kept its connection open for ever, counted at the connection cap (one
    such client kept every newcomer out). It is now dropped after a grace period."""
    served = start_worker(EXAMPLES, "--http-max-connections", "1", "--http-idle-timeout", "1")
    host, port = served.grpc.rsplit(":", 1)
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        stuck.connect((host, int(port)))
        settings = struct.pack(">HI", 4, (1 << 31) - 1)  # SETTINGS_INITIAL_WINDOW_SIZE
        stuck.sendall(PREFACE + frame(SETTINGS, 0, 0, settings)
                      + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)))
        encoder = Encoder()
        request = pb.ModelInferRequest.FromString(add_sub_message()[5:])
        request.id = "x" * (1 << 20)  # answered with the id: 1 MiB an answer
        body = request.SerializeToString()
        message = b"\x00" + struct.pack(">I", len(body)) + body
        head = encoder.encode([(":method", "POST"), (":scheme", "http"),
                               (":path", "/inference.GRPCInferenceService/ModelInfer"),
                               (":authority", "x"), ("content-type", "application/grpc")])
        for stream in range(1, 16, 2):  # 8 MiB of answers that nobody reads
            stuck.sendall(frame(HEADERS, END_HEADERS, stream, head)
                          + b"".join(_data_frames(stream, message, end=True)))
        time.sleep(3)  # idle after its answers, so sent away (not made room for a newcomer)
        deadline = time.monotonic() + 60
        while True:  # the newcomer waits for it to go
            peer = Peer(served.grpc)
            try:
                peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                          frame(DATA, END_STREAM, 1, add_sub_message()))  # fmt: skip
                got = peer.until(lambda f: f[0] == GOAWAY or ends(1)(f), 10)[-1]
            except (AssertionError, OSError):
                got = (GOAWAY,)
            finally:
                peer.close()
            if got[0] != GOAWAY:
                break
            assert time.monotonic() < deadline, "the connection that reads nothing stayed"
            time.sleep(1)
    finally:
        stuck.close()
        served.stop()


def test_a_settings_change_that_overflows_a_streams_window_ends_the_connection(worker):
    """RFC 9113 6.9.2: a SETTINGS_INITIAL_WINDOW_SIZE change that takes a stream's window past
    2^31-1 is a connection error (FLOW_CONTROL_ERROR); it was taken silently."""
    peer = Peer(worker.grpc)
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, peer.request_headers()),
                  frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", (1 << 31) - 1 - 65535)),
                  frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65536)))  # fmt: skip
        payload = peer.until(lambda f: f[0] == GOAWAY)[-1][3]
        assert struct.unpack(">I", payload[4:8])[0] == 3  # FLOW_CONTROL_ERROR
    finally:
        peer.close()


@pytest.mark.parametrize("damage", ["cut", "extra"])
def test_a_compressed_message_cut_short_or_with_bytes_after_it_is_refused(worker, damage):
    """A gzip message without its last bytes (its checksum and length) was inflated as far as
    it went and served; bytes after a message's end were ignored."""
    import gzip

    packed = gzip.compress(add_sub_message()[5:])
    packed = packed[:-8] if damage == "cut" else packed + b"junk"
    peer = Peer(worker.grpc)
    try:
        headers = peer.request_headers(extra=[("grpc-encoding", "gzip")])
        peer.send(frame(HEADERS, END_HEADERS, 1, headers),
                  frame(DATA, END_STREAM, 1, b"\x01" + struct.pack(">I", len(packed)) + packed))
        trailers = peer.until(ends(1))[-1][3]
        assert trailers[b"grpc-status"] == b"13"  # INTERNAL, as grpcio's
        assert b"cannot decompress the message" in trailers[b"grpc-message"]
    finally:
        peer.close()
