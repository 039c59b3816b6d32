"""A load-generator shard: one client process with its own event loop (uvloop when present).

The parent (`LoadClient`) starts one shard per client process and talks to it over a socket pair:
it sets the load ("concurrency", n) / ("rate", r, distribution, phase) / ("idle",), and drains the
timing records every tick. A shard keeps no results of its own beyond the last drain, so a
measurement can be cut at any time without losing requests. Run as `python -m
analyzer.loadgen.shard FD`. The transports that send the requests, one per protocol, are in
transports.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from analyzer.loadgen.records import frame, read_message, recv_message, send_message
from analyzer.loadgen.transports import GrpcTransport, HttpConnection, HttpTransport, Transport

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
        transport = GrpcTransport if config.protocol == "grpc" else HttpTransport
        self.transport: Transport = transport(self)

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
    def idle(self) -> list[HttpConnection]:
        """HTTP's idle keep-alive connections (none for gRPC)."""
        return self.transport.idle if isinstance(self.transport, HttpTransport) else []

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
