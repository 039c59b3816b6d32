"""Sequences for models with `sequence_batching`, sent as perf_analyzer sends them.

A sequence is `length` requests (the base length give or take `variation_pct`, drawn per
sequence) sharing one correlation id, the first flagged START and the last END. In concurrency
mode each concurrency slot runs one sequence at a time, one request in flight, and starts the next
sequence when one ends; a load change starts every slot on a new sequence. In request-rate mode
`count` sequences are live per client (`--num-of-sequences`) and each scheduled request goes to
the next one round robin; with `serial` a sequence waits for its previous request's answer
first (`--serial-sequences`).
When the load changes or stops, each sequence begun and not ended gets its END (one more request
of it, once its requests in flight are answered, neither timed nor counted), as perf_analyzer
completes its ongoing sequences: a stateful model is not left holding their state.

Ids run from `id_start` without end, or wrap inside `[id_start, id_end)`; each shard takes every
k-th id so that shards never share one. Not carrying sequences over a load change means a pause
between points longer than the server's `max_sequence_idle_microseconds` cannot make a request
continue a sequence the server has already let go.

Requests are templates filled per request: the tensors are encoded once, only the id and the two
flags change (a few bytes of the HTTP JSON header, or three parameter entries of the gRPC message
placed before its raw tensor contents).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from analyzer.errors import AnalyzerError


@dataclass(frozen=True)
class SequenceOptions:
    """perf_analyzer's sequence flags, with its defaults."""

    length: int = 20  # --sequence-length
    variation_pct: float = 20.0  # --sequence-length-variation
    id_start: int = 1  # --sequence-id-range start[:end]
    id_end: int = 0  # 0: no end
    count: int = 4  # --num-of-sequences (request-rate mode)
    serial: bool = False  # --serial-sequences

    def check(self, live: int, shards: int = 1) -> None:
        """An AnalyzerError when the id range cannot hold `live` sequences at once."""
        if self.length < 1:
            raise AnalyzerError(f"--sequence-length {self.length} must be at least 1")
        if not 0 <= self.variation_pct <= 100:
            raise AnalyzerError(
                f"--sequence-length-variation {self.variation_pct:g} must be between 0 and 100"
            )
        if self.count < 1:
            raise AnalyzerError(f"--num-of-sequences {self.count} must be at least 1")
        if self.id_end and (self.id_end - self.id_start) // max(shards, 1) < -(-live // shards):
            raise AnalyzerError(
                f"--sequence-id-range {self.id_start}:{self.id_end} holds "
                f"{self.id_end - self.id_start} ids, too few for {live} live sequences over "
                f"{shards} client process(es): ids would collide"
            )


def parse_id_range(text: str) -> tuple[int, int]:
    """perf_analyzer's `start[:end]` (end excluded, none for no end)."""
    start, _, end = text.partition(":")
    try:
        first, last = int(start), int(end) if end else 0
        if first < 1 or (end and last <= first):
            raise ValueError
    except ValueError:
        raise AnalyzerError(
            f"--sequence-id-range '{text}' must be start[:end] with 1 <= start < end"
        ) from None
    return first, last


@dataclass(eq=False)
class Sequence:
    """One live sequence: its id (as the template encodes it) and the requests still to send."""

    id: int
    id_part: bytes
    left: int
    template: SequenceTemplate
    sent: int = 0
    inflight: int = 0  # its requests sent and not answered yet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # serial sequences: one at a time

    def flags(self) -> tuple[bool, bool]:
        """(START, END) of the request about to be sent; counts it as sent."""
        start, end = self.sent == 0, self.left == 1
        self.sent += 1
        self.left -= 1
        return start, end

    @property
    def done(self) -> bool:
        return self.left <= 0


