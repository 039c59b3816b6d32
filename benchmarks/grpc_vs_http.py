"""gRPC vs HTTP through our worker: NVIDIA perf_analyzer over both protocols, alternating rounds.

    .venv/bin/python benchmarks/grpc_vs_http.py [--rounds 5] [--concurrency 1,4,16]

One worker serves the bundled examples (add_sub: python backend, dynamic batching; tiny_cnn:
TorchScript, client batch 1) pinned to core 1; perf_analyzer runs on core 0
(../shared/BENCHMARKING.md); `--gpu` puts tiny_cnn on the GPU and `--server-cpus`/`--client-cpus`
move both (placement.py). Every round measures each model and concurrency over HTTP, over gRPC
and over HTTP again, in a rotating order; the second HTTP point gives the A/A floor the gRPC/HTTP
ratio is read against. Reported per model and concurrency: infer/s medians, gRPC/HTTP and
HTTP/HTTP-again as median (min-max) over rounds, and p99 latency medians.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import start_worker  # noqa: E402

MODELS = ("add_sub", "tiny_cnn")
LEGS = ("http", "grpc", "http-again")


def measure(address: str, model: str, protocol: str, concurrency: int, window_ms: int,
            out: Path, extra: tuple[str, ...] = ()) -> tuple[float, float]:  # fmt: skip
    """perf_analyzer's throughput and p99 (µs) for one point (vs_kserve.py and
    grpc_streaming.py use it too); `extra`: more perf_analyzer flags (--streaming)."""
    cmd = ["taskset", "-c", PLACEMENT.client_cpus, str(placement.perf_analyzer()), "-m", model,
           "-u", address, "-i", protocol, *extra, "--concurrency-range", str(concurrency),
           "-p", str(window_ms), "-s", "50", "-f", str(out)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{run.stdout}{run.stderr}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    return float(row["Inferences/Second"]), float(row["p99 latency"])


def point(worker, model: str, leg: str, concurrency: int, window_ms: int, out: Path):
    protocol = leg.split("-")[0]
    address = worker.http if protocol == "http" else worker.grpc
    return measure(address, model, protocol, concurrency, window_ms, out)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def rotating_rounds(legs: list[str], rounds: int, run) -> dict[str, list]:
    """`run(leg)` for every leg in every round, the order rotating round by round."""
    got: dict[str, list] = {leg: [] for leg in legs}
    for i in range(rounds):
        for leg in legs[i % len(legs):] + legs[: i % len(legs)]:
            got[leg].append(run(leg))
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--models", default=",".join(MODELS))
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    levels = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="grpc-vs-http-"))
    out = tmp / "point.csv"
    worker = start_worker(placement.examples(tmp), cpus=PLACEMENT.server_cpus)
    try:
        for model in models:
            for c in levels:
                for leg in LEGS:  # warm-up: connections, model, allocator
                    point(worker, model, leg, c, 1000, out)
                got = rotating_rounds(LEGS, args.rounds, lambda leg, model=model, c=c: point(
                    worker, model, leg, c, args.window_ms, out))  # fmt: skip
                rate = {leg: [t for t, _ in got[leg]] for leg in LEGS}
                p99 = {leg: statistics.median(p for _, p in got[leg]) for leg in LEGS}
                grpc_http = [g / h for g, h in zip(rate["grpc"], rate["http"], strict=True)]
                floor = [a / b for a, b in zip(rate["http-again"], rate["http"], strict=True)]
                medians = ", ".join(f"{leg} {statistics.median(rate[leg]):.0f}" for leg in LEGS)
                print(f"{model:>8} c={c:<3} gRPC/HTTP {spread(grpc_http)}; A/A HTTP-again/HTTP "
                      f"{spread(floor)}; infer/s medians: {medians}; p99 µs medians: "
                      f"http {p99['http']:.0f}, grpc {p99['grpc']:.0f}", flush=True)  # fmt: skip
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
