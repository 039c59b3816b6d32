"""How a load-generator shard sends one request and records it: one transport class per protocol
(keep-alive HTTP/1.1 connections, gRPC calls multiplexed on HTTP/2 connections, or gRPC's
bidirectional ModelStreamInfer streams), and the HTTP/1.1 connection the HTTP transport reuses.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import httptools

from analyzer.loadgen import grpc_client
from analyzer.loadgen.grpc_client import GrpcConnection

if TYPE_CHECKING:
    from analyzer.loadgen.shard import Shard

now_ns = time.monotonic_ns


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time."""

    def __init__(self, on_lost) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.first_byte = 0
        self.keep_body = False
        self.body = bytearray()
        self.reusable = True
        self._on_lost = on_lost

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.first_byte:
            self.first_byte = now_ns()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.reusable = False
            self._finish(exc)

    def on_headers_complete(self) -> None:
        self.keep_body = self.parser.get_status_code() != 200
        if not self.parser.should_keep_alive():
            self.reusable = False

    def on_body(self, body: bytes) -> None:
        if self.keep_body:
            self.body += body

    def on_message_complete(self) -> None:
        self._finish(self.parser.get_status_code())

    def connection_lost(self, exc) -> None:
        self.reusable = False
        self._on_lost(self)
        self._finish(ConnectionError(f"connection closed by the server ({exc or 'EOF'})"))

    def _finish(self, result) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if isinstance(result, BaseException):
                waiter.set_exception(result)
            else:
                waiter.set_result(result)

    def start(self, payload: bytes) -> asyncio.Future:
        self.first_byte = 0
        self.body = bytearray()
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.waiter


