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
"""

from __future__ import annotations

import threading
import time
from collections import deque

from analyzer.config.model_config import ModelConfig
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import InferRequest
from analyzer.worker.stats import ModelStats

_REJECT = 0  # ModelQueuePolicy.TimeoutAction.REJECT


class Scheduler:
    def __init__(self, config: ModelConfig, stats: ModelStats):
        self.stats = stats
        self.dynamic = config.HasField("dynamic_batching") and config.max_batch_size > 0
        db = config.dynamic_batching
        self.max_batch = max(config.max_batch_size, 1) if self.dynamic else 1
        preferred = sorted(p for p in db.preferred_batch_size if 0 < p <= self.max_batch)
        self.preferred = set(preferred or [self.max_batch])
        self.max_preferred = max(self.preferred)
        self.delay_ns = db.max_queue_delay_microseconds * 1000 if self.dynamic else 0
        levels = db.priority_levels if self.dynamic else 0
        self.default_priority = db.default_priority_level or (levels if levels else 1)
        self.queues: list[deque[InferRequest]] = [deque() for _ in range(max(levels, 1))]
        policy = db.default_queue_policy
        self.max_queue_size = policy.max_queue_size
        self.default_timeout_us = policy.default_timeout_microseconds
        self.allow_timeout_override = policy.allow_timeout_override
        self.reject_on_timeout = policy.timeout_action == _REJECT
        self._cond = threading.Condition(threading.Lock())
        self._size = 0
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
        with self._cond:
            if self._closed:
                raise InferError(f"model '{self.stats.name}' is unloading", Status.UNAVAILABLE)
            if self.max_queue_size and self._size >= self.max_queue_size:
                raise InferError(
                    f"exceeds maximum queue size {self.max_queue_size} of model "
                    f"'{self.stats.name}'",
                    Status.UNAVAILABLE,
                )
            self.queues[level - 1].append(request)
            self._size += 1
            self._cond.notify()

    def close(self) -> list[InferRequest]:
        """Stop handing out batches; return what was still queued so the caller can fail it."""
        with self._cond:
            self._closed = True
            leftover = [r for q in self.queues for r in q]
            for q in self.queues:
                q.clear()
            self._size = 0
            self._cond.notify_all()
        return leftover

    def next_batch(self) -> list[InferRequest] | None:
        """Block until a batch is due; None once the scheduler is closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._size and (self.default_timeout_us or self._has_timeouts()):
                    self._expire(time.perf_counter_ns())
                if not self._size:
                    self._cond.wait()
                    continue
                batch, wait_ns = self._form_batch()
                if batch:
                    if self._size:
                        self._cond.notify()  # another idle instance may take the next batch
                    return batch
                self._cond.wait(wait_ns / 1e9)

    def _has_timeouts(self) -> bool:
        return any(r.timeout_us for q in self.queues for r in q)

    def _ordered(self):
        for q in self.queues:
            yield from q

    def _form_batch(self) -> tuple[list[InferRequest], int]:
        if not self.dynamic:
            return [self._pop(1)[0]], 0
        total = count = preferred_count = 0
        can_grow = True
        signature = None
        oldest = None
        for r in self._ordered():
            if signature is None:
                signature, oldest = r.batch_signature(), r
            elif r.batch_signature() != signature:
                can_grow = False
                break
            if total + r.batch_size > self.max_batch:
                can_grow = False
                break
            total += r.batch_size
            count += 1
            if total in self.preferred:
                preferred_count = count
        if total >= self.max_batch:
            can_grow = False
        if count == 0:  # the first request alone exceeds nothing we can batch: send it alone
            return self._pop(1), 0
        if total >= self.max_preferred:
            return self._pop(preferred_count or count), 0
        waited = time.perf_counter_ns() - oldest.queue_start_ns
        if self.delay_ns == 0 or not can_grow or waited >= self.delay_ns:
            return self._pop(preferred_count or count), 0
        return [], self.delay_ns - waited

    def _pop(self, n: int) -> list[InferRequest]:
        out: list[InferRequest] = []
        for q in self.queues:
            while q and len(out) < n:
                out.append(q.popleft())
        self._size -= len(out)
        return out

    def _expire(self, now: int) -> None:
        """Reject queued requests whose timeout passed (Triton's REJECT action)."""
        if not self.reject_on_timeout:
            return
        for q in self.queues:
            keep = deque()
            for r in q:
                if r.timeout_us and now - r.queue_start_ns > r.timeout_us * 1000:
                    self._size -= 1
                    self.stats.record_failure(r)
                    r.on_done(None, InferError("request timeout expired", Status.UNAVAILABLE))
                else:
                    keep.append(r)
            q.clear()
            q.extend(keep)
