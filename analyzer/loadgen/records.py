"""Per-request timing records, as columns, and the messages that carry them between processes."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Records:
    """One row per finished request. Times are CLOCK_MONOTONIC ns, comparable across processes.

    start/end bound the client latency; send is the time spent handing the request to the
    transport, recv the time from the first response byte to the parsed response; sched is the
    time the schedule asked for the request (request-rate mode; 0 in concurrency mode); slot is
    the concurrency slot that sent it, unique across client processes (-1 in request-rate mode).
    """

    start: np.ndarray = field(default_factory=lambda: _EMPTY)
    end: np.ndarray = field(default_factory=lambda: _EMPTY)
    send: np.ndarray = field(default_factory=lambda: _EMPTY)
    recv: np.ndarray = field(default_factory=lambda: _EMPTY)
    sched: np.ndarray = field(default_factory=lambda: _EMPTY)
    ok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    slot: np.ndarray = field(default_factory=lambda: _EMPTY)

    def __len__(self) -> int:
        return int(self.end.size)

    @staticmethod
    def concat(parts: list[Records]) -> Records:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Records()
        if len(parts) == 1:
            return parts[0]
        return Records(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in _COLUMNS)
        )

    def where(self, mask: np.ndarray) -> Records:
        return Records(*(getattr(self, name)[mask] for name in _COLUMNS))

    def ended_in(self, t0: int, t1: int) -> Records:
        """Requests that completed inside [t0, t1): the throughput of that interval, and
        perf_analyzer's valid requests (its ValidLatencyMeasurement counts by end time only).

        Requiring the start inside too would drop the ~c requests in flight at t0 and read a
        closed loop's throughput low by c / (requests per window): 3.6% at c=64 and 1,200/s
        in 1.5 s windows.
        """
        return self.where((self.end >= t0) & (self.end < t1))

    def latency_ns(self) -> np.ndarray:
        return (self.end - self.start)[self.ok]

    def in_flight(self, t0: int, t1: int) -> float:
        """Mean requests in flight over [t0, t1) by Little's law: the summed latency of the
        requests that ended inside it over its length (unbiased in steady state)."""
        mask = (self.end >= t0) & (self.end < t1)
        return float((self.end[mask] - self.start[mask]).sum()) / max(1, t1 - t0)

    def turnaround_ns(self, t0: int, t1: int) -> float | None:
        """Mean time from a response's arrival (its first byte read) to the next request on the
        same slot reaching the kernel, for requests that ended inside [t0, t1); None without
        slots (request-rate mode).

        Measured socket to socket, so it holds what the client's own latency hides: responses
        that arrived together wait for each other to be processed, and requests queued in one
        event-loop pass go out in one write.
        """
        mask = (self.end >= t0) & (self.end < t1) & (self.slot >= 0)
        if int(np.count_nonzero(mask)) < 2:
            return None
        slot, start = self.slot[mask], self.start[mask]
        order = np.lexsort((start, slot))
        slot = slot[order]
        sent = (start + self.send[mask])[order]
        arrived = (self.end - self.recv)[mask][order]
        same = slot[1:] == slot[:-1]
        if not same.any():
            return None
        return float((sent[1:][same] - arrived[:-1][same]).mean())


_COLUMNS = ("start", "end", "send", "recv", "sched", "ok", "slot")


# The parent and its shards exchange pickled messages, each behind its length (8 bytes, little
# endian): written by frame(), read by recv_message (blocking socket) or read_message (asyncio).
_LENGTH = struct.Struct("<Q")


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def send_message(sock: socket.socket, message: object) -> None:
    sock.sendall(frame(message))


def recv_message(sock: socket.socket) -> object:
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    return pickle.loads(_recv_exact(sock, size))


async def read_message(reader: asyncio.StreamReader) -> object:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(size))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("the load-generator shard exited")
        got += n
    return bytes(buffer)
