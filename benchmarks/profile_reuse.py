"""What reusing the worker and the load generator saves per variant, side by side.

    .venv/bin/python benchmarks/profile_reuse.py [--pairs 5] [--points 4]

NVIDIA Model Analyzer starts a server for every config variant and a new perf_analyzer process
for every concurrency point. `model-analyzer profile` keeps one worker (variants are loaded and
unloaded through the repository API) and one load generator (its processes switch requests).
For each example model this measures the switching overhead of one variant with `--points`
load points, measurement itself excluded:

  reuse:   load the variant into the running worker, switch the load generator's requests,
           unload it;
  restart: start a worker serving only the variant and wait until ready, start a fresh
           load-generator process per point (connect, ready), stop them all.

Pairs alternate the order (A B, B A, ...); the ratio restart/reuse is reported per model
(median, min, max). Worker on the upper half of the CPUs, the analyzer on the lower half.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.config.model_config import load_model_config  # noqa: E402
from analyzer.launch.local import LocalLauncher  # noqa: E402
from analyzer.loadgen.client import LoadClient  # noqa: E402
from analyzer.loadgen.control import control_client  # noqa: E402
from analyzer.loadgen.inputs import model_io  # noqa: E402
from analyzer.loadgen.perf import PerfOptions, encode_payloads  # noqa: E402
from analyzer.repository.variants import make_variant, write_variant  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"


def payloads_for(url: str, name: str) -> list[bytes]:
    control = control_client("http", url, name)
    try:
        io = model_io(control.model_metadata(), control.model_config())
    finally:
        control.close()
    return encode_payloads(PerfOptions(model=name, url=url), io)


def reuse(launcher: LocalLauncher, client: LoadClient, name: str, points: int) -> float:
    started = time.monotonic()
    launcher.load(name)
    client.set_payloads(payloads_for(launcher.http_url, name))
    for _ in range(points):
        client.drain()  # a point boundary costs one command round trip
    client.quiesce()
    launcher.unload(name)
    return time.monotonic() - started


def restart(repo: Path, log: Path, name: str, points: int, cpus: str) -> float:
    started = time.monotonic()
    launcher = LocalLauncher(repo, log, {"load-model": name}, cpus=cpus)
    launcher.start()
    try:
        payloads = payloads_for(launcher.http_url, name)
        for _ in range(points):
            client = LoadClient("http", launcher.http_url, payloads)
            client.start()
            client.close()
    finally:
        launcher.stop()
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--points", type=int, default=4)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    server_cpus = ",".join(map(str, cpus[half:] if len(cpus) > 1 else cpus))
    os.sched_setaffinity(0, cpus[:half] if len(cpus) > 1 else cpus)
    tmp = Path(tempfile.mkdtemp(prefix="reuse-bench-"))
    print(f"switching cost of one variant with {args.points} load points; "
          f"{args.pairs} pairs per model", flush=True)  # fmt: skip
    for model in ("add_sub", "tiny_cnn"):
        base = load_model_config(EXAMPLES / model / "config.pbtxt")
        repo = tmp / model
        names = []
        for i in range(2 * args.pairs):
            name = f"{model}_config_{i}"
            variant = make_variant(base, {"instance_count": 1 + i % 2}, cpu_only=True)
            write_variant(EXAMPLES / model, variant, repo / name)
            names.append(name)
        launcher = LocalLauncher(repo, tmp / f"{model}-reuse.log", cpus=server_cpus)
        launcher.start()
        client = LoadClient("http", launcher.http_url, payloads_for_first(launcher, names[0]))
        client.start()
        ratios, a_times, b_times = [], [], []
        try:
            for i in range(args.pairs):
                order = ("reuse", "restart") if i % 2 == 0 else ("restart", "reuse")
                got = {}
                for kind in order:
                    name = names[2 * i + (0 if kind == "reuse" else 1)]
                    if kind == "reuse":
                        got[kind] = reuse(launcher, client, name, args.points)
                    else:
                        got[kind] = restart(repo, tmp / f"{model}-restart.log", name, args.points,
                                            server_cpus)
                a_times.append(got["reuse"])
                b_times.append(got["restart"])
                ratios.append(got["restart"] / got["reuse"])
        finally:
            client.close()
            launcher.stop()
        print(f"  {model}: reuse {statistics.median(a_times):.2f} s, restart "
              f"{statistics.median(b_times):.2f} s per variant; restart/reuse "
              f"{statistics.median(ratios):.1f} (min {min(ratios):.1f}, max {max(ratios):.1f})",
              flush=True)  # fmt: skip
    return 0


def payloads_for_first(launcher: LocalLauncher, name: str) -> list[bytes]:
    launcher.load(name)
    try:
        return payloads_for(launcher.http_url, name)
    finally:
        launcher.unload(name)


if __name__ == "__main__":
    sys.exit(main())
