"""Bounds on everything an outside client controls, with defaults a 2-core machine survives.

The worker is a network service: every resource a client can grow (body bytes, header bytes,
connections, replies waiting on a slow reader, gRPC messages and RPCs, model instances) has a cap
here. Each cap is a `serve` flag; `Limits()` holds the defaults. They are set well above what a
profile needs (a 64 MiB request is a batch of 128 224x224 FP32 images) and well below what takes
the machine down.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import InferRequest, input_bytes

log = logging.getLogger(__name__)

MIB = 1 << 20


def cap(default: Any, flag: str, unit: str, help: str) -> Any:
    """A Limits field with its `serve` flag: unit is bytes (the flag takes 64MB, 1g, ...),
    seconds or count; every cap must be positive."""
    return field(default=default, metadata={"flag": flag, "unit": unit, "help": help})


@dataclass(frozen=True)
class Limits:
    # HTTP: Triton's --http-max-input-size (64 MiB) caps Content-Length, chunked bodies and the
    # inflated size of a compressed body alike; beyond it the answer is 413.
    max_input_bytes: int = cap(64 * MIB, "--http-max-input-size", "bytes",
                               "Largest request body, also once inflated (413 beyond).")
    max_buffered_bytes: int = cap(1 << 30, "--http-max-buffered-size", "bytes",
                                  "Request bodies still arriving, all connections together "
                                  "(503 beyond).")
    # request line + headers; beyond it 431 (headers) or 414 (URL)
    max_header_bytes: int = cap(64 * 1024, "--http-max-header-size", "bytes",
                                "Largest request line plus headers (431 beyond).")
    # counted from the request's first byte, headers and body alike
    header_timeout_s: float = cap(30.0, "--http-header-timeout", "seconds",
                                  "Seconds a request may take to arrive whole.")
    # a keep-alive connection with nothing in flight
    idle_timeout_s: float = cap(300.0, "--http-idle-timeout", "seconds",
                                "Seconds an idle keep-alive connection is kept.")
    # at the cap the longest-stalled half-sent one is dropped for a newcomer, and with none to
    # drop the newcomer is answered 503
    max_connections: int = cap(4096, "--http-max-connections", "count",
                               "Open HTTP connections at most (503 beyond, stalled ones first).")
    # pipelined requests
    max_pending_per_connection: int = cap(
        64, "--http-max-pending", "count",
        "Replies one connection may have outstanding before reading pauses.")
    # bytes of replies queued in the socket's buffer before reading from that client pauses
    # (at most max_unsent_bytes / max_connections, at least 64 KiB: reply_high_water; a gRPC
    # stream's own answers also wait past it)
    write_high_water_bytes: int = 16 * MIB
    # replies written that their clients have not read, all connections of one protocol
    # together: a client may send requests on thousands of connections and read no answer
    max_unsent_bytes: int = cap(1 << 30, "--http-max-unsent-size", "bytes",
                                "Replies not yet read by their clients, all connections of a "
                                "protocol together (the connection holding most is closed "
                                "beyond).")
    grpc_max_message_bytes: int = cap(64 * MIB, "--grpc-max-message-size", "bytes",
                                      "Largest gRPC message either way, after decompression.")
    grpc_max_concurrent_rpcs: int = cap(
        4096, "--grpc-max-concurrent-rpcs", "count",
        "gRPC calls served at once over all connections (RESOURCE_EXHAUSTED beyond); also each "
        "connection's HTTP/2 stream limit, so one client's extra calls wait in that client.")
    # of one ModelStreamInfer stream; HTTP/2 flow control then holds the client back
    grpc_max_stream_pending: int = cap(
        1024, "--grpc-max-stream-pending", "count",
        "Unanswered requests of one gRPC stream before reading it pauses.")
    # instance_group counts x GPUs
    max_instance_count: int = cap(64, "--max-instance-count", "count",
                                  "Model instances one model version may have at most.")
    # every loaded model's together: a load request may carry a config override, and 3 x 64
    # python instances were 192 processes and 7 GB on a worker that capped each version alone
    max_total_instances: int = cap(256, "--max-total-instances", "count",
                                   "Model instances of all loaded models together at most (a "
                                   "load past it is refused).")
    # what the queues hold: the connections' caps bound requests in count, not in bytes (64
    # pipelined 64 MiB requests on each of 4,096 connections), so their inputs have a total too
    max_queued_bytes: int = cap(4 << 30, "--max-queued-size", "bytes",
                                "Input bytes of the requests accepted and not yet answered, and "
                                "3 KiB each for the rest of what they hold, all models together "
                                "(503 / UNAVAILABLE beyond).")


def reply_high_water(limits: Limits) -> int:
    """A connection's unsent replies before reading from it pauses: small enough that the
    connections' uncounted replies (below it) cannot pass --http-max-unsent-size together."""
    share = limits.max_unsent_bytes // max(limits.max_connections, 1)
    return min(limits.write_high_water_bytes, max(share, 64 * 1024))


