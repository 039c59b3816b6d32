"""Embedded load generator (`model-analyzer perf`) vs NVIDIA perf_analyzer 2.41.0, side by side.

    .venv/bin/python benchmarks/loadgen_vs_perf_analyzer.py [--parts agreement,matched,capacity]
        [--pairs 3] [--concurrency 1,4,16] [--protocol http]

(a) agreement: the TorchScript example tiny_cnn on one worker; for each concurrency the two tools
    run alternately (A B, B A, ...), each as a fresh command with its defaults (perf_analyzer:
    5 s time windows, 10% stability; ours: adaptive); ratios ours/perf_analyzer of throughput and
    of p50 latency per pair. Target: medians within +-10%.
    With --parts matched, both get the same three 1.5 s windows (ours in time_windows mode): this
    compares the instruments alone, with short alternations that the machine's drift affects less.
(c) cost: in the same runs, wall time of each command to its stable point (process start to exit),
    ratio ours/perf_analyzer. Target <= 1/3.
(b) capacity: a trivial ONNX add/mul model; each tool is asked for rising request rates (x1.25
    steps, the same 3 x 1.5 s windows for both) and the highest rate it sustains (>= 95% of the
    asked rate completed) is its capacity; pairs alternate the order. Target ours/perf_analyzer
    >= 0.8.

On CPU the worker is pinned to core 1 and both load generators to core 0
(../shared/BENCHMARKING.md);
on a machine with more cores the worker gets the upper half and the clients the lower half.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))
from serving import EXAMPLES, start_worker  # noqa: E402

PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"
OURS = [sys.executable, "-m", "analyzer", "perf"]


def cpu_split() -> tuple[str, str]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return str(cpus[0]), str(cpus[0])
    half = len(cpus) // 2
    client, server = cpus[:half], cpus[half:]
    return ",".join(map(str, server)), ",".join(map(str, client))


SERVER_CPU, CLIENT_CPU = cpu_split()


def run_tool(tool: str, args: list[str], out: Path) -> tuple[dict, float, str]:
    """Run one measurement command; its first CSV row, wall seconds, and its output."""
    base = [str(PERF_ANALYZER)] if tool == "perf_analyzer" else OURS
    cmd = ["taskset", "-c", CLIENT_CPU, *base, *args, "-f", str(out)]
    out.unlink(missing_ok=True)
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    text = run.stdout + run.stderr
    if run.returncode != 0 or not out.exists():
        return {}, wall, text
    with out.open() as f:
        rows = list(csv.DictReader(f))
    return (rows[0] if rows else {}), wall, text


def med(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


MATCHED = ["-p", "1500", "-s", "1000", "-r", "3"]  # three 1.5 s windows, always accepted


def agreement(
    address: str, protocol: str, levels: list[int], pairs: int, tmp: Path, matched: bool = False
) -> None:
    what = ("matched windows (both: 3 x 1.5 s, ours in time_windows mode)" if matched
            else "each tool's defaults")  # fmt: skip
    print(f"(a) agreement{'' if matched else ' and (c) cost'}: tiny_cnn, {protocol}, {what}, "
          f"worker on CPU {SERVER_CPU}, clients on CPU {CLIENT_CPU}", flush=True)  # fmt: skip
    common = ["-m", "tiny_cnn", "-u", address, "-i", protocol]
    run_tool("ours", [*common, "--concurrency-range", "4"], tmp / "warm.csv")  # warm-up
    all_cost: list[float] = []
    for level in levels:
        args = [*common, "--concurrency-range", str(level)]
        thr, p50, cost, detail = [], [], [], []
        failures = {"perf_analyzer": 0, "ours": 0}
        for i in range(pairs):
            order = ("perf_analyzer", "ours") if i % 2 == 0 else ("ours", "perf_analyzer")
            got = {}
            for tool in order:
                extra = []
                if matched:
                    extra = MATCHED + (["--measurement-mode", "time_windows"] if tool == "ours"
                                       else [])  # fmt: skip
                for _ in range(3):  # perf_analyzer exits without a result when never stable
                    row, wall, text = run_tool(tool, [*args, *extra], tmp / f"{tool}.csv")
                    if row:
                        break
                    failures[tool] += 1
                got[tool] = (row, wall, text)
            pa, ours = got["perf_analyzer"], got["ours"]
            if not pa[0] or not ours[0]:
                failed = "perf_analyzer" if not pa[0] else "ours"
                tail = (pa if failed == "perf_analyzer" else ours)[2].strip().splitlines()[-1:]
                detail.append(f"pair {i}: {failed} gave no result ({' '.join(tail)})")
                continue
            t_pa, t_ours = float(pa[0]["Inferences/Second"]), float(ours[0]["Inferences/Second"])
            l_pa, l_ours = float(pa[0]["p50 latency"]), float(ours[0]["p50 latency"])
            thr.append(t_ours / t_pa)
            p50.append(l_ours / l_pa)
            cost.append(ours[1] / pa[1])
            detail.append(
                f"pair {i}: infer/s {t_ours:.0f}/{t_pa:.0f}, p50 {l_ours:.0f}/{l_pa:.0f} us, "
                f"wall {ours[1]:.1f}/{pa[1]:.1f} s"
            )
        all_cost += cost
        print(f"  concurrency {level}: throughput ratio {med(thr)}; p50 ratio {med(p50)}; "
              f"wall-time ratio {med(cost)}; runs without a result (retried): "
              f"perf_analyzer {failures['perf_analyzer']}, ours {failures['ours']}",
              flush=True)  # fmt: skip
        for line in detail:
            print(f"    {line} (ours/perf_analyzer)", flush=True)
    if not matched:
        print(f"  cost over all points: wall-time ratio ours/perf_analyzer {med(all_cost)}",
              flush=True)  # fmt: skip


def trivial_repository(root: Path) -> Path:
    from build_examples import build_onnx_add_mul

    folder = root / "add_mul"
    build_onnx_add_mul(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        'name: "add_mul"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },\n'
        '        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },\n'
        '         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    return root


def sustains(tool: str, address: str, protocol: str, rate: float, tmp: Path) -> tuple[bool, float]:
    args = ["-m", "add_mul", "-u", address, "-i", protocol, "--request-rate-range", f"{rate:g}",
            "-p", "1500", "-r", "3", "-s", "1000"]  # fmt: skip
    if tool == "ours":
        args += ["--measurement-mode", "time_windows"]
    row, _, _ = run_tool(tool, args, tmp / f"cap-{tool}.csv")
    achieved = float(row.get("Inferences/Second", 0) or 0)
    return achieved >= 0.95 * rate, achieved


def capacity_of(tool: str, address: str, protocol: str, start: float, tmp: Path) -> float:
    """Highest rate of the x1.25 ladder the tool sustains (two misses in a row end the climb)."""
    rate, best, misses = start, 0.0, 0
    while misses < 2 and rate < 1e6:
        ok, _ = sustains(tool, address, protocol, rate, tmp)
        if ok:
            best, misses = rate, 0
        else:
            misses += 1
        rate *= 1.25
    return best


def capacity(address: str, protocol: str, pairs: int, tmp: Path) -> None:
    print(f"(b) capacity: trivial ONNX add_mul, {protocol}, request-rate ladder x1.25 from 500/s",
          flush=True)  # fmt: skip
    ratios, detail = [], []
    for i in range(pairs):
        order = ("perf_analyzer", "ours") if i % 2 == 0 else ("ours", "perf_analyzer")
        got = {tool: capacity_of(tool, address, protocol, 500.0, tmp) for tool in order}
        if got["perf_analyzer"] > 0:
            ratios.append(got["ours"] / got["perf_analyzer"])
        detail.append(f"pair {i}: ours {got['ours']:.0f}/s, perf_analyzer "
                      f"{got['perf_analyzer']:.0f}/s")  # fmt: skip
    print(f"  capacity ratio ours/perf_analyzer {med(ratios)}; " + "; ".join(detail), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="agreement,capacity",
                        help="agreement, matched (agreement with equal windows), capacity")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        print(f"perf_analyzer is not installed at {PERF_ANALYZER} (make venv installs it)")
        return 1
    parts = set(args.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    port = "grpc" if args.protocol == "grpc" else "http"
    try:
        if parts & {"agreement", "matched"}:
            worker = start_worker(EXAMPLES, "--model-control-mode", "explicit", "--load-model",
                                  "tiny_cnn", cpus=SERVER_CPU)  # fmt: skip
            try:
                address = getattr(worker, port)
                levels = [int(c) for c in args.concurrency.split(",")]
                if "agreement" in parts:
                    agreement(address, args.protocol, levels, args.pairs, tmp)
                if "matched" in parts:
                    agreement(address, args.protocol, levels, args.pairs, tmp, matched=True)
            finally:
                worker.stop()
        if "capacity" in parts:
            worker = start_worker(trivial_repository(tmp / "repo"), cpus=SERVER_CPU)
            try:
                capacity(getattr(worker, port), args.protocol, args.pairs, tmp)
            finally:
                worker.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
