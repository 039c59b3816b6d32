"""The model queue and Triton's batch formation rules.

Instance runner threads pull batches with `next_batch()`; protocol handlers push requests with
`enqueue()`. One lock guards the queue, so a batch is formed only when an instance is free — the
same moment Triton's dynamic batcher forms one.

Rules (Triton's dynamic batcher): walk the FIFO queue adding each request's batch size; stop before
exceeding max_batch_size or at a request whose non-batch shapes differ; remember each point where
the total hits a preferred size. Launch at once if the batch reached the largest preferred size,
cannot grow, or the queue delay is 0; otherwise wait until the oldest request has aged past
max_queue_delay_microseconds and send what is pending (the largest preferred size found, if any).
Without a dynamic_batching block every request executes alone.

An idle instance is woken only when a new request can change its decision: the queue was empty,
the batch can launch now (largest preferred size reached, a shape that cannot join the head's
batch, no queue delay, or priority levels in play); otherwise its timed wait for the oldest
request's delay stands. Waking it for every arrival cost a thread switch and a walk of the queue
per request -- most of the batcher's cost at client batch 1 on a one-core worker.

Requests that leave the queue without running (expired, cancelled by their client, left over at
close) are failed through `deliver`, the model's one delivery path, outside the queue lock: under
preserve_ordering a response that bypassed it would stall every later one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from analyzer.config.model_config import ModelConfig
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import InferRequest, Outputs
from analyzer.worker.stats import ModelStats

MAX_WAIT_S = 3600.0  # one wait at most: the loop looks again (a wait of 2^64 us overflowed)
_REJECT = 0  # ModelQueuePolicy.TimeoutAction.REJECT

Deliver = Callable[[InferRequest, Outputs | None, Exception | None], None]


class Scheduler:
    def __init__(self, config: ModelConfig, stats: ModelStats, deliver: Deliver | None = None):
        self.stats = stats
        self.deliver = deliver or _answer_directly
        self.dynamic = config.HasField("dynamic_batching") and config.max_batch_size > 0
        db = config.dynamic_batching
        self.max_batch = max(config.max_batch_size, 1) if self.dynamic else 1
        preferred = sorted(p for p in db.preferred_batch_size if 0 < p <= self.max_batch)
        self.preferred = set(preferred or [self.max_batch])
        self.max_preferred = max(self.preferred)
        self.delay_ns = db.max_queue_delay_microseconds * 1000 if self.dynamic else 0
        levels = db.priority_levels if self.dynamic else 0
        # without levels, Triton ignores default_priority_level (one queue: 5 refused them all)
        self.default_priority = (db.default_priority_level or levels) if levels else 1
        self.queues: list[deque[InferRequest]] = [deque() for _ in range(max(levels, 1))]
        policy = db.default_queue_policy
        self.max_queue_size = policy.max_queue_size
        self.default_timeout_us = policy.default_timeout_microseconds
        self.allow_timeout_override = policy.allow_timeout_override
        self.reject_on_timeout = policy.timeout_action == _REJECT
        self._cond = threading.Condition(threading.Lock())
        self._size = 0
        self._queued = 0  # sum of the queued requests' batch sizes (cancelled ones included)
        self._idle = 0  # instances waiting in next_batch
        self._closed = False

    @property
    def pending(self) -> int:
        return self._size

    def enqueue(self, request: InferRequest) -> None:
        level = request.priority or self.default_priority
        if not 1 <= level <= len(self.queues):
            raise InferError(
                f"invalid priority {request.priority} for model '{self.stats.name}': "
                f"it has {len(self.queues)} priority level(s)"
            )
        timeout = self.default_timeout_us
        if request.timeout_us and (self.allow_timeout_override or not timeout):
            timeout = request.timeout_us
        request.timeout_us = timeout
        request.queue_start_ns = time.perf_counter_ns()
        if self.dynamic and not request.signature:
            request.signature = request.batch_signature()
        with self._cond:
            if self._closed:
                raise InferError(f"model '{self.stats.name}' is unloading", Status.UNAVAILABLE)
            if self.max_queue_size and self._size >= self.max_queue_size:
                raise InferError(
                    f"exceeds maximum queue size {self.max_queue_size} of model "
                    f"'{self.stats.name}'",
                    Status.UNAVAILABLE,
                )
            queue = self.queues[level - 1]
            # a shape unlike its predecessor's ends the batch being formed: it can launch now
            last = queue[-1] if queue else None
            queue.append(request)
            self._size += 1
            self._queued += request.batch_size
            if self._idle and (
                last is None
                or self.delay_ns == 0
                or len(self.queues) > 1
                or self._queued >= self.max_preferred
                or request.signature != last.signature
            ):
                self._cond.notify()

    def close(self) -> list[InferRequest]:
        """Stop handing out batches; return what was still queued so the caller can fail it."""
        with self._cond:
            self._closed = True
            leftover = [r for q in self.queues for r in q]
            for q in self.queues:
                q.clear()
            self._size = self._queued = 0
            self._cond.notify_all()
        return leftover

    def next_batch(self) -> list[InferRequest] | None:
        """Block until a batch is due; None once the scheduler is closed."""
        while True:
            batch, dropped = self._next_or_dropped()
            for request, error in dropped:  # answered outside the lock, as any other completion
                self.stats.record_failure(request)
                self.deliver(request, None, error)
            if batch is None or batch:
                return batch

    def _next_or_dropped(self) -> tuple[list[InferRequest] | None, list[_Dropped]]:
        """A due batch ([] when only dropped requests came out), or None once closed."""
        dropped: list[_Dropped] = []
        with self._cond:
            while True:
                if self._closed:
                    return None, dropped
                if self._size and (self.default_timeout_us or self._has_timeouts()):
                    self._expire(time.perf_counter_ns(), dropped)
                if not self._size:
                    if dropped:
                        return [], dropped
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                    continue
                batch, wait_ns = self._form_batch(dropped)
                if batch:
                    if self._size:
                        self._cond.notify()  # another idle instance may take the next batch
                    return batch, dropped
                if dropped:
                    return [], dropped
                self._idle += 1
                self._cond.wait(min(wait_ns / 1e9, MAX_WAIT_S))  # 2^64 us overflowed
                self._idle -= 1

    def _has_timeouts(self) -> bool:
        return any(r.timeout_us for q in self.queues for r in q)

    def _ordered(self) -> Iterator[InferRequest]:
        for q in self.queues:
            yield from q

    def _form_batch(self, dropped: list[_Dropped]) -> tuple[list[InferRequest], int]:
        """Triton's rules over the live requests; cancelled ones met on the way are dropped."""
        if not self.dynamic:
            return self._pop(self._first_live(), dropped), 0
        total = count = 0
        positions = preferred_positions = 0  # queue entries taken, cancelled ones included
        can_grow = True
        signature = None
        oldest = None
        for r in self._ordered():
            if r.cancelled:
                positions += 1
                continue
            if signature is None:
                signature, oldest = r.signature, r
            elif r.signature != signature:
                can_grow = False
                break
            if total + r.batch_size > self.max_batch:
                can_grow = False
                break
            total += r.batch_size
            count += 1
            positions += 1
            if total in self.preferred:
                preferred_positions = positions
        if oldest is None:  # every queued request was cancelled
            return self._pop(positions, dropped), 0
        if count == 0:  # the first request alone exceeds nothing we can batch: send it alone
            return self._pop(positions + 1, dropped), 0
        if total >= self.max_batch:
            can_grow = False
        if total >= self.max_preferred:
            return self._pop(preferred_positions or positions, dropped), 0
        waited = time.perf_counter_ns() - oldest.queue_start_ns
        if self.delay_ns == 0 or not can_grow or waited >= self.delay_ns:
            return self._pop(preferred_positions or positions, dropped), 0
        return [], self.delay_ns - waited

    def _first_live(self) -> int:
        """Queue entries up to and including the first request not cancelled."""
        positions = 0
        for r in self._ordered():
            positions += 1
            if not r.cancelled:
                break
        return positions

    def _pop(self, n: int, dropped: list[_Dropped]) -> list[InferRequest]:
        """Take n queue entries; cancelled ones go to `dropped` (Triton answers them CANCELLED)."""
        out: list[InferRequest] = []
        taken = 0
        for q in self.queues:
            while q and taken < n:
                r = q.popleft()
                taken += 1
                self._queued -= r.batch_size
                if r.cancelled:
                    dropped.append((r, InferError("request was cancelled", Status.UNAVAILABLE)))
                else:
                    out.append(r)
        self._size -= taken
        return out

    def _expire(self, now: int, dropped: list[_Dropped]) -> None:
        """Reject queued requests whose timeout passed (Triton's REJECT action)."""
        if not self.reject_on_timeout:
            return
        for q in self.queues:
            keep: deque[InferRequest] = deque()
            for r in q:
                if r.timeout_us and now - r.queue_start_ns > r.timeout_us * 1000:
                    self._size -= 1
                    self._queued -= r.batch_size
                    dropped.append((r, InferError("request timeout expired", Status.UNAVAILABLE)))
                else:
                    keep.append(r)
            q.clear()
            q.extend(keep)


_Dropped = tuple[InferRequest, InferError]


def _answer_directly(request: InferRequest, outputs: Outputs | None,
                     error: Exception | None) -> None:  # fmt: skip
    """Without a model around the scheduler (its own tests) a request is answered at once."""
    request.on_done(outputs, error)