class Unread(Protocol):
    """A connection as UnsentReplies sees it."""

    unsent: int  # bytes of its replies counted in the total; -1 once closed for holding most

    def drop(self) -> None: ...


class UnsentReplies:
    """Replies written that their clients have not read, over one protocol's connections.

    Each connection stops reading requests once its replies pass its high water; nothing bounded
    their sum, and a client pipelining requests on thousands of connections, reading none of the
    answers, made the worker hold all of them. The connections past their high water are counted
    (`count`, from their transport's pause_writing, their writes while paused, resume_writing);
    the others hold less than their high water each. Past the limit (--http-max-unsent-size) the
    connection holding most is closed, on the next loop pass: this may run inside that
    connection's own transport, which must not be torn down under it."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self.limit = limit
        self.loop = loop
        self.total = 0
        self.backlog: set[Unread] = set()

    def count(self, conn: Unread, size: int) -> None:
        """`conn` holds `size` bytes of unread replies now (0: under its low water, or gone)."""
        held = conn.unsent
        if held < 0:  # closed for holding most: no longer counted
            return
        self.total += size - held
        conn.unsent = size
        if size:
            self.backlog.add(conn)
        else:
            self.backlog.discard(conn)
        while self.total > self.limit and self.backlog:
            victim = max(self.backlog, key=lambda c: c.unsent)
            log.warning("closing a connection holding %d MiB of replies its client does not "
                        "read: its protocol's connections hold %d MiB, over "
                        "--http-max-unsent-size",
                        victim.unsent >> 20, self.total >> 20)  # fmt: skip
            self.total -= victim.unsent
            victim.unsent = -1
            self.backlog.discard(victim)
            self.loop.call_soon(victim.drop)


# What the worker holds of a queued request besides its inputs (its record, arrays, callbacks
# and protocol state): ~3.2 KB a REST request of one INT32 at a model that does not answer, from
# the worker's RSS over 6,000 of them. Counted, the cap bounds requests in number too: a client
# that cancels (a gRPC RST_STREAM, a closed connection) frees its connection's or call's slot,
# while its request waits in the queue until the batcher drops it, so tiny requests at a slow
# model grew the queue without bound (4-byte inputs: a billion under the 4 GiB cap).
REQUEST_OVERHEAD = 3 * 1024


class HeldBytes:
    """Bytes held by accepted requests not yet answered, against `--max-queued-size`."""

    def __init__(self, limit: int = Limits.max_queued_bytes) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Hold `size` more bytes; False, holding nothing, when that would pass the limit."""
        with self._lock:
            if self.held + size > self.limit:
                return False
            self.held += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.held -= size

    def hold(self, size: int) -> None:
        """Hold `size` more bytes, or refuse the request they belong to (503 / UNAVAILABLE)."""
        if not self.take(size):
            raise InferError(
                f"the worker holds {self.held / MIB:.0f} MiB of requests not yet answered; "
                f"{size / MIB:.1f} MiB more would pass its --max-queued-size of "
                f"{self.limit / MIB:.0f} MiB: retry later", Status.UNAVAILABLE)  # fmt: skip

    def admit(self, request: InferRequest) -> None:
        """Count a request's input bytes, and REQUEST_OVERHEAD, until `release`, or refuse it
        (503 / UNAVAILABLE)."""
        size = input_bytes(request.inputs) + REQUEST_OVERHEAD
        self.hold(size)
        request.held_bytes = size

    def release(self, request: InferRequest) -> None:
        """The request is answered: its bytes are no longer held (once, whoever calls)."""
        if request.held_bytes:
            self.give(request.held_bytes)
            request.held_bytes = 0


def size_text(size: int) -> str:
    """65536 -> '64KB': a size flag's default as the flag would take it."""
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def parse_size(text: str) -> int:
    """'64MB', '1g', '65536' -> bytes (binary units), for the size flags."""
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    for suffix, factor in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)):
        if value.endswith(suffix):
            value, scale = value[:-1], factor
            break
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"'{text}' is not a size (examples: 65536, 64MB, 1g)") from None
    if number <= 0:
        raise ValueError(f"size '{text}' must be positive")
    return int(number * scale)
