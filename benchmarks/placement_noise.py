"""How much of a point's noise comes from the worker and the load generator sharing CPUs.

    .venv/bin/python benchmarks/placement_noise.py [--rounds 6] [--concurrency 2:8:2]

Three legs run the same sweep of tiny_cnn (gRPC, our load generator, the profile's adaptive 1 s
windows) in interleaved rounds whose order rotates:
- `shared`: the worker and the load generator unpinned, as `--worker-cpus all` runs them;
- `split`: the worker on the worker's CPUs and the load generator on the rest, as the profile's
  default does (analyzer/launch/cpus.py);
- `split-again`: the same as `split`, for the A/A floor.
Each leg has its own worker, started as that leg places it; the idle ones wait. Per concurrency it
reports each leg's coefficient of variation of throughput across rounds: how far apart the same
config measures minutes apart. It also gives the ratio of the two CVs, with the floor from
split-again. The throughput ratio split/shared shows what the model gives up by leaving CPUs to
the load generator.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serving import start_worker  # noqa: E402

from analyzer.launch.cpus import default_split, format_cpu_list  # noqa: E402

LEGS = ("shared", "split", "split-again")


def sweep(url: str, concurrency: str, client_cpus: str | None, out: Path) -> dict[int, float]:
    """Our load generator's throughput per concurrency, as the profile measures a point."""
    cmd = [sys.executable, "-m", "analyzer", "perf", "-m", "tiny_cnn", "-u", url, "-i", "grpc",
           "--concurrency-range", concurrency, "-p", "1000", "-s", "10", "-r", "5",
           "-f", str(out)]  # fmt: skip
    if client_cpus:
        cmd = ["taskset", "-c", client_cpus, *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{run.stdout}{run.stderr}")
    with out.open() as f:
        return {int(r["Concurrency"]): float(r["Inferences/Second"]) for r in csv.DictReader(f)}


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", default="2:8:2")
    args = parser.parse_args()
    split = default_split(frozenset(os.sched_getaffinity(0)))
    if split is None:
        raise SystemExit("one CPU: nothing to split")
    worker_cpus, client_cpus = (format_cpu_list(s) for s in split)
    print(f"split: worker on CPUs {worker_cpus}, load generator on CPUs {client_cpus}")
    tmp = Path(tempfile.mkdtemp(prefix="placement-noise-"))
    repo = ROOT / "examples" / "model_repository"
    workers = {
        "shared": start_worker(repo),
        "split": start_worker(repo, cpus=worker_cpus),
        "split-again": start_worker(repo, cpus=worker_cpus),
    }
    clients = {"shared": None, "split": client_cpus, "split-again": client_cpus}
    got: dict[str, list[dict[int, float]]] = {leg: [] for leg in LEGS}
    try:
        for leg in LEGS:  # warm-up: model, connections, allocator
            sweep(workers[leg].grpc, args.concurrency, clients[leg], tmp / "w.csv")
        for i in range(args.rounds):
            for leg in LEGS[i % 3 :] + LEGS[: i % 3]:
                got[leg].append(sweep(workers[leg].grpc, args.concurrency,
                                      clients[leg], tmp / "p.csv"))  # fmt: skip
            print(f"round {i + 1}/{args.rounds} done", flush=True)
    finally:
        for worker in workers.values():
            worker.stop()
    levels = sorted(got["shared"][0])
    print(
        f"{'c':>3} | {'CV shared':>9} {'CV split':>9} {'CV again':>9} | "
        f"{'shared/split CV':>15} {'A/A again/split':>15} | split/shared infer/s"
    )
    for c in levels:
        series = {leg: [r[c] for r in got[leg]] for leg in LEGS}
        cvs = {leg: cv(series[leg]) for leg in LEGS}
        rate = statistics.median(series["split"]) / statistics.median(series["shared"])
        print(f"{c:>3} | {cvs['shared']:>8.1f}% {cvs['split']:>8.1f}% "
              f"{cvs['split-again']:>8.1f}% | "
              f"{cvs['shared'] / cvs['split']:>15.2f} {cvs['split-again'] / cvs['split']:>15.2f} | "
              f"{rate:.3f} (medians {statistics.median(series['split']):.0f} / "
              f"{statistics.median(series['shared']):.0f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
