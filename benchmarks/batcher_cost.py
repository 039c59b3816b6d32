"""The dynamic batcher's own CPU cost per request, with no transport and no model.

    .venv/bin/python benchmarks/batcher_cost.py [--requests 200000] [--rounds 5]

What a request costs between a protocol handler's `ModelVersion.submit` and its `on_done`, minus
the model: validation against the config, the scheduler's queue and batch formation, the
statistics of each batch, and delivery. The producer enqueues requests in bursts the size of the
wanted batch and the runner thread takes batches with `next_batch()`, as the worker's instance
runners do; the "model" returns its inputs. One process pinned to core 1, CPU time from
`time.process_time` (both threads). Reported per batch size: µs of CPU per request, median
(min-max) over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from analyzer.config.model_config import parse_model_config  # noqa: E402
from analyzer.worker.batcher import Scheduler  # noqa: E402
from analyzer.worker.request import BatchTiming, InferRequest  # noqa: E402
from analyzer.worker.stats import ModelStats  # noqa: E402
from analyzer.worker.validate import RequestValidator  # noqa: E402

CONFIG = """
name: "m"
backend: "python"
max_batch_size: {batch}
dynamic_batching {{ }}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


def run(batch: int, requests: int) -> float:
    """µs of CPU per request through validate -> enqueue -> batch -> stats -> deliver."""
    config = parse_model_config(CONFIG.format(batch=batch))
    stats = ModelStats("m", 1)
    validator = RequestValidator(config)
    scheduler = Scheduler(config, stats)
    done = threading.Semaphore(0)
    answered = [0]

    def on_done(outputs, error) -> None:
        answered[0] += 1

    def runner() -> None:
        while (got := scheduler.next_batch()) is not None:
            timing = BatchTiming(compute_start_ns=time.perf_counter_ns())
            outputs = [{"Y": r.inputs["X"]} for r in got]  # the model: nothing
            stats.record_batch(got, [], timing)
            for request, result in zip(got, outputs, strict=True):
                scheduler.deliver(request, result, None)
            for _ in got:
                done.release()

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    x = {"X": np.zeros((1, 4), np.float32)}
    wire = {"X": "FP32"}
    start = time.process_time()
    for _ in range(requests // batch):
        for _ in range(batch):
            request = InferRequest("m", x, wire, None, on_done)
            validator.check(request)
            scheduler.enqueue(request)
        for _ in range(batch):  # the burst is answered before the next one is sent
            done.acquire()
    spent = time.process_time() - start
    for request in scheduler.close():
        scheduler.deliver(request, None, RuntimeError("closed"))
    thread.join(10)
    assert answered[0] == requests // batch * batch
    return spent / (requests // batch * batch) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", default="1,8,16")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    sizes = [int(b) for b in args.batches.split(",")]
    got: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(args.rounds):
        for b in sizes:
            got[b].append(run(b, args.requests))
    for b in sizes:
        v = got[b]
        print(f"batch {b:>2}: {statistics.median(v):.1f} µs CPU per request "
              f"({min(v):.1f}-{max(v):.1f}) over {args.rounds} rounds")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