class Transport(ABC):
    """How a shard sends one request and records it: one class per protocol (as control.py has
    one per protocol for the control calls)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.config = shard.config
        self.loop = shard.loop
        self.opened = 0  # connections opened, reconnections included

    @abstractmethod
    async def open(self) -> None:
        """The first connection(s), before the shard reports ready."""

    @abstractmethod
    async def request(self, payload: bytes, sched: int, slot: int, quiet: bool = False) -> None:
        """Send one request, wait for its answer and record it on the shard (`quiet`: neither
        its timing nor its error: a request outside the measurement, such as a sequence's END
        sent when the load stops)."""

    def _error(self, message: str, quiet: bool) -> None:
        if not quiet:
            self.shard.errors[message] += 1


class HttpTransport(Transport):
    """Keep-alive HTTP/1.1 connections, one request at a time on each; idle ones are reused."""

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard)
        self.idle: list[HttpConnection] = []

    async def open(self) -> None:
        self.idle.append(await self._connect())

    async def _connect(self) -> HttpConnection:
        self.opened += 1
        tls = self.shard.tls
        _, conn = await self.loop.create_connection(
            lambda: HttpConnection(self._lost), self.config.host, self.config.port, ssl=tls,
            server_hostname=self.config.host if tls is not None else None,
        )  # fmt: skip
        return conn

    def _lost(self, conn: HttpConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    async def request(self, payload: bytes, sched: int, slot: int, quiet: bool = False) -> None:
        conn = self.idle.pop() if self.idle else None
        start = now_ns()
        try:
            if conn is None or conn.transport.is_closing():
                conn = await self._connect()
            waiter = conn.start(payload)
            sent = now_ns()
            try:
                status = await waiter
            except ConnectionError:
                # keep-alive race: the server closed this idle connection (its idle timeout) as
                # the request went out, before any byte of an answer; resend once on a new one
                if conn.first_byte:
                    raise
                conn = await self._connect()
                waiter = conn.start(payload)
                sent = now_ns()
                status = await waiter
            end = now_ns()
            ok = status == 200
            if not ok:
                self._error(_http_error(status, conn.body), quiet)
            recv = end - conn.first_byte if conn.first_byte else 0
        except (OSError, httptools.HttpParserError) as exc:
            end = now_ns()
            sent, recv, ok = end, 0, False
            self._error(f"HTTP request failed: {exc}", quiet)
        if conn is not None and conn.reusable and not conn.transport.is_closing():
            self.idle.append(conn)
        elif conn is not None and conn.transport is not None:
            conn.transport.close()
        if not quiet:
            self.shard.record(start, end, sent - start, recv, sched, ok, slot)


class GrpcTransport(Transport):
    """gRPC calls multiplexed over a few HTTP/2 connections, round robin."""

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard)
        self.connections: list[GrpcConnection] = []
        self.reconnects: dict[int, asyncio.Task] = {}
        self.next = 0

    async def open(self) -> None:
        for _ in range(self.config.grpc_channels):
            self.connections.append(await self._connect())

    async def _connect(self) -> GrpcConnection:
        self.opened += 1
        return await grpc_client.connect(self.config.host, self.config.port, now_ns,
                                         headers=self.config.headers,
                                         tls=self.shard.tls)  # fmt: skip

    async def _conn(self, index: int) -> GrpcConnection:
        """The index-th connection, reopened once (one attempt shared by every call waiting on
        it) when it was lost or the server said GOAWAY (callers check `usable` first: the usual
        case costs no coroutine)."""
        conn = self.connections[index]
        if conn.usable:
            return conn
        pending = self.reconnects.get(index)
        if pending is None:
            conn.close()
            pending = self.loop.create_task(self._connect())
            self.reconnects[index] = pending
            pending.add_done_callback(lambda task: self._reconnected(index, task))
        return await asyncio.shield(pending)

    def _reconnected(self, index: int, task: asyncio.Task) -> None:
        self.reconnects.pop(index, None)
        if not task.cancelled() and task.exception() is None:
            self.connections[index] = task.result()

    async def request(self, payload: bytes, sched: int, slot: int, quiet: bool = False) -> None:
        index = self.next
        self.next = (index + 1) % len(self.connections)
        start = now_ns()
        sent = start
        first_byte = 0
        try:
            conn = self.connections[index]
            if not conn.usable:
                conn = await self._conn(index)
            try:
                call = await conn.start(payload)
            except grpc_client.Unsent:  # the server never processed it: send it once more
                conn = await self._conn(index)
                call = await conn.start(payload)
            sent, first_byte = call.sent or start, call.first_byte
            ok = True
        except grpc_client.GrpcCallError as exc:
            ok = False
            self._error(str(exc), quiet)
        except (TimeoutError, OSError) as exc:
            ok = False
            self._error(f"gRPC request failed: {exc}", quiet)
        end = now_ns()
        recv = end - first_byte if ok and first_byte else 0
        if not quiet:
            self.shard.record(start, end, sent - start, recv, sched, ok, slot)


def _http_error(status: int, body: bytearray) -> str:
    try:
        message = json.loads(bytes(body)).get("error", "")
    except (ValueError, AttributeError):
        message = bytes(body[:200]).decode(errors="replace")
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


class GrpcStreamTransport(Transport):
    """gRPC ModelStreamInfer, as perf_analyzer's `--streaming` sends it and as a decoupled model
    must be called: bidirectional streams over grpcio's asyncio channel, one request in flight
    on each (an idle stream is reused, a new one opened when none is idle), so every response on
    a stream belongs to the request in flight there. A request is done at its response, or for a
    decoupled model at the response flagged `triton_final_response` (its requests ask for that
    flag even when the model sends it alone); its latency runs to that response.

    grpcio, not our own HTTP/2 client: a stream is long-lived and a decoupled model's request
    long, so the client's cost per message matters less than for unary calls.
    """

    def __init__(self, shard: Shard, decoupled: bool) -> None:
        super().__init__(shard)
        self.decoupled = decoupled
        self.idle: list = []
        self.sent_ids = 0
        self.channel = None
        self.method = None

    async def open(self) -> None:
        import grpc  # here, not at import: unary-only shards never load grpcio
        from tritonclient.grpc import service_pb2

        self.grpc, self.response_type = grpc, service_pb2.ModelStreamInferResponse
        self.opened += 1
        target = f"{self.config.host}:{self.config.port}"
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        tls = self.config.tls
        self.channel = (
            grpc.aio.secure_channel(target, tls.grpc_credentials(), options=options)
            if tls is not None else grpc.aio.insecure_channel(target, options=options)
        )  # fmt: skip
        self.method = self.channel.stream_stream(STREAM_PATH)  # bytes in, bytes out
        self.metadata = tuple((name.lower(), value) for name, value in self.config.headers)
        await asyncio.wait_for(self.channel.channel_ready(), 10)

    async def close(self) -> None:
        for call in self.idle:
            call.cancel()
        self.idle.clear()
        if self.channel is not None:
            await self.channel.close()

    async def request(self, payload: bytes, sched: int, slot: int, quiet: bool = False) -> None:
        grpc = self.grpc
        call = self.idle.pop() if self.idle else None
        start = now_ns()
        sent = start
        first = 0
        ok = False
        try:
            if call is None or call.done():
                call = self.method(metadata=self.metadata)
                self.opened += 1
            # the message without gRPC's prefix (grpcio frames it), and an id of its own (field 3
            # appended: a later field wins) that every response must echo
            self.sent_ids += 1
            rid = str(self.sent_ids)
            await call.write(payload[5:] + b"\x1a" + bytes((len(rid),)) + rid.encode())
            sent = now_ns()
            while True:
                raw = await call.read()
                if raw is grpc.aio.EOF:
                    raise ConnectionError("the server ended the stream")
                if not first:
                    first = now_ns()
                response = self.response_type.FromString(raw)
                if response.error_message:
                    self._error(f"gRPC stream: {response.error_message}", quiet)
                    break
                if response.infer_response.id != rid:
                    raise ConnectionError(f"a response to request '{response.infer_response.id}'"
                                          f" came while '{rid}' was the stream's request")
                final = response.infer_response.parameters.get("triton_final_response")
                if not self.decoupled or (final is not None and final.bool_param):
                    ok = True
                    break
        except grpc.aio.AioRpcError as exc:
            self._error(f"gRPC {exc.code().name}: {exc.details()}", quiet)
            call = None
        except (TimeoutError, ConnectionError, OSError) as exc:
            self._error(f"gRPC stream failed: {exc}", quiet)
            call = None
        end = now_ns()
        if call is not None and not call.done():
            self.idle.append(call)
        if not quiet:
            self.shard.record(start, end, sent - start, end - first if ok and first else 0,
                              sched, ok, slot)  # fmt: skip


STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
