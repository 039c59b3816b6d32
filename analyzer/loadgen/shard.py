"""A load-generator shard: one client process with its own event loop (uvloop when present).

The parent (`LoadClient`) starts one shard per client process and talks to it over a socket pair:
it sets the load ("concurrency", n) / ("rate", r, distribution, phase) / ("idle",), and drains the
timing records every tick. A shard keeps no results of its own beyond the last drain, so a
measurement can be cut at any time without losing requests. Run as `python -m
analyzer.loadgen.shard FD`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass

import httptools
import numpy as np

from analyzer.loadgen import grpc_client
from analyzer.loadgen.grpc_client import GrpcConnection
from analyzer.loadgen.records import frame, read_message, recv_message, send_message

now_ns = time.monotonic_ns


@dataclass
class ShardConfig:
    protocol: str  # http | grpc
    host: str
    port: int
    payloads: list[bytes]  # complete HTTP requests, or gRPC-framed ModelInferRequests
    seed: int = 0
    max_outstanding: int = 4096
    grpc_channels: int = 1  # HTTP/2 connections; calls are multiplexed on them


class _HttpConnection(asyncio.Protocol):
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


class _Transport(ABC):
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
    async def request(self, payload: bytes, sched: int, slot: int) -> None:
        """Send one request, wait for its answer and record it on the shard."""


class _HttpTransport(_Transport):
    """Keep-alive HTTP/1.1 connections, one request at a time on each; idle ones are reused."""

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard)
        self.idle: list[_HttpConnection] = []

    async def open(self) -> None:
        self.idle.append(await self._connect())

    async def _connect(self) -> _HttpConnection:
        self.opened += 1
        _, conn = await self.loop.create_connection(
            lambda: _HttpConnection(self._lost), self.config.host, self.config.port
        )
        return conn

    def _lost(self, conn: _HttpConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    async def request(self, payload: bytes, sched: int, slot: int) -> None:
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
                self.shard.errors[_http_error(status, conn.body)] += 1
            recv = end - conn.first_byte if conn.first_byte else 0
        except (OSError, httptools.HttpParserError) as exc:
            end = now_ns()
            sent, recv, ok = end, 0, False
            self.shard.errors[f"HTTP request failed: {exc}"] += 1
        if conn is not None and conn.reusable and not conn.transport.is_closing():
            self.idle.append(conn)
        elif conn is not None and conn.transport is not None:
            conn.transport.close()
        self.shard.record(start, end, sent - start, recv, sched, ok, slot)


class _GrpcTransport(_Transport):
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
        return await grpc_client.connect(self.config.host, self.config.port, now_ns)

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

    async def request(self, payload: bytes, sched: int, slot: int) -> None:
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
            self.shard.errors[str(exc)] += 1
        except (TimeoutError, OSError) as exc:
            ok = False
            self.shard.errors[f"gRPC request failed: {exc}"] += 1
        end = now_ns()
        recv = end - first_byte if ok and first_byte else 0
        self.shard.record(start, end, sent - start, recv, sched, ok, slot)


class Shard:
    """Keeps the asked load running and records every finished request."""

    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.payloads = config.payloads
        self.next_payload = 0
        self.generation = 0  # bumped on every load change; loops of older generations end
        self.concurrency = 0
        self.outstanding = 0
        self.max_outstanding_seen = 0
        self.sent = 0
        self.waited_for_slot = 0
        self.errors: Counter[str] = Counter()
        self._reset_columns()
        self.slot_free = asyncio.Event()
        transport = _GrpcTransport if config.protocol == "grpc" else _HttpTransport
        self.transport: _Transport = transport(self)

    def _reset_columns(self) -> None:
        self.c_start: list[int] = []
        self.c_end: list[int] = []
        self.c_send: list[int] = []
        self.c_recv: list[int] = []
        self.c_sched: list[int] = []
        self.c_ok: list[bool] = []
        self.c_slot: list[int] = []

    # ---- requests ---------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect once before reporting ready, so a bad URL fails at start, not mid-measurement."""
        await self.transport.open()

    @property
    def idle(self) -> list[_HttpConnection]:
        """HTTP's idle keep-alive connections (none for gRPC)."""
        return self.transport.idle if isinstance(self.transport, _HttpTransport) else []

    @property
    def connections(self) -> int:
        """Connections opened so far, reconnections included."""
        return self.transport.opened

    def _payload(self) -> bytes:
        payload = self.payloads[self.next_payload]
        self.next_payload = (self.next_payload + 1) % len(self.payloads)
        return payload

    def record(
        self, start: int, end: int, send: int, recv: int, sched: int, ok: bool, slot: int
    ) -> None:
        self.c_start.append(start)
        self.c_end.append(end)
        self.c_send.append(send)
        self.c_recv.append(recv)
        self.c_sched.append(sched)
        self.c_ok.append(ok)
        self.c_slot.append(slot)

    async def request(self, sched: int = 0, slot: int = -1) -> None:
        """One request; `slot`: the concurrency slot sending it (-1 in request-rate mode)."""
        self.sent += 1
        self.outstanding += 1
        self.max_outstanding_seen = max(self.max_outstanding_seen, self.outstanding)
        try:
            await self.transport.request(self._payload(), sched, slot)
        finally:
            self.outstanding -= 1
            self.slot_free.set()

    # ---- load shapes ------------------------------------------------------------------------
    def set_concurrency(self, n: int) -> None:
        self.generation += 1
        self.concurrency = n
        generation = self.generation
        for slot in range(n):
            self.loop.create_task(self._worker(slot, generation))

    async def _worker(self, slot: int, generation: int) -> None:
        while self.generation == generation:
            await self.request(0, slot)

    def set_rate(self, rate: float, distribution: str, phase: float) -> None:
        self.generation += 1
        if rate > 0:
            self.loop.create_task(self._schedule(rate, distribution, phase, self.generation))

    async def _schedule(self, rate: float, distribution: str, phase: float, generation: int):
        """Send at the scheduled instants; timers are coarse (1 ms), so the last stretch before an
        instant is slept with time.sleep in short slices between event-loop turns."""
        rng = random.Random(self.config.seed + generation)
        interval = 1e9 / rate
        poisson = distribution == "poisson"
        due = float(now_ns()) + (rng.expovariate(1.0) * interval if poisson else phase * interval)
        while self.generation == generation:
            now = now_ns()
            while due <= now and self.generation == generation:
                if self.outstanding >= self.config.max_outstanding:
                    self.waited_for_slot += 1
                    self.slot_free.clear()
                    await self.slot_free.wait()
                    continue
                self.loop.create_task(self.request(int(due)))
                due += rng.expovariate(1.0) * interval if poisson else interval
            wait = due - now_ns()
            if wait > 2_000_000:
                await asyncio.sleep((wait - 1_000_000) / 1e9)
            else:
                await asyncio.sleep(0)  # one event-loop turn: responses get processed
                wait = due - now_ns()
                if wait > 0:
                    time.sleep(min(wait, 100_000) / 1e9)

    def idle_load(self) -> None:
        self.generation += 1
        self.concurrency = 0

    # ---- reporting --------------------------------------------------------------------------
    def drain(self) -> dict:
        columns = {
            "start": np.array(self.c_start, dtype=np.int64),
            "end": np.array(self.c_end, dtype=np.int64),
            "send": np.array(self.c_send, dtype=np.int64),
            "recv": np.array(self.c_recv, dtype=np.int64),
            "sched": np.array(self.c_sched, dtype=np.int64),
            "ok": np.array(self.c_ok, dtype=bool),
            "slot": np.array(self.c_slot, dtype=np.int64),
        }
        self._reset_columns()
        errors, self.errors = dict(self.errors), Counter()
        report = {
            "columns": columns,
            "errors": errors,
            "cpu_ns": time.process_time_ns(),
            "loop_ns": loop_schedstat(),
            "at_ns": now_ns(),
            "sent": self.sent,
            "outstanding": self.outstanding,
            "max_outstanding": self.max_outstanding_seen,
            "waited_for_slot": self.waited_for_slot,
            "connections": self.connections,
        }
        self.max_outstanding_seen = self.outstanding
        return report


