"""What the profiler's CPU sampler costs per sample, on this host and on one with many processes.

    .venv/bin/python benchmarks/sampler_cost.py [--compare-tree /tmp/before] [--rounds 5]
        [--seconds 10] [--extra 1000]

The sampler (analyzer/monitor/cpu.py) polls the worker's process tree at 10 Hz from the profile
process, which runs on the load generator's CPUs: what it costs is taken from the client. Each
leg is a fresh interpreter, pinned to CPU 0, that watches a tree like a worker's (itself and one
sleeping child) for `--seconds` at the profiler's 10 Hz and prints its own CPU time per sample
(long enough to include the tree's periodic re-lookups, which are most of the cost).
The legs run on the host as it is, then with `--extra` idle processes outside the tree (a busy
GPU host), each round in a rotated order of trees. With `--compare-tree`, the other checkout's
`analyzer` is measured the same way, and this tree twice: the second copy's ratio to the first is
the A/A noise floor next to the trees' ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LEG = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from analyzer.monitor.cpu import CpuSampler
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
try:
    sampler = CpuSampler(os.getpid())
    sampler.sample()  # the first lookup, as at a worker's start
    n, c0, end = 0, time.process_time(), time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        sampler.sample()
        n += 1
        time.sleep(0.1)
    print((time.process_time() - c0) / n * 1e3)
finally:
    child.kill()
"""


def leg(tree: Path, seconds: float) -> float:
    """CPU ms per sample, in a fresh interpreter on CPU 0."""
    command = [sys.executable, "-c", LEG, str(tree), str(seconds)]
    if len(os.sched_getaffinity(0)) >= 2:
        command = ["taskset", "-c", "0", *command]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip())


def idle_processes(count: int) -> subprocess.Popen:
    """`count` sleeping processes in a session of their own (not in any leg's tree)."""
    return subprocess.Popen(
        ["bash", "-c", f"for i in $(seq {count}); do sleep 3600 & done; wait"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def host_processes() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare-tree", type=Path, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--extra", type=int, default=1000, help="idle processes of the busy host")
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.compare_tree:
        trees = {"before": args.compare_tree.resolve(), "this": ROOT, "this again": ROOT}
    for extra in (0, args.extra):
        crowd = idle_processes(extra) if extra else None
        try:
            if crowd is not None:  # wait until they are all there
                target = host_processes() + extra - 5
                for _ in range(200):
                    if host_processes() >= target:
                        break
                    time.sleep(0.05)
            names = list(trees)
            figures: dict[str, list[float]] = {name: [] for name in names}
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    figures[name].append(leg(trees[name], args.seconds))
            print(f"host with {host_processes()} processes ({extra} idle added), "
                  f"{args.rounds} rounds:")  # fmt: skip
            for name in names:
                values = figures[name]
                print(f"  {name:10} CPU per sample {statistics.median(values):7.2f} ms "
                      f"({min(values):.2f}-{max(values):.2f})")  # fmt: skip
            if args.compare_tree:
                ratios = [t / b for t, b in zip(figures["this"], figures["before"], strict=True)]
                aa = [t / b for t, b in zip(figures["this again"], figures["this"], strict=True)]
                print(f"  this/before {statistics.median(ratios):.3f} "
                      f"({min(ratios):.3f}-{max(ratios):.3f}), A/A {statistics.median(aa):.3f} "
                      f"({min(aa):.3f}-{max(aa):.3f})")  # fmt: skip
        finally:
            if crowd is not None:
                os.killpg(crowd.pid, 9)
                crowd.wait()


if __name__ == "__main__":
    main()
