"""How long the worker takes to load and unload a python model: the cost every variant of a
profile pays before its first measurement.

    .venv/bin/python benchmarks/model_load.py [--compare-tree /tmp/before] [--rounds 5]
        [--loads 4] [--counts 1,2]

The example add_sub (a python-backend model: one stub process per instance) is loaded through
the repository API with a config of `count` CPU instances, then unloaded, `--loads` times per
count, in a worker pinned to CPU 1 while this client runs on CPU 0 (as a profile places them).
Each round starts a fresh worker per tree, the trees in a rotated order; the figure per round is
the median of its loads. With `--compare-tree`, the other checkout's `analyzer` is measured the
same way, and this tree twice: the second copy's ratio to the first is the A/A noise floor next
to the trees' ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serving import EXAMPLES, start_worker  # noqa: E402
from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup  # noqa: E402

from analyzer.config.model_config import load_model_config, model_config_to_dict  # noqa: E402


def _config(count: int) -> dict:
    """The example's own config, with `count` CPU instances."""
    config = load_model_config(EXAMPLES / "add_sub" / "config.pbtxt")
    del config.instance_group[:]
    config.instance_group.add(count=count, kind=ModelInstanceGroup.KIND_CPU)
    return model_config_to_dict(config)


def _post(address: str, path: str, body: dict) -> float:
    request = urllib.request.Request(f"http://{address}{path}", method="POST",
                                     data=json.dumps(body).encode())  # fmt: skip
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
    return time.perf_counter() - start


def measure(tree: Path | None, counts: list[int], loads: int) -> dict[int, tuple[float, float]]:
    """count -> (median load s, median unload s) in one fresh worker."""
    cpus = "1" if len(os.sched_getaffinity(0)) >= 2 else None
    served = start_worker(EXAMPLES, "--model-control-mode", "explicit", cpus=cpus,
                          source_tree=tree)  # fmt: skip
    try:
        result = {}
        for count in counts:
            config = json.dumps(_config(count))
            load, unload = [], []
            for _ in range(loads):
                load.append(_post(served.http, "/v2/repository/models/add_sub/load",
                                  {"parameters": {"config": config}}))  # fmt: skip
                unload.append(_post(served.http, "/v2/repository/models/add_sub/unload", {}))
            result[count] = (statistics.median(load), statistics.median(unload))
        return result
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare-tree", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--counts", default="1,2")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {0})
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.compare_tree:
        trees += [("this tree (A/A)", None), ("compared tree", args.compare_tree.resolve())]
    rounds: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        shift = round_ % len(trees)
        for label, tree in trees[shift:] + trees[:shift]:
            for count, times in measure(tree, counts, args.loads).items():
                rounds.setdefault((label, count), []).append(times)
                print(f"round {round_ + 1} {label:15} {count} instance(s): load "
                      f"{times[0]:.3f} s, unload {times[1]:.3f} s", flush=True)  # fmt: skip
    print(f"\nadd_sub, medians of {args.rounds} rounds of {args.loads} loads each")
    median = {key: (statistics.median(v[0] for v in values),
                    statistics.median(v[1] for v in values))
              for key, values in rounds.items()}  # fmt: skip
    for (label, count), (load, unload) in sorted(median.items()):
        print(f"{label:15} {count} instance(s): load {load:.3f} s   unload {unload:.3f} s")
    if args.compare_tree:
        for count in counts:
            ours, floor = median[("this tree", count)], median[("this tree (A/A)", count)]
            theirs = median[("compared tree", count)]
            print(f"{count} instance(s): load this/compared {ours[0] / theirs[0]:.3f} "
                  f"(A/A {floor[0] / ours[0]:.3f}), unload {ours[1] / theirs[1]:.3f} "
                  f"(A/A {floor[1] / ours[1]:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
