"""Concurrent streams to one instance of a decoupled python model, this tree against another.

    .venv/bin/python benchmarks/decoupled_streams.py --compare-tree /tmp/before [--rounds 3]
        [--concurrency 1,4,16] [--tokens 10] [--interval-ms 5]

The model stands for an LLM-style streaming model: each request is answered by a thread the
model starts in execute(), which sends `--tokens` responses `--interval-ms` apart and then the
final flag; execute() returns at once. It has one instance and no batching, so how many streams
it serves at once is the worker's rule: Triton gives the instance its next call when execute()
returns. Three workers serve it: this tree ("after"), a second copy ("after-again", the A/A
floor) and `--compare-tree`'s `analyzer` ("before"), all on core 1, driven one at a time in a
rotating order by perf_analyzer `-i grpc --streaming` on core 0. Reported per concurrency:
infer/s and p99 medians, after/before and A/A as median (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
from grpc_vs_http import measure, rotating_rounds, spread  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import start_worker  # noqa: E402

LEGS = ("after", "after-again", "before")
MODEL = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TOKENS, INTERVAL_S = {tokens}, {interval_s}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            start = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])

            def stream(sender=sender, start=start):
                for n in range(TOKENS):
                    time.sleep(INTERVAL_S)
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([start + n], dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=stream).start()
        return None
'''
CONFIG = '''name: "tokens" backend: "python" max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


def repository(tokens: int, interval_ms: float) -> Path:
    repo = Path(tempfile.mkdtemp(prefix="decoupled-streams-"))
    (repo / "tokens" / "1").mkdir(parents=True)
    (repo / "tokens" / "1" / "model.py").write_text(
        MODEL.format(tokens=tokens, interval_s=interval_ms / 1000))
    (repo / "tokens" / "config.pbtxt").write_text(CONFIG)
    return repo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    repo = repository(args.tokens, args.interval_ms)
    cpus = PLACEMENT.server_cpus
    workers = {"after": start_worker(repo, cpus=cpus),
               "after-again": start_worker(repo, cpus=cpus),
               "before": start_worker(repo, cpus=cpus, source_tree=args.compare_tree)}  # fmt: skip
    out = Path(tempfile.mkdtemp()) / "point.csv"
    try:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:

            def run(leg: str, c: int = concurrency) -> tuple[float, float]:
                return measure(workers[leg].grpc, "tokens", "grpc", c, args.window_ms, out,
                               ("--streaming",))  # fmt: skip

            got = rotating_rounds(list(LEGS), args.rounds, run)
            cells = {leg: ([t for t, _ in got[leg]], [p for _, p in got[leg]]) for leg in LEGS}
            medians = ", ".join(f"{leg} {statistics.median(cells[leg][0]):.1f}/s p99 "
                                f"{statistics.median(cells[leg][1]) / 1000:.1f} ms"
                                for leg in LEGS)  # fmt: skip
            ratio = [a / b for a, b in zip(cells["after"][0], cells["before"][0], strict=True)]
            floor = [a / b for a, b in zip(cells["after-again"][0], cells["after"][0],
                                           strict=True)]  # fmt: skip
            print(f"c={concurrency}: {medians}")
            print(f"  after/before {spread(ratio)}, A/A {spread(floor)}", flush=True)
    finally:
        for worker in workers.values():
            worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