class SequenceSource:
    """A shard's new sequences: ids of its own, lengths drawn as perf_analyzer draws them.

    In a bounded id range the next id in turn is skipped while a live sequence of this shard
    holds it: sequences end at different times, so plain round robin would hand out an id whose
    sequence is still running. A sequence counts as live until the one taking its place is made
    (its last request answered, in concurrency mode) or the load changes (`forget`: an unfinished
    sequence is the server's to let go; a START for its id later starts it afresh)."""

    def __init__(self, options: SequenceOptions, shard: int, shards: int, seed: int) -> None:
        self.options = options
        self.shard, self.shards = shard, max(shards, 1)
        self.rng = random.Random(seed)
        self.issued = 0
        self.live: set[int] = set()  # ids held, in a bounded range
        self.open: set[Sequence] = set()  # made and not yet replaced

    def _id(self) -> int:
        o = self.options
        index = self.shard + self.issued * self.shards  # the shard's own residue class
        self.issued += 1
        if o.id_end:  # wrap inside the range, a multiple of the shard count: classes stay apart
            span = o.id_end - o.id_start
            index %= max(span - span % self.shards, self.shards)
        return o.id_start + index

    def new(self, template: SequenceTemplate, previous: Sequence | None = None) -> Sequence:
        """A new sequence, in place of `previous` (which is over) when given."""
        o = self.options
        seq_id = self._id()
        if previous is not None:
            self.open.discard(previous)
        if o.id_end:
            if previous is not None:
                self.live.discard(previous.id)
            ids = max((o.id_end - o.id_start) // self.shards, 1)
            for _ in range(ids):
                if seq_id not in self.live:
                    break
                seq_id = self._id()
            else:
                raise AnalyzerError(
                    f"--sequence-id-range {o.id_start}:{o.id_end}: every id of this client "
                    "process is held by a live sequence; give a wider range"
                )
            self.live.add(seq_id)
        spread = o.length * o.variation_pct / 100.0
        length = max(1, round(o.length + self.rng.uniform(-spread, spread)))
        sequence = Sequence(seq_id, template.id_part(seq_id), length, template)
        self.open.add(sequence)
        return sequence

    def forget(self) -> list[Sequence]:
        """The load changed: the sequences begun and not ended, for the caller to end; from now
        on their ids are free again."""
        unfinished = [s for s in self.open if s.sent and not s.done]
        self.live.clear()
        self.open.clear()
        return unfinished


class SequenceTemplate:
    """A request with its tensors encoded once; `build` gives the bytes of one sequence step."""

    def id_part(self, seq_id: int) -> bytes:
        raise NotImplementedError

    def build(self, id_part: bytes, start: bool, end: bool) -> bytes:
        raise NotImplementedError


@dataclass(frozen=True)
class HttpSequenceTemplate(SequenceTemplate):
    """An HTTP/1.1 POST: head, JSON header with the sequence parameters, binary tensors."""

    head: str  # request line and headers up to (not including) the two length headers
    json_head: bytes  # the JSON header up to the sequence id's value
    blobs: bytes

    def id_part(self, seq_id: int) -> bytes:
        return str(seq_id).encode()

    def build(self, id_part: bytes, start: bool, end: bool) -> bytes:
        header = b"".join((
            self.json_head, id_part, b',"sequence_start":', b"true" if start else b"false",
            b',"sequence_end":', b"true" if end else b"false", b"}}"))  # fmt: skip
        head = (f"{self.head}Inference-Header-Content-Length: {len(header)}\r\n"
                f"Content-Length: {len(header) + len(self.blobs)}\r\n\r\n")  # fmt: skip
        return head.encode() + header + self.blobs


@dataclass(frozen=True)
class GrpcSequenceTemplate(SequenceTemplate):
    """A ModelInferRequest: its fields before the tensors' raw contents, the sequence parameter
    entries, then the raw contents, framed for gRPC."""

    fields: bytes
    starts: tuple[bytes, bytes]  # the sequence_start entry for False, True
    ends: tuple[bytes, bytes]
    raw: bytes

    def id_part(self, seq_id: int) -> bytes:
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelInferRequest()
        request.parameters["sequence_id"].int64_param = seq_id
        return request.SerializeToString()

    def build(self, id_part: bytes, start: bool, end: bool) -> bytes:
        from analyzer.loadgen.grpc_call import grpc_message

        return grpc_message(
            b"".join((self.fields, id_part, self.starts[start], self.ends[end], self.raw))
        )
