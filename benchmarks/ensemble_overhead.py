"""The ensemble's overhead (issue 14): the seed's add_sub -> mul ensemble against the same two
models called back to back by one client, on one worker.

    .venv/bin/python benchmarks/ensemble_overhead.py [--rounds 5] [--seconds 3]
        [--concurrency 1,8]

One worker serves `examples/ensemble_repository` (the seed's add_sub, mul and ensemble, and the
BLS model doing the same), pinned to core 1. One client process on core 0 (tritonclient's
`grpc.aio`, C requests in flight) runs each leg for `--seconds`, in a rotating order every round
(../shared/BENCHMARKING.md):

- `ensemble`: one call to `ensemble` per inference;
- `chained`: add_sub, then mul with its outputs, from the client: two calls per inference;
- `ensemble-again`: the first leg again, the A/A floor;
- `bls`: one call to the BLS model, which makes the two calls inside the worker.

Reported per concurrency: each leg's infer/s and p99 (median over the rounds), ensemble/chained
with its min-max over rounds, and the A/A floor. The same client code drives every leg, so the
ratio is the pipeline's cost in the worker against a client's round trips; with one client core
the client's own cost per call is part of "chained", as it is for a real client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
from grpc_vs_http import rotating_rounds  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import start_worker  # noqa: E402

REPOSITORY = ROOT / "examples" / "ensemble_repository"
LEGS = ("ensemble", "chained", "ensemble-again", "bls")


async def _client(leg: str, url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """One leg for `seconds` after a 1-s warm-up: completed inferences/s and p99 (ms)."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    a = np.random.default_rng(0).random(4, dtype=np.float32)
    b = np.random.default_rng(1).random(4, dtype=np.float32)

    def tensors(names: tuple[str, str], x: np.ndarray, y: np.ndarray) -> list:
        out = [grpcclient.InferInput(n, [4], "FP32") for n in names]
        out[0].set_data_from_numpy(x)
        out[1].set_data_from_numpy(y)
        return out

    async def once() -> None:
        if leg == "chained":
            first = await client.infer("add_sub", tensors(("add_sub_input0", "add_sub_input1"),
                                                          a, b))  # fmt: skip
            await client.infer("mul", tensors(("mul_input0", "mul_input1"),
                                              first.as_numpy("added_output"),
                                              first.as_numpy("subbed_output")))  # fmt: skip
        else:
            model = "bls" if leg == "bls" else "ensemble"
            await client.infer(model, tensors(("INPUT0", "INPUT1"), a, b))

    latencies: list[float] = []
    start = time.perf_counter()
    measure_from, stop = start + 1.0, start + 1.0 + seconds

    async def loop() -> None:
        while (now := time.perf_counter()) < stop:
            await once()
            if now >= measure_from:
                latencies.append(time.perf_counter() - now)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    await client.close()
    return {"throughput": len(latencies) / seconds,
            "p99_ms": float(np.percentile(latencies, 99)) * 1e3}  # fmt: skip


def run_leg(leg: str, url: str, concurrency: int, seconds: float) -> dict[str, float]:
    cmd = ["taskset", "-c", PLACEMENT.client_cpus, sys.executable, __file__, "--client", leg,
           "--url", url, "--concurrency", str(concurrency), "--seconds", str(seconds)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if run.returncode != 0:
        raise RuntimeError(f"{leg}: {run.stdout}{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--client", choices=LEGS[:2] + LEGS[3:], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    placement.add_arguments(parser)
    args = parser.parse_args()
    if args.client:  # the client process of one leg
        print(json.dumps(asyncio.run(_client(args.client, args.url, int(args.concurrency),
                                             args.seconds))))  # fmt: skip
        return 0
    placement.apply(args)
    worker = start_worker(REPOSITORY, cpus=PLACEMENT.server_cpus)
    try:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            got = rotating_rounds(list(LEGS), args.rounds, lambda leg, c=concurrency: run_leg(
                leg.split("-")[0], worker.grpc, c, args.seconds))  # fmt: skip
            print(f"\n## c={concurrency}, {args.rounds} rounds of {args.seconds:.0f} s per leg "
                  "(median infer/s, p99 ms)")
            for leg in LEGS:
                tp = statistics.median(r["throughput"] for r in got[leg])
                p99 = statistics.median(r["p99_ms"] for r in got[leg])
                print(f"  {leg:15s} {tp:8.0f} infer/s   p99 {p99:6.2f} ms")
            ratios = [e["throughput"] / c["throughput"]
                      for e, c in zip(got["ensemble"], got["chained"], strict=True)]  # fmt: skip
            again = got["ensemble-again"]
            floor = [abs(1 - x["throughput"] / e["throughput"])
                     for e, x in zip(got["ensemble"], again, strict=True)]  # fmt: skip
            print(f"  ensemble/chained {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}); A/A floor "
                  f"{statistics.median(floor):.1%}", flush=True)
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
