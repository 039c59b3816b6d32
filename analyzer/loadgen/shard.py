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
from analyzer.loadgen.sequences import Sequence, SequenceOptions, SequenceSource
from analyzer.loadgen.transports import (
    GrpcStreamTransport,
    GrpcTransport,
    HttpConnection,
    HttpTransport,
    Transport,
)
from analyzer.tls import ClientTls

now_ns = time.monotonic_ns


@dataclass
class ShardConfig:
    protocol: str  # http | grpc
    host: str
    port: int
    # complete HTTP requests, or gRPC-framed ModelInferRequests; for a sequence model, templates
    # (sequences.py) that each request fills with its sequence id and flags
    payloads: list
    seed: int = 0
    max_outstanding: int = 4096
    grpc_channels: int = 1  # HTTP/2 connections; calls are multiplexed on them
    sequence: SequenceOptions | None = None  # the model has sequence_batching
    index: int = 0  # this shard's place among the client's, and how many there may be: each
    stride: int = 1  # shard draws every stride-th sequence id
    stream: str | None = None  # gRPC streaming: "stream" (--streaming) or "decoupled"
    headers: tuple[tuple[str, str], ...] = ()  # gRPC metadata on every call (-H)
    tls: ClientTls | None = None  # TLS to the server (perf_analyzer's --ssl-* flags)


class Shard:
    """Keeps the asked load running and records every finished request."""

    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.payloads = config.payloads
        self.next_payload = 0
        self.sequences: SequenceSource | None = None
        self._use_sequences(config.sequence)
        self.rate_sequences: list[Sequence | None] = []
        self.next_sequence = 0
        self.generation = 0  # bumped on every load change; loops of older generations end
        self.concurrency = 0
        self.outstanding = 0
        self.max_outstanding_seen = 0
        self.sent = 0
        self.waited_for_slot = 0
        self.errors: Counter[str] = Counter()
        self._reset_columns()
        self.slot_free = asyncio.Event()
        # the TLS context, made here: an SSLContext does not cross the parent's pipe
        self.tls = config.tls.context(config.protocol) if config.tls is not None else None
        self.stream = config.stream
        self.transport: Transport = self._transport()

    def _transport(self) -> Transport:
        if self.config.protocol == "grpc" and self.stream:
            return GrpcStreamTransport(self, self.stream == "decoupled")
        return GrpcTransport(self) if self.config.protocol == "grpc" else HttpTransport(self)

    async def use_stream(self, stream: str | None) -> None:
        """Another model calls for unary calls, streams, or a decoupled model's streams."""
        if stream == self.stream:
            return
        old = self.transport
        self.stream = stream
        self.transport = self._transport()
        await self.transport.open()
        if isinstance(old, GrpcStreamTransport):
            await old.close()

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

    def _payload(self):
        payload = self.payloads[self.next_payload]
        self.next_payload = (self.next_payload + 1) % len(self.payloads)
        return payload

    def _use_sequences(self, options: SequenceOptions | None) -> None:
        c = self.config
        self.sequences = None if options is None else (
            SequenceSource(options, c.index, c.stride, c.seed))  # fmt: skip

    def _step(self, sequence: Sequence | None, template) -> tuple[Sequence, bytes]:
        """The next request of `sequence`, or of a new one when it is None or done."""
        assert self.sequences is not None
        if sequence is None or sequence.done:
            sequence = self.sequences.new(template, sequence)
        start, end = sequence.flags()
        return sequence, template.build(sequence.id_part, start, end)

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

    async def request(self, sched: int = 0, slot: int = -1, payload: bytes | None = None) -> None:
        """One request; `slot`: the concurrency slot sending it (-1 in request-rate mode)."""
        self.sent += 1
        self.outstanding += 1
        self.max_outstanding_seen = max(self.max_outstanding_seen, self.outstanding)
        try:
            await self.transport.request(payload or self._payload(), sched, slot)
        finally:
            self.outstanding -= 1
            self.slot_free.set()

    def _rate_request(self, sched: int):
        """A scheduled request of a sequence model: the next live sequence's next step, round
        robin; with serial sequences it goes out once that sequence's last request answered."""
        index = self.next_sequence
        self.next_sequence = (index + 1) % len(self.rate_sequences)
        assert self.sequences is not None
        if not self.sequences.options.serial:
            sequence, payload = self._step(self.rate_sequences[index], self._payload())
            self.rate_sequences[index] = sequence
            sequence.inflight += 1
            return self._send_step(sequence, payload, sched, -1)
        sequence = self.rate_sequences[index]
        if sequence is None or sequence.done:  # its last request may still be in flight
            sequence = self.sequences.new(self._payload(), sequence)
            self.rate_sequences[index] = sequence

        async def serial() -> None:
            async with sequence.lock:
                _, payload = self._step(sequence, self._payload())
                await self._send_step(sequence, payload, sched, -1)

        sequence.inflight += 1  # from now: an END sent at a load change waits for it
        return serial()

    # ---- load shapes ------------------------------------------------------------------------
    def _new_generation(self) -> None:
        self.generation += 1
        if self.sequences is not None:
            for sequence in self.sequences.forget():
                self.outstanding += 1  # `stop` waits for it
                self.loop.create_task(self._end(sequence))

    async def _end(self, sequence: Sequence) -> None:
        """END a sequence the load left unfinished, after its requests in flight (quiet: outside
        every measurement)."""
        try:
            deadline = now_ns() + 10_000_000_000
            while sequence.inflight and now_ns() < deadline:
                await asyncio.sleep(0.001)
            async with sequence.lock:
                payload = sequence.template.build(sequence.id_part, False, True)
                await self.transport.request(payload, 0, -1, quiet=True)
        finally:
            self.outstanding -= 1
            self.slot_free.set()

    async def _send_step(self, sequence: Sequence, payload: bytes, sched: int, slot: int):
        """One request of a sequence; the caller counted it in flight (`inflight`) already."""
        try:
            await self.request(sched, slot, payload)
        finally:
            sequence.inflight -= 1

    def set_concurrency(self, n: int) -> None:
        self._new_generation()
        self.concurrency = n
        generation = self.generation
        for slot in range(n):
            self.loop.create_task(self._worker(slot, generation))

    async def _worker(self, slot: int, generation: int) -> None:
        if self.sequences is None:
            while self.generation == generation:
                await self.request(0, slot)
            return
        sequence = None  # one sequence at a time per slot, one request in flight
        while self.generation == generation:
            sequence, payload = self._step(sequence, self._payload())
            sequence.inflight += 1
            await self._send_step(sequence, payload, 0, slot)

    def set_rate(self, rate: float, distribution: str, phase: float, sequences: int = 1) -> None:
        self._new_generation()
        self.rate_sequences, self.next_sequence = [None] * max(1, sequences), 0
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
                if self.sequences is None:
                    self.loop.create_task(self.request(int(due)))
                else:
                    self.loop.create_task(self._rate_request(int(due)))
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
        self._new_generation()
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
            shard.set_rate(float(command[1]), str(command[2]), float(command[3]), int(command[4]))
        elif kind == "idle":
            shard.idle_load()
        elif kind == "drain":
            pass
        elif kind == "payloads":  # another model or variant: same processes and connections
            shard.idle_load()
            shard.payloads, shard.next_payload = list(command[1]), 0
            shard._use_sequences(command[2])
            await shard.use_stream(command[3])
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
