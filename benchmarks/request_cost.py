"""Worker CPU per request at a fixed request rate: what a change costs the hot path, before/after.

    .venv/bin/python benchmarks/request_cost.py --compare-tree /tmp/before [--rounds 7]

Throughput under saturation swings by 5-10% between minutes on these VMs; CPU time per request
at a rate the worker easily sustains is a steadier measure of per-request overhead. Three workers
serve a trivial ONNX model (add_mul, client batch 1, no dynamic batching, one instance): this
tree ("after"), a second copy of it ("after-again": the A/A floor) and the `analyzer` of another
checkout ("before", e.g. a `git worktree` of the previous commit). Each round drives each worker
in a rotating order with perf_analyzer at `--rate` requests/s over HTTP and over gRPC (worker on
core 1, perf_analyzer on core 0), and divides the worker's CPU time (user + system) by the
requests it served in that time (statistics deltas). Reported per protocol: µs per request of
each worker (median), after/before and after/after-again (median, min-max over rounds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
from loadgen_vs_perf_analyzer import trivial_repository  # noqa: E402
from serving import start_worker  # noqa: E402

PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"
SERVER_CPU, CLIENT_CPU = "1", "0"
MODEL = "add_mul"


def served_requests(http: str) -> int:
    with urllib.request.urlopen(f"http://{http}/v2/models/{MODEL}/stats") as r:
        return json.load(r)["model_stats"][0]["inference_count"]


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cost_us(worker, protocol: str, rate: int, window_ms: int) -> float:
    """µs of worker CPU per request served while perf_analyzer holds `rate` requests/s."""
    address = worker.http if protocol == "http" else worker.grpc
    cmd = ["taskset", "-c", CLIENT_CPU, str(PERF_ANALYZER), "-m", MODEL, "-u", address,
           "-i", protocol, "--request-rate-range", str(rate), "-p", str(window_ms),
           "-s", "1000", "-r", "3"]  # fmt: skip
    before_cpu, before_n = cpu_seconds(worker.process.pid), served_requests(worker.http)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(run.stdout + run.stderr)
    cpu = cpu_seconds(worker.process.pid) - before_cpu
    served = served_requests(worker.http) - before_n
    return cpu / max(served, 1) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", required=True, help="the other checkout's root")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rate", type=int, default=1000, help="requests/s (well under capacity)")
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--protocols", default="http,grpc")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="request-cost-"))
    repo = trivial_repository(tmp / "repo")
    other = Path(args.compare_tree).resolve()
    workers = {
        "after": start_worker(repo, cpus=SERVER_CPU),
        "after-again": start_worker(repo, cpus=SERVER_CPU),
        "before": start_worker(repo, cpus=SERVER_CPU, source_tree=other),
    }
    names = list(workers)
    try:
        for protocol in args.protocols.split(","):
            for w in workers.values():  # warm-up
                cost_us(w, protocol, args.rate, 1000)
            got: dict[str, list[float]] = {n: [] for n in names}
            for i in range(args.rounds):
                for n in names[i % 3:] + names[: i % 3]:
                    got[n].append(cost_us(workers[n], protocol, args.rate, args.window_ms))

            def ratio(a: str, b: str, got=got) -> str:
                r = [x / y for x, y in zip(got[a], got[b], strict=True)]
                return f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})"

            each = ", ".join(f"{n} {statistics.median(got[n]):.1f}" for n in names)
            print(f"{protocol:>5} at {args.rate} req/s: worker CPU us/request medians: {each}; "
                  f"after/before {ratio('after', 'before')}; A/A after/after-again "
                  f"{ratio('after', 'after-again')}", flush=True)  # fmt: skip
    finally:
        for w in workers.values():
            w.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
