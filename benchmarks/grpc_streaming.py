"""gRPC streaming (ModelStreamInfer) through our worker, side by side with another tree's worker.

    .venv/bin/python benchmarks/grpc_streaming.py --compare-tree /tmp/before [--rounds 5]
        [--concurrency 4,16] [--models add_sub,tiny_cnn]

Three workers serve the bundled examples, all pinned to core 1 and driven one at a time: this
tree ("after"), a second copy of it ("after-again", the A/A floor) and the `analyzer` package of
`--compare-tree` ("before", e.g. a `git worktree` of the previous commit). NVIDIA perf_analyzer
on core 0 drives each over `-i grpc --streaming`, and the "after" worker over unary gRPC too
("after-unary"), in a rotating order every round (../shared/BENCHMARKING.md). Reported per model
and concurrency: after/before, the A/A floor after-again/after and streaming/unary on the same
worker, each as median (min-max) over the rounds, with infer/s and p99 medians.
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

LEGS = ("after", "after-again", "before", "after-unary")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--models", default="add_sub,tiny_cnn")
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    tmp = Path(tempfile.mkdtemp(prefix="grpc-streaming-"))
    out = tmp / "point.csv"
    repository = placement.examples(tmp)
    workers = {
        "after": start_worker(repository, cpus=PLACEMENT.server_cpus),
        "after-again": start_worker(repository, cpus=PLACEMENT.server_cpus),
        "before": start_worker(repository, cpus=PLACEMENT.server_cpus,
                               source_tree=args.compare_tree.resolve()),
    }  # fmt: skip

    def point(leg: str, model: str, c: int, window_ms: int) -> tuple[float, float]:
        worker = workers["after" if leg == "after-unary" else leg]
        streaming = ("--streaming",) if leg != "after-unary" else ()
        return measure(worker.grpc, model, "grpc", c, window_ms, out, streaming)

    try:
        for model in args.models.split(","):
            for c in (int(v) for v in args.concurrency.split(",")):
                for leg in LEGS:  # warm-up: connections, model, allocator
                    point(leg, model, c, 1000)
                got = rotating_rounds(list(LEGS), args.rounds, lambda leg, model=model, c=c:
                                      point(leg, model, c, args.window_ms))  # fmt: skip
                rate = {leg: [t for t, _ in got[leg]] for leg in LEGS}
                p99 = {leg: statistics.median(p for _, p in got[leg]) for leg in LEGS}

                def ratio(a: str, b: str, rate=rate) -> str:
                    return spread([x / y for x, y in zip(rate[a], rate[b], strict=True)])

                medians = ", ".join(f"{leg} {statistics.median(rate[leg]):.0f}" for leg in LEGS)
                p99s = ", ".join(f"{leg} {p99[leg]:.0f}" for leg in LEGS)
                print(f"{model:>8} c={c:<3} streaming after/before {ratio('after', 'before')}; "
                      f"A/A {ratio('after-again', 'after')}; streaming/unary "
                      f"{ratio('after', 'after-unary')}; infer/s medians: {medians}; "
                      f"p99 µs medians: {p99s}", flush=True)  # fmt: skip
    finally:
        for worker in workers.values():
            worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
