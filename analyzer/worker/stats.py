"""Per model-version statistics with Triton's accounting, for the statistics API and metrics.

Triton's rules (perf_analyzer depends on them): queue.count == success.count; the three compute
counts grow together; every request in a batch is charged the whole batch's compute durations;
inference_count grows by the batch size, execution_count by one per execution.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from analyzer.worker.request import BatchTiming, InferRequest

STAT_NAMES = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """Thread-safe counters; written by runner threads, read by the protocol layer."""

    def __init__(self, name: str, version: int):
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self.durations = {name: Duration() for name in STAT_NAMES}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStat] = {}

    def record_batch(
        self, ok: Sequence[InferRequest], failed: Sequence[InferRequest], timing: BatchTiming
    ) -> None:
        end = time.perf_counter_ns()
        n = len(ok)
        # per batch, not per request: a sum of per-request durations is n times the batch's end
        # (or start) less the sum of the requests' arrivals (or queue entries)
        arrived = queued = done = 0
        for r in ok:
            arrived += r.arrival_ns
            queued += r.queue_start_ns
            done += r.batch_size
        size = done + sum(r.batch_size for r in failed)
        with self._lock:
            d = self.durations
            if failed:
                d["fail"].add(len(failed) * end - sum(r.arrival_ns for r in failed), len(failed))
            if ok:
                d["success"].add(n * end - arrived, n)
                d["queue"].add(n * timing.compute_start_ns - queued, n)
                d["compute_input"].add(n * timing.compute_input_ns, n)
                d["compute_infer"].add(n * timing.compute_infer_ns, n)
                d["compute_output"].add(n * timing.compute_output_ns, n)
                self.inference_count += done
                self.execution_count += 1
                stat = self.batch_stats.setdefault(size, BatchStat())
                stat.compute_input.add(timing.compute_input_ns)
                stat.compute_infer.add(timing.compute_infer_ns)
                stat.compute_output.add(timing.compute_output_ns)
            self.last_inference_ms = time.time_ns() // 1_000_000

    def record_request(self, request: InferRequest, queue_ns: int, input_ns: int, infer_ns: int,
                       output_ns: int) -> None:  # fmt: skip
        """An ensemble's request, answered: one execution of its batch, its durations the sums
        of its steps' (Triton's accounting for ensembles)."""
        end = time.perf_counter_ns()
        with self._lock:
            d = self.durations
            d["success"].add(end - request.arrival_ns)
            d["queue"].add(queue_ns)
            d["compute_input"].add(input_ns)
            d["compute_infer"].add(infer_ns)
            d["compute_output"].add(output_ns)
            self.inference_count += request.batch_size
            self.execution_count += 1
            self.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, request: InferRequest) -> None:
        """A request that failed before execution (rejected, timed out, shut down)."""
        end = time.perf_counter_ns()
        with self._lock:
            self.durations["fail"].add(end - request.arrival_ns)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "version": str(self.version),
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {k: v.as_dict() for k, v in self.durations.items()},
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": s.compute_input.as_dict(),
                        "compute_infer": s.compute_infer.as_dict(),
                        "compute_output": s.compute_output.as_dict(),
                    }
                    for size, s in sorted(self.batch_stats.items())
                ],
                "memory_usage": [],
            }
