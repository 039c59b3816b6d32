"""Model instance runners: one thread per instance, pulling batches from the model's scheduler.

A runner owns one BackendInstance. TorchScript/ONNX instances compute on this thread (torch and
onnxruntime release the GIL), python-backend instances forward the batch to their own process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

from analyzer.worker import sched
from analyzer.worker.backends.base import (
    BackendInstance,
    Deferred,
    InstanceSpec,
    Rescheduled,
    Result,
)
from analyzer.worker.batcher import Deliver
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import BatchTiming, InferRequest
from analyzer.worker.stats import ModelStats
from analyzer.worker.warmup import WarmupSample

log = logging.getLogger(__name__)
# after a failure to form a batch (a bug): the pause before the next try, so a lasting fault
# logs a few lines a second instead of spinning a core
_RETRY_S = 0.2
_yield = getattr(os, "sched_yield", lambda: None)  # POSIX; elsewhere the scheduler decides


class BatchSource(Protocol):
    """What a runner pulls from: the dynamic batcher, or one instance's lane of the sequence
    batcher."""

    @property
    def pending(self) -> int: ...

    def next_batch(self) -> list[InferRequest] | None: ...


class IterativeSource(BatchSource, Protocol):
    """A lane of a sequence batcher with iterative sequences: requests a model released with
    RELEASE_RESCHEDULE go back to it; the others end their sequence."""

    iterative: bool

    def reschedule(self, request: InferRequest) -> InferError | None: ...

    def finished(self, request: InferRequest) -> None: ...


class InstanceRunner:
    def __init__(
        self,
        spec: InstanceSpec,
        instance: BackendInstance,
        scheduler: BatchSource,
        stats: ModelStats,
        deliver: Deliver,
        warmup: list[WarmupSample] | None = None,
        max_batch: int = 1,
    ):
        self.spec = spec
        self.instance = instance
        self.scheduler = scheduler
        self.stats = stats
        self.deliver = deliver
        instance.complete = deliver  # a decoupled model's requests still open after execute()
        self.thread = threading.Thread(target=self._run, name=spec.name, daemon=True)
        # (start_ns, end_ns, batch_size) of recent executions, for tests and debugging.
        self.trace: list[tuple[int, int, int]] = []
        self.trace_enabled = False
        # the batch being executed, so an unload that gives up waiting can answer it
        self._batch_lock = threading.Lock()
        self._batch: list[InferRequest] | None = None
        self._abandoned: InferError | None = None
        # model_warmup: run on this thread before the first batch; the load waits for `warmed`
        self.warmup = warmup or []
        self.max_batch = max_batch
        self.warmed = threading.Event()
        self.warmup_error: str | None = None
        # iterative sequences: RELEASE_RESCHEDULE sends a request back to this lane
        self.iterative: IterativeSource | None = (
            scheduler if getattr(scheduler, "iterative", False) else None)  # type: ignore[assignment]

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        sched.normal_policy()  # not the event loop's: a model thread is the one to favour
        try:
            self.instance.thread_init()
            self._warm_up()
        except Exception as err:  # noqa: BLE001 - the load reports it
            self.warmup_error = f"{type(err).__name__}: {err}"
        finally:
            self.warmup = []  # its inputs are not kept for the model's lifetime
            self.warmed.set()
        if self.warmup_error is not None:
            return
        while True:
            try:
                batch = self.scheduler.next_batch()
            except Exception:  # noqa: BLE001 - a bug: this thread must live on, or the queue hangs
                log.exception("model '%s' instance %s: forming a batch failed; trying again",
                              self.stats.name, self.spec.name)  # fmt: skip
                time.sleep(_RETRY_S)
                continue
            if batch is None:
                return
            with self._batch_lock:
                abandoned = self._abandoned
                if abandoned is None:
                    self._batch = batch
            if abandoned is not None:  # unload gave up on us while this batch was being formed
                self._fail(batch, abandoned)
                return
            self._execute(batch)
            if self.scheduler.pending:
                # requests wait, so the next batch would start at once: first let the event loop
                # send this batch's answers (it does not preempt a model thread, sched.py), or
                # their clients sit idle through the next execution instead of sending again
                _yield()

    def _warm_up(self) -> None:
        """Each warm-up sample, `count` times, straight on this instance (no queue: nothing else
        reaches a model before it is READY), counted in the statistics as Triton counts them."""
        for sample in self.warmup:
            start = time.perf_counter()
            for _ in range(sample.count):
                requests = sample.make_requests(self.stats.name)
                for at in range(0, len(requests), self.max_batch):
                    error = self._warm_batch(requests[at : at + self.max_batch])
                    if error is not None:
                        self.warmup_error = f"failed to run warmup sample '{sample.name}': {error}"
                        return
            log.info("model '%s' instance %s ran warmup sample '%s' %d time(s) in %.1f ms",
                     self.stats.name, self.spec.name, sample.name, sample.count,
                     (time.perf_counter() - start) * 1e3)  # fmt: skip

    def _warm_batch(self, batch: list[InferRequest]) -> Exception | None:
        now = time.perf_counter_ns()
        for request in batch:
            request.arrival_ns = request.queue_start_ns = now
        timing = BatchTiming(compute_start_ns=now)
        try:
            results = self.instance.execute(batch, timing)
        except Exception as err:  # noqa: BLE001 - the sample failed: the load says why
            results = [err] * len(batch)
        ok: list[InferRequest] = []
        failed: list[InferRequest] = []
        for request, result in zip(batch, results, strict=True):
            (failed if isinstance(result, Exception) else ok).append(request)
        self.stats.record_batch(ok, failed, timing)
        errors = [result for result in results if isinstance(result, Exception)]
        del results  # an error's traceback holds this frame: no cycle keeps the batch alive
        return errors[0] if errors else None

    def abandon(self, error: InferError) -> None:
        """Answer the batch in flight with `error`; whatever the instance returns later is dropped.

        Called by an unload whose join timed out: the requests must not wait on a hung model.
        """
        with self._batch_lock:
            self._abandoned = error
            batch, self._batch = self._batch, None
        self.instance.forget(batch or [])  # its late responses must not answer them again
        self._fail(batch or [], error)

    def _fail(self, batch: list[InferRequest], error: InferError) -> None:
        for request in batch:
            self.stats.record_failure(request)
            self.deliver(request, None, error)

    def _execute(self, batch: list[InferRequest]) -> None:
        timing = BatchTiming(compute_start_ns=time.perf_counter_ns())
        try:
            results = self.instance.execute(batch, timing)
            if len(results) != len(batch):
                raise InferError(
                    f"instance {self.spec.name} returned {len(results)} responses for "
                    f"{len(batch)} requests",
                    Status.INTERNAL,
                )
        except Exception as err:  # the model failed the whole batch; the worker goes on
            if not isinstance(err, InferError):
                log.warning("model instance %s failed a batch: %s", self.spec.name, err)
                err = InferError(f"{type(err).__name__}: {err}", Status.INTERNAL)
            results = [err] * len(batch)
        end = time.perf_counter_ns()
        with self._batch_lock:
            if self._abandoned is not None:  # unload answered this batch already
                return
            self._batch = None
        try:  # bookkeeping: a bug here must not leave the batch unanswered
            if self.trace_enabled:
                self.trace.append((timing.compute_start_ns, end, sum(r.batch_size for r in batch)))
            failed = [r for r, res in zip(batch, results, strict=True)
                      if isinstance(res, Exception)]  # fmt: skip
            ok = [r for r, res in zip(batch, results, strict=True)
                  if not isinstance(res, Exception)] if failed else batch  # fmt: skip
            self.stats.record_batch(ok, failed, timing)
        except Exception:  # noqa: BLE001
            log.exception("model '%s' instance %s: recording a batch's statistics failed",
                          self.stats.name, self.spec.name)  # fmt: skip
        self._answer(batch, results, timing)
        # a failed batch's error holds this frame in its traceback, and the frame the results:
        # without this the batch's tensors would wait for the cycle collector
        del results

    def _answer(self, batch: list[InferRequest], results: list[Result],
                timing: BatchTiming) -> None:  # fmt: skip
        iterative = self.iterative
        for request, result in zip(batch, results, strict=True):
            request.timing = timing
            if isinstance(result, Rescheduled):
                error = iterative.reschedule(request) if iterative is not None else InferError(
                    "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model "
                    f"'{self.stats.name}' is not configured with sequence_batching "
                    "{ iterative_sequence: true }", Status.INTERNAL)  # fmt: skip
                if error is None:  # queued again: a later batch takes it
                    continue
                result = error
            if iterative is not None:
                iterative.finished(request)
            if isinstance(result, Deferred):  # the instance answers it when it completes
                continue
            if isinstance(result, Exception):
                self.deliver(request, None, result)
            else:
                self.deliver(request, result, None)
