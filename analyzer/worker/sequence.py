"""Triton's sequence batcher for stateful models (`sequence_batching`).

Every sequence -- the requests sharing one correlation id, from the one flagged START to the one
flagged END -- lives on one model instance for its whole life (the instance with the fewest live
sequences when it starts), so a model that keeps state per sequence finds it there. Each instance
has its own queue ("lane") and, as in Triton, a number of sequence slots: max_batch_size (at
least 1), or `oldest.max_candidate_sequences` when that is set. A sequence that starts when
every slot is taken waits in the backlog, its requests with it, until a sequence ends (or idles
out) and frees a slot; backlog sequences get slots in the order they started. A batch takes at
most one request per sequence, oldest first, up to max_batch_size. With the `direct` strategy
a batch leaves as soon as the instance is free; with `oldest` it may wait up to
`max_queue_delay_microseconds` for a preferred or full batch.

The control inputs the config declares are added to each request before it is queued: START and
END (1 on the request that carries the flag), READY (1: every request in a batch is a ready one;
batches are not padded with empty slots, the one difference from Triton's direct strategy a
model could see) and CORRID (the correlation id, in the control's data type).

A request without a correlation id, or one that continues a sequence never started (or ended,
or idle for longer than `max_sequence_idle_microseconds`, 1 s by default) is refused with
Triton's message. Live sequences are bounded (`MAX_SEQUENCES`): a START beyond it is refused.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2

from analyzer.config.model_config import ModelConfig
from analyzer.datatypes import WIRE_TO_NUMPY, config_to_wire
from analyzer.worker.batcher import MAX_WAIT_S, Deliver
from analyzer.worker.errors import InferError, Status
from analyzer.worker.params import SEQUENCE_END, SEQUENCE_START
from analyzer.worker.request import InferRequest
from analyzer.worker.stats import ModelStats

Kind = model_config_pb2.ModelSequenceBatching.Control.Kind
MAX_SEQUENCES = 4096  # live sequences per model version
DEFAULT_IDLE_US = 1_000_000
SWEEP_NS = 50_000_000  # idle sequences are looked for at most this often (and when full)


@dataclass(frozen=True)
class Control:
    """One control input: its tensor's name, which signal it carries, and how."""

    name: str
    kind: int
    wire: str
    false_true: tuple[float, float] = (0, 1)


def controls_of(config: ModelConfig) -> list[Control]:
    out = []
    for spec in config.sequence_batching.control_input:
        for control in spec.control:
            if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
                wire = config_to_wire(model_config_pb2.DataType.Name(control.data_type))
                out.append(Control(spec.name, control.kind, wire))
            elif control.int32_false_true:
                out.append(Control(spec.name, control.kind, "INT32",
                                   tuple(control.int32_false_true)))
            elif control.fp32_false_true:
                out.append(Control(spec.name, control.kind, "FP32",
                                   tuple(control.fp32_false_true)))
            elif control.bool_false_true:
                out.append(Control(spec.name, control.kind, "BOOL",
                                   tuple(control.bool_false_true)))
            else:
                raise ValueError(f"model '{config.name}': control input '{spec.name}' gives "
                                 "no int32_false_true, fp32_false_true or bool_false_true")
    return out


@dataclass
class _Sequence:
    lane: int | None  # None: in the backlog, waiting for a slot
    last_ns: int
    ending: bool = False  # its END request is queued: released when it is taken
    queued: int = 0  # its requests queued, in the lane or held (an idle sequence has none)
    held: list[InferRequest] = field(default_factory=list)  # in the backlog: its requests

    def idle(self, now: int, idle_ns: int) -> bool:
        return self.queued == 0 and now - self.last_ns > idle_ns


@dataclass
class _Lane:
    queue: deque[InferRequest] = field(default_factory=deque)
    live: int = 0  # sequences assigned to this instance