def loop_schedstat() -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) of this process's main thread: the event
    loop that sends and receives every request (Linux schedstat; (0, 0) where it is missing).

    CPU use alone misses a starved client: sharing a core with a busy process, its loop may run
    half the time and wait the other half, every timestamp late by that much.
    """
    try:
        with open("/proc/self/schedstat", "rb") as f:
            run, wait = f.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0


def _http_error(status: int, body: bytearray) -> str:
    try:
        message = json.loads(bytes(body)).get("error", "")
    except (ValueError, AttributeError):
        message = bytes(body[:200]).decode(errors="replace")
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


async def _serve(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    sock.setblocking(True)
    config: ShardConfig = recv_message(sock)  # the first message; nothing else runs yet
    shard = Shard(config)
    try:
        await shard.open()
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported to the parent
        send_message(sock, ("error", f"cannot connect to {config.host}:{config.port}: {exc}"))
        return
    send_message(sock, ("ready", os.getpid()))
    try:
        await _commands(sock, shard, loop)
    finally:  # the parent left or asked to stop: every load loop ends at its next turn
        shard.idle_load()


async def _commands(sock: socket.socket, shard: Shard, loop) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    while True:
        command = await read_message(reader)
        kind = command[0]
        if kind == "concurrency":
            shard.set_concurrency(int(command[1]))
        elif kind == "rate":
            shard.set_rate(float(command[1]), str(command[2]), float(command[3]))
        elif kind == "idle":
            shard.idle_load()
        elif kind == "drain":
            pass
        elif kind == "payloads":  # another model or variant: same processes and connections
            shard.idle_load()
            shard.payloads, shard.next_payload = list(command[1]), 0
        elif kind == "stop":
            shard.idle_load()
            deadline = loop.time() + 10
            while shard.outstanding and loop.time() < deadline:
                await asyncio.sleep(0.01)
            _write(writer, ("stopped", shard.drain()))
            await writer.drain()
            return
        _write(writer, ("ok", shard.drain()))
        await writer.drain()


def _write(writer: asyncio.StreamWriter, message: object) -> None:
    writer.write(frame(message))


def main(argv: list[str]) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # many connections in rate mode
    sock = socket.socket(fileno=int(argv[0]))
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio still works
        runner = asyncio.run
    if os.environ.get("MA_LOADGEN_LOOP") == "asyncio":
        runner = asyncio.run
    try:
        runner(_serve(sock))
    except (ConnectionError, asyncio.IncompleteReadError, KeyboardInterrupt):
        return 0  # the parent went away: nothing left to report to
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
