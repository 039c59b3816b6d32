"""A python model's served throughput, this tree against another checkout: what a change to the
python backend (the worker's side or the model's process) costs, before/after.

    .venv/bin/python benchmarks/python_model_cost.py --compare-tree /tmp/before [--rounds 5]

Three workers serve the example repository: this tree ("after"), a second one of it
("after-again": the A/A floor) and the `analyzer` of another checkout ("before", e.g. a `git
worktree` of the previous commit). Each round drives each worker, in a rotating order, with
perf_analyzer over HTTP at `--concurrency` on add_sub (a python model: every batch crosses to
the model's process and back), the workers on core 1 and perf_analyzer on core 0. Reported:
infer/s of each (per round and median), after/before and after-again/after (median, per round).
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
from grpc_vs_http import measure, rotating_rounds  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import EXAMPLES, start_worker  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", type=Path, required=True,
                        help="the other checkout's root")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--model", default="add_sub")
    args = parser.parse_args()
    cpus = PLACEMENT.server_cpus
    workers = {"after": start_worker(EXAMPLES, cpus=cpus),
               "before": start_worker(EXAMPLES, cpus=cpus, source_tree=args.compare_tree),
               "after-again": start_worker(EXAMPLES, cpus=cpus)}  # fmt: skip
    try:
        out = Path(tempfile.mkdtemp()) / "point.csv"

        def run(leg: str) -> float:
            return measure(workers[leg].http, args.model, "http", args.concurrency,
                           args.window_ms, out)[0]  # fmt: skip

        got = rotating_rounds(list(workers), args.rounds, run)
    finally:
        for worker in workers.values():
            worker.stop()
    for leg, values in got.items():
        median = statistics.median(values)
        print(f"{leg}: {[round(v) for v in values]} infer/s, median {median:.0f}")
    for name, a, b in (("after/before", "after", "before"), ("A/A", "after-again", "after")):
        ratios = [x / y for x, y in zip(got[a], got[b], strict=True)]
        print(f"{name}: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
