"""The parent side of the load generator: start shards, split the load, gather their records.

One shard per client process. The asked load is divided among them (concurrency n -> n/k each;
rate r -> r/k each with staggered phases, so a constant schedule stays evenly spaced when merged),
and their records are merged on the shared monotonic clock.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from analyzer.loadgen.control import ServerError, split_url
from analyzer.loadgen.records import Records, recv_message, send_message
from analyzer.loadgen.sequences import SequenceOptions
from analyzer.loadgen.shard import ShardConfig
from analyzer.tls import ClientTls

_SLOTS_PER_SHARD = 1 << 32  # slot ids of shard k start at k << 32: unique once merged


@dataclass
class ShardState:
    process: subprocess.Popen
    sock: socket.socket
    pid: int
    # (at_ns, cpu ns, sent, event loop's ns on a CPU, its ns waiting for one), one per drain
    samples: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    sent: int = 0
    outstanding: int = 0
    max_outstanding: int = 0
    waited_for_slot: int = 0


@dataclass
class Drained:
    """What one drain of every shard brought back."""

    records: Records
    errors: dict[str, int]


class LoadClient:
    """Owns the shard processes for a whole session; loads change without restarting them."""

    def __init__(
        self,
        protocol: str,
        url: str,
        payloads: list,
        processes: int = 1,
        seed: int = 0,
        sequence: SequenceOptions | None = None,
        stream: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        tls: ClientTls | None = None,
    ) -> None:
        self.protocol = protocol
        self.url = url
        self.payloads = payloads
        self.processes = max(1, processes)
        self.seed = seed
        self.sequence = sequence
        self.stream = stream  # gRPC streams: "stream" (--streaming) or "decoupled"; None: unary
        self.headers = headers  # gRPC metadata on every call (HTTP's are in the payloads)
        self.tls = tls
        # shard k draws sequence ids k, k + stride, ...: the most shards this client may grow to
        # (one per core of the machine at most)
        self.stride = max(self.processes, os.cpu_count() or 1)
        self.shards: list[ShardState] = []

    def __enter__(self) -> LoadClient:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        host, port = split_url(self.url, 8001 if self.protocol == "grpc" else 8000)
        try:
            for index in range(self.processes):
                self.shards.append(self._spawn(self._config(host, port, index)))
            for shard in self.shards:
                reply = recv_message(shard.sock)
                if reply[0] != "ready":
                    raise ServerError(f"load generator: {reply[1]}")
        except BaseException:
            self.close()
            raise

    def _config(self, host: str, port: int, index: int) -> ShardConfig:
        return ShardConfig(self.protocol, host, port, self.payloads, seed=self.seed + 7919 * index,
                           sequence=self.sequence, index=index, stride=self.stride,
                           stream=self.stream, headers=self.headers,
                           tls=self.tls)  # fmt: skip

    @staticmethod
    def _spawn(config: ShardConfig) -> ShardState:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        process = subprocess.Popen(
            [sys.executable, "-m", "analyzer.loadgen.shard", str(child.fileno())],
            pass_fds=(child.fileno(),),
            env=env,
        )
        child.close()
        send_message(parent, config)
        return ShardState(process, parent, process.pid)

    def add_process(self) -> None:
        """Grow by one shard (called between measurements, when one client process saturated)."""
        host, port = split_url(self.url, 8001 if self.protocol == "grpc" else 8000)
        shard = self._spawn(self._config(host, port, len(self.shards)))
        reply = recv_message(shard.sock)
        if reply[0] != "ready":
            raise ServerError(f"load generator: {reply[1]}")
        self.shards.append(shard)
        self.processes = len(self.shards)

    # ---- load ---------------------------------------------------------------------------------
    def set_concurrency(self, n: int) -> Drained:
        if self.sequence is not None:  # one live sequence per concurrency slot
            self.sequence.check(n, self.stride)
        k = len(self.shards)
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        return self._command([("concurrency", share) for share in shares])

    def set_rate(self, rate: float, distribution: str = "constant") -> Drained:
        k = len(self.shards)
        count = self.sequence.count if self.sequence else k  # live sequences, split (>= 1 each)
        if self.sequence is not None:
            self.sequence.check(max(count, k), self.stride)
        shares = [max(1, count // k + (1 if i < count % k else 0)) for i in range(k)]
        return self._command(
            [("rate", rate / k, distribution, i / k, shares[i]) for i in range(k)]
        )

    def set_idle(self) -> Drained:
        return self._command([("idle",)] * len(self.shards))

    def set_payloads(
        self, payloads: list, sequence: SequenceOptions | None = None, stream: str | None = None
    ) -> Drained:
        """Idle the load and send other requests from now on (the next model or variant)."""
        self.payloads, self.sequence, self.stream = payloads, sequence, stream
        return self._command([("payloads", payloads, sequence, stream)] * len(self.shards))

    def quiesce(self, timeout_s: float = 30.0) -> None:
        """Stop sending and wait for every outstanding request to finish (before an unload)."""
        deadline = time.monotonic() + timeout_s
        self.set_idle()
        while any(s.outstanding for s in self.shards) and time.monotonic() < deadline:
            time.sleep(0.01)
            self.drain()

    def outstanding(self) -> int:
        """Requests sent and not yet answered, as of the last drain."""
        return sum(s.outstanding for s in self.shards)

    def drain(self) -> Drained:
        return self._command([("drain",)] * len(self.shards))

    def _command(self, commands: list[tuple]) -> Drained:
        for shard, command in zip(self.shards, commands, strict=True):
            send_message(shard.sock, command)
        parts, errors = [], {}
        for index, shard in enumerate(self.shards):
            reply = recv_message(shard.sock)
            report = reply[1]
            columns = report["columns"]
            slot = columns["slot"]
            columns["slot"] = np.where(slot >= 0, slot + index * _SLOTS_PER_SHARD, slot)
            parts.append(Records(**columns))
            for message, count in report["errors"].items():
                errors[message] = errors.get(message, 0) + count
            shard.samples.append(
                (report["at_ns"], report["cpu_ns"], report["sent"], *report["loop_ns"])
            )
            del shard.samples[:-4096]
            shard.sent = report["sent"]
            shard.outstanding = report["outstanding"]
            shard.max_outstanding = report["max_outstanding"]
            shard.waited_for_slot = report["waited_for_slot"]
        return Drained(Records.concat(parts), errors)

    def _rates(self, t0: int, t1: int, column: int) -> list[float]:
        out = []
        for shard in self.shards:
            samples = [s for s in shard.samples if t0 <= s[0] <= t1]
            if len(samples) < 2:
                out.append(0.0)
                continue
            a, b = samples[0], samples[-1]
            out.append((b[column] - a[column]) / max(1, b[0] - a[0]))
        return out

    def cpu_utilization(self, t0: int, t1: int) -> list[float]:
        """Each shard's CPU use over [t0, t1] as a fraction of one core, from drain samples."""
        return self._rates(t0, t1, 1)

    def loop_demand(self, t0: int, t1: int) -> list[tuple[float, float]]:
        """Per shard, its event loop's (running, waiting for a CPU) over [t0, t1], as fractions
        of it: together, how much of a core the loop wanted."""
        return list(zip(self._rates(t0, t1, 3), self._rates(t0, t1, 4), strict=True))

    def sent_rate(self, t0: int, t1: int) -> float:
        """Requests/s all shards sent over [t0, t1] (finished or not)."""
        return 1e9 * sum(self._rates(t0, t1, 2))

    def close(self) -> None:
        for shard in self.shards:
            try:
                send_message(shard.sock, ("stop",))
                shard.sock.settimeout(15)
                recv_message(shard.sock)
            except (OSError, ConnectionError, EOFError):
                pass
            shard.sock.close()
        for shard in self.shards:
            try:
                shard.process.wait(5)
            except subprocess.TimeoutExpired:
                shard.process.kill()
                shard.process.wait(5)
        self.shards = []