class SequenceScheduler:
    def __init__(self, config: ModelConfig, stats: ModelStats, deliver: Deliver):
        self.stats = stats
        self.deliver = deliver
        self.name = config.name
        sb = config.sequence_batching
        self.batching = config.max_batch_size > 0
        self.max_batch = max(config.max_batch_size, 1)
        self.oldest = sb.WhichOneof("strategy_choice") == "oldest"
        self.delay_ns = sb.oldest.max_queue_delay_microseconds * 1000 if self.oldest else 0
        preferred = list(sb.oldest.preferred_batch_size) if self.oldest else []
        self.target = max([p for p in preferred if p <= self.max_batch] or [self.max_batch])
        self.idle_ns = (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        self.controls = controls_of(config)
        # sequence slots per instance (Triton's seq_slot_cnt); sequences beyond wait in the
        # backlog, in start order, each holding its requests
        self.slots = max(config.max_batch_size, 1)
        if self.oldest and sb.oldest.max_candidate_sequences > 0:
            self.slots = sb.oldest.max_candidate_sequences
        self.waiting: deque[int | str] = deque()
        # iterative sequences: each request is a sequence of its own, keyed here by the
        # request (id) with a number of the scheduler's; RELEASE_RESCHEDULE queues it again
        self.iterative = bool(sb.iterative_sequence)
        self._numbers = itertools.count(1)
        self._keys: dict[int, int] = {}
        self.lanes: list[_Lane] = [_Lane()]
        self.sequences: dict[int | str, _Sequence] = {}
        self._cond = threading.Condition(threading.Lock())
        self._size = 0
        self._closed = False
        self._swept_ns = 0

    def set_instances(self, count: int) -> None:
        self.lanes = [_Lane() for _ in range(max(count, 1))]

    def lane(self, index: int) -> _LaneView:
        """What instance `index`'s runner pulls its batches from."""
        return _LaneView(self, index)

    @property
    def pending(self) -> int:
        return self._size

    # ---- requests in ---------------------------------------------------------------------------
    def enqueue(self, request: InferRequest) -> None:
        corrid = request.correlation_id
        if (corrid == 0 or corrid == "") and not self.iterative:
            raise InferError(f"inference request to model '{self.name}' must specify a non-zero "
                             "or non-empty correlation ID")  # fmt: skip
        if self.batching and request.batch_size != 1:
            raise InferError(f"inference request to model '{self.name}' is part of a sequence: "
                             f"its batch size must be 1, got {request.batch_size}")  # fmt: skip
        if self.iterative:
            self._start_iterative(request)
            return
        self._add_controls(request)
        now = time.perf_counter_ns()
        request.queue_start_ns = now
        with self._cond:
            self._admit(now)
            sequence = self.sequences.get(corrid)
            if sequence is not None and sequence.idle(now, self.idle_ns):
                self._release(corrid)  # idle past the limit: as if never started
                sequence = None
            if request.flags & SEQUENCE_START:
                if sequence is None:
                    sequence = self._new_sequence(corrid, now)
                sequence.ending = False
            elif sequence is None or sequence.ending:
                raise InferError(f"inference request for sequence {corrid} to model "
                                 f"'{self.name}' must specify the START flag on the first "
                                 "request of the sequence")  # fmt: skip
            sequence.last_ns = now
            if request.flags & SEQUENCE_END:
                sequence.ending = True
            self._queue(sequence, request)
            self._cond.notify_all()

    def _start_iterative(self, request: InferRequest) -> None:
        """A request to a model with iterative sequences: a sequence of its own, its control
        inputs filled here (START on its first execution; CORRID its correlation ID, or the
        scheduler's number when it has none)."""
        number = next(self._numbers)
        corrid = request.correlation_id or number
        self._add_controls(request, start=True, end=False, corrid=corrid)
        now = time.perf_counter_ns()
        request.queue_start_ns = now
        with self._cond:
            self._admit(now)
            sequence = self._new_sequence(-number, now)
            self._keys[id(request)] = -number
            self._queue(sequence, request)
            self._cond.notify_all()

    def _admit(self, now: int) -> None:
        """(Under the lock.) Refuse a request while unloading; end idle sequences first."""
        if self._closed:
            raise InferError(f"model '{self.name}' is unloading", Status.UNAVAILABLE)
        self._sweep(now, full=len(self.sequences) >= MAX_SEQUENCES)

    def _new_sequence(self, key: int | str, now: int) -> _Sequence:
        """(Under the lock.) A live sequence, on the instance with the fewest; refused past
        MAX_SEQUENCES."""
        if len(self.sequences) >= MAX_SEQUENCES:
            raise InferError(f"model '{self.name}' has {MAX_SEQUENCES} live sequences; end one "
                             "before starting another", Status.UNAVAILABLE)  # fmt: skip
        fewest = min(range(len(self.lanes)), key=lambda i: self.lanes[i].live)
        if self.lanes[fewest].live >= self.slots:  # every slot is taken: the backlog
            self.waiting.append(key)
            sequence = self.sequences[key] = _Sequence(None, now)
        else:
            self.lanes[fewest].live += 1
            sequence = self.sequences[key] = _Sequence(fewest, now)
        return sequence

    def _queue(self, sequence: _Sequence, request: InferRequest) -> None:
        """(Under the lock.) Into its sequence's lane, or the backlog."""
        if sequence.lane is None:
            sequence.held.append(request)
        else:
            self.lanes[sequence.lane].queue.append(request)
        sequence.queued += 1
        self._size += 1

    def _promote(self, lane_index: int) -> None:
        """(Under the lock.) A slot of `lane_index` is free: the backlog's oldest sequence
        takes it, and its requests move to the lane."""
        lane = self.lanes[lane_index]
        while lane.live < self.slots and self.waiting:
            key = self.waiting.popleft()
            sequence = self.sequences.get(key)
            if sequence is None or sequence.lane is not None:
                continue  # ended while it waited
            sequence.lane = lane_index
            lane.live += 1
            lane.queue.extend(sequence.held)
            sequence.held = []
            self._cond.notify_all()  # that lane's runner may be waiting

    def reschedule(self, request: InferRequest) -> InferError | None:
        """(Iterative sequences.) The model released `request` with RELEASE_RESCHEDULE: it
        goes to the front of its sequence's lane, ahead of new sequences, so that sequences
        under way keep their place in the batches. An error if its sequence ended meanwhile
        (idle past max_sequence_idle_microseconds, Triton's message) or the model unloads."""
        now = time.perf_counter_ns()
        with self._cond:
            key = self._keys.get(id(request))
            sequence = self.sequences.get(key) if key is not None else None
            if self._closed:
                return InferError(f"model '{self.name}' is unloading", Status.UNAVAILABLE)
            if sequence is not None and sequence.idle(now, self.idle_ns):
                self._release(key)  # type: ignore[arg-type]
                sequence = None
            if sequence is None:
                return InferError(f"inference request for sequence {request.correlation_id} "
                                  f"to model '{self.name}' must specify the START flag on the "
                                  "first request of the sequence")  # fmt: skip
            for control in self.controls:  # its next execution is not its first
                if control.kind == Kind.CONTROL_SEQUENCE_START:
                    request.inputs[control.name] = np.full_like(
                        request.inputs[control.name], control.false_true[0])
            sequence.last_ns = now
            request.queue_start_ns = now
            if sequence.lane is None:  # (it ran, so it has a slot; kept safe anyway)
                sequence.held.insert(0, request)
            else:
                self.lanes[sequence.lane].queue.appendleft(request)
            sequence.queued += 1
            self._size += 1
            self._cond.notify_all()
        return None

    def finished(self, request: InferRequest) -> None:
        """(Iterative sequences.) `request` was released for good: its sequence ends."""
        with self._cond:
            key = self._keys.pop(id(request), None)
            if key is not None:
                self._release(key)

    def _key(self, request: InferRequest) -> int | str:
        if self.iterative:
            return self._keys.get(id(request), 0)
        return request.correlation_id

    def _add_controls(self, request: InferRequest, start: bool | None = None,
                      end: bool | None = None,
                      corrid: int | str | None = None) -> None:  # fmt: skip
        lead = (1,) if self.batching else ()
        if start is None:
            start = bool(request.flags & SEQUENCE_START)
        if end is None:
            end = bool(request.flags & SEQUENCE_END)
        if corrid is None:
            corrid = request.correlation_id
        for control in self.controls:
            if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
                dtype = WIRE_TO_NUMPY.get(control.wire, np.dtype(np.object_))
                value = str(corrid).encode() if control.wire == "BYTES" else corrid
                try:
                    array = np.array([value], dtype=dtype).reshape(lead + (1,))
                except (ValueError, OverflowError, TypeError):
                    raise InferError(f"correlation ID {corrid!r} does not "
                                     f"fit control input '{control.name}' ({control.wire})"
                                     ) from None  # fmt: skip
            else:
                on = {Kind.CONTROL_SEQUENCE_START: start,
                      Kind.CONTROL_SEQUENCE_END: end,
                      Kind.CONTROL_SEQUENCE_READY: True}.get(control.kind, False)  # fmt: skip
                signal = control.false_true[1 if on else 0]
                array = np.full(lead + (1,), signal, dtype=WIRE_TO_NUMPY[control.wire])
            request.inputs[control.name] = array
            request.wire_types[control.name] = control.wire

    def _sweep(self, now: int, full: bool = False) -> None:
        """Sequences with no request for longer than the idle time, and none queued, end: one
        pass over the live sequences, at most every SWEEP_NS unless the table is full (a
        request's own sequence is checked as it comes). It was a pass per request and per
        wake-up that also scanned the queue for each sequence: thousands of queued sequences
        held the lock, and the event loop behind it, for minutes."""
        if not full and now - self._swept_ns < SWEEP_NS:
            return
        self._swept_ns = now
        stale = [c for c, s in self.sequences.items() if s.idle(now, self.idle_ns)]
        for corrid in stale:
            self._release(corrid)

    def _release(self, corrid: int | str) -> None:
        sequence = self.sequences.pop(corrid, None)
        if sequence is not None and sequence.lane is not None:
            self.lanes[sequence.lane].live -= 1
            self._promote(sequence.lane)

    # ---- batches out ---------------------------------------------------------------------------
    def next_batch(self, lane_index: int) -> list[InferRequest] | None:
        """Block until instance `lane_index` has a batch due; None once closed."""
        lane = self.lanes[lane_index]
        dropped: list[InferRequest] = []
        try:
            with self._cond:
                while True:
                    if self._closed:
                        return None
                    batch, wait_ns = self._form(lane, dropped)
                    if batch:
                        return batch
                    if dropped:
                        return []
                    self._cond.wait(min(wait_ns / 1e9 if wait_ns else self.idle_ns / 1e9,
                                        MAX_WAIT_S))  # fmt: skip
                    self._sweep(time.perf_counter_ns())
        finally:
            for request in dropped:  # answered outside the lock, as any other completion
                self.stats.record_failure(request)
                self.deliver(request, None, InferError("request was cancelled",
                                                       Status.UNAVAILABLE))  # fmt: skip

    def _form(self, lane: _Lane, dropped: list[InferRequest]) -> tuple[list[InferRequest], int]:
        """At most one request per sequence, oldest first, up to max_batch_size."""
        batch: list[InferRequest] = []
        seen: set[int | str] = set()
        for request in lane.queue:
            if request.cancelled:
                dropped.append(request)
                continue
            key = self._key(request)
            if key not in seen and len(batch) < self.max_batch:
                seen.add(key)
                batch.append(request)
        if dropped:
            self._take(lane, dropped)
            if self.iterative:  # answered now: their sequences end
                for request in dropped:
                    number = self._keys.pop(id(request), None)
                    if number is not None:
                        self._release(number)
            return [], 0
        if not batch:
            return [], 0
        if self.oldest and len(batch) < self.target:
            waited = time.perf_counter_ns() - batch[0].queue_start_ns
            if waited < self.delay_ns:
                return [], self.delay_ns - waited
        self._take(lane, batch)
        if not self.iterative:
            for request in batch:
                sequence = self.sequences.get(request.correlation_id)
                if request.flags & SEQUENCE_END and sequence is not None and sequence.ending:
                    self._release(request.correlation_id)
        return batch, 0

    def _take(self, lane: _Lane, taken: list[InferRequest]) -> None:
        """Out of the lane's queue, in one pass (a remove() per request was one pass each)."""
        ids = {id(r) for r in taken}
        lane.queue = deque(r for r in lane.queue if id(r) not in ids)
        self._size -= len(taken)
        for request in taken:
            sequence = self.sequences.get(self._key(request))
            if sequence is not None:
                sequence.queued -= 1

    def close(self) -> list[InferRequest]:
        with self._cond:
            self._closed = True
            leftover = [r for lane in self.lanes for r in lane.queue]
            leftover += [r for sequence in self.sequences.values() for r in sequence.held]
            for lane in self.lanes:
                lane.queue.clear()
            self.waiting.clear()
            self._size = 0
            self.sequences.clear()
            self._keys.clear()
            self._cond.notify_all()
        return leftover


class _LaneView:
    """One instance's side of the sequence batcher (what an InstanceRunner calls)."""

    def __init__(self, scheduler: SequenceScheduler, index: int):
        self.scheduler = scheduler
        self.index = index

    @property
    def pending(self) -> int:
        """Requests waiting in the whole sequence batcher (the runner's hint to yield)."""
        return self.scheduler.pending

    def next_batch(self) -> list[InferRequest] | None:
        while True:
            batch = self.scheduler.next_batch(self.index)
            if batch is None or batch:
                return batch

    @property
    def iterative(self) -> bool:
        return self.scheduler.iterative

    def reschedule(self, request: InferRequest) -> InferError | None:
        return self.scheduler.reschedule(request)

    def finished(self, request: InferRequest) -> None:
        self.scheduler.finished(request)
