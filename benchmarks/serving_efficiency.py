"""Serving efficiency: TorchScript example through the worker vs in-process torch.

    .venv/bin/python benchmarks/serving_efficiency.py [--pairs 3] [--window-ms 2000]
    .venv/bin/python benchmarks/serving_efficiency.py --compare-tree /tmp/before [--settings ...]

For each serving setting (client batch, dynamic batching, instances, concurrency) the worker is
driven by NVIDIA's perf_analyzer, alternating with the offline limit measured in-process (torch,
inference_mode, inputs prepared in advance) at the batch size the worker actually executed. On CPU
the worker and the offline loop are pinned to core 1 and perf_analyzer to core 0, with one torch
thread on both sides (../shared/BENCHMARKING.md). Given more cores (`--server-cpus 2,3`), the
model still runs one intra-op thread, as offline does: the other core is the front end's own.
`--gpu` runs tiny_cnn on the GPU (KIND_GPU) and the offline limit on cuda, its input copied from
host memory and its output back on every call as the worker's are; `--server-cpus` and
`--client-cpus` move both sides (placement.py).
Reported: per setting the median of the pairwise ratios served/offline with min and max; the
figure is the best setting's median.
`--protocol grpc` drives the worker over gRPC (Model Analyzer's default) instead of HTTP.

`--ratio A/B` (e.g. `b1_dynamic8/b8_direct`) drives one worker with two settings in rounds of
A, B and A again in a rotating order, and reports A/B and the A/A floor (A-again/A), median
(min-max), next to each setting's served/offline. Each served run is bracketed by the offline
limit at the batch that setting executes, measured just before and just after it (half the
offline time each, their geometric mean the limit): a host whose speed drifts over seconds moves
both sides of that ratio alike.

`--compare-tree DIR` measures a code change side by side: three workers on core 1 -- this tree
("after"), a second copy of it ("after-again", the A/A noise floor) and DIR's `analyzer` package
("before", e.g. a `git worktree` of the previous commit) -- are driven in turn, in a rotating
order, within every pair; reported per setting: after/before and after/after-again, median
(min-max), next to each worker's served/offline.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serving import EXAMPLES, start_worker  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
from grpc_vs_http import spread  # noqa: E402
from placement import PLACEMENT  # noqa: E402

PROTOCOL = ["http"]  # perf_analyzer's -i, set by --protocol


@dataclass
class Setting:
    name: str
    client_batch: int
    concurrency: int
    config: str  # appended to tiny_cnn's config.pbtxt
    instances: int = 1


SETTINGS = [
    Setting("b8_direct", 8, 2, ""),
    Setting("b16_direct", 16, 2, ""),
    Setting("b32_direct", 32, 2, ""),
    Setting("b1_dynamic8", 1, 16, "dynamic_batching { max_queue_delay_microseconds: 2000 }"),
    # the batch can fill at c=16: launched when the 16th request arrives, not when the delay ends
    Setting("b1_dynamic16", 1, 16,
            "dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 2000 }"),
    Setting("b1_dynamic0", 1, 16, "dynamic_batching { }"),  # Triton's default: no queue delay
    # two groups of 8 at c=16 on one instance: one group queues while the other computes
    Setting("b1_pref8", 1, 16,
            "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000 }"),
    # two instances on the worker's core: one group of requests is parsed while the other computes
    Setting("b1_dynamic8x2", 1, 16,
            "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000 }",
            instances=2),
    Setting("b1_dynamic16x2", 1, 16,
            "dynamic_batching { preferred_batch_size: [ 16 ] max_queue_delay_microseconds: 2000 }",
            instances=2),
]

# The offline limit runs in one long-lived process (warmed up once), pinned like the worker:
# each stdin line "BATCH SECONDS" answers with samples/s measured over that many seconds. On cuda
# every call copies its input from host memory and its output back, as a served request's are.
OFFLINE = """
import sys, time, torch
from analyzer.worker.memory import tune_malloc
tune_malloc()  # the same allocator settings as the worker: offline gets its best case too
torch.set_num_threads(1)
device = torch.device(sys.argv[2])
m = torch.jit.load(sys.argv[1], map_location=device).eval()
with torch.inference_mode():
    for line in sys.stdin:
        b, seconds = int(line.split()[0]), float(line.split()[1])
        x = torch.randn(b, 3, 32, 32)
        for _ in range(20):
            m(x.to(device)).cpu()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            m(x.to(device)).cpu()
            n += 1
        print(n * b / (time.perf_counter() - t0), flush=True)
"""


ONE_THREAD = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'


def make_repository(root: Path, settings: list[Setting] | None = None) -> None:
    """One tiny_cnn variant per setting (every setting unless `settings` names some)."""
    base = (EXAMPLES / "tiny_cnn" / "config.pbtxt").read_text()
    for s in settings or SETTINGS:
        folder = root / f"tiny_cnn_{s.name}"
        (folder / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / "tiny_cnn" / "1" / "model.pt", folder / "1" / "model.pt")
        config = base.replace('name: "tiny_cnn"', f'name: "tiny_cnn_{s.name}"')
        config = placement.placed_config(config.replace("count: 1", f"count: {s.instances}"))
        # one intra-op thread per instance, as offline has, however many cores the server gets
        (folder / "config.pbtxt").write_text(config + "\n" + s.config + "\n" + ONE_THREAD)


class Offline:
    def __init__(self) -> None:
        model = str(EXAMPLES / "tiny_cnn" / "1" / "model.pt")
        cmd = ["taskset", "-c", PLACEMENT.server_cpus, sys.executable, "-c", OFFLINE, model,
               PLACEMENT.torch_device]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )

    def measure(self, batch: int, seconds: float) -> float:
        self.proc.stdin.write(f"{batch} {seconds}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def stats(address: str, model: str) -> tuple[int, int, int, dict[int, int]]:
    """Inferences, executions, compute_infer ns, and executions by batch size."""
    with urllib.request.urlopen(f"http://{address}/v2/models/{model}/stats") as r:
        s = json.load(r)["model_stats"][0]
    infer_ns = s["inference_stats"]["compute_infer"]["ns"]
    sizes = {b["batch_size"]: int(b["compute_infer"]["count"]) for b in s["batch_stats"]}
    return s["inference_count"], s["execution_count"], infer_ns, sizes


def batch_spread(before: dict[int, int], after: dict[int, int]) -> tuple[int, int]:
    """The 10th and 90th percentiles of the executed batch sizes, weighted by samples: a mean
    batch of 8 can be every batch at 8 (a preferred size) or a spread from 2 to 14 (no delay)."""
    samples = sorted((b, (after[b] - before.get(b, 0)) * b) for b in after)
    total = sum(n for _, n in samples)
    if not total:
        return 0, 0
    cuts, seen = [], 0
    for size, n in samples:
        seen += n
        while len(cuts) < 2 and seen >= total * (0.1, 0.9)[len(cuts)]:
            cuts.append(size)
    return cuts[0], cuts[1]


def batch_text(executed: float, spread_: tuple[int, int]) -> str:
    low, high = spread_
    return f"batch {executed:.1f}" + (f", p10-p90 {low}-{high}" if low != high else "")


def load_command(worker, setting: Setting, window_ms: int, out: Path) -> list[str]:
    """perf_analyzer on the client's cores, driving `setting`'s model over --protocol."""
    target = worker.grpc if PROTOCOL[0] == "grpc" else worker.http
    return ["taskset", "-c", PLACEMENT.client_cpus, str(placement.perf_analyzer()), "-m",
            f"tiny_cnn_{setting.name}", "-u", target, "-i", PROTOCOL[0], "-b",
            str(setting.client_batch), "--concurrency-range", str(setting.concurrency), "-p",
            str(window_ms), "-s", "50", "-f", str(out)]  # fmt: skip


def served(worker, setting: Setting, window_ms: int, out: Path,
           spreads: list[tuple[int, int]] | None = None) -> tuple[float, float, float]:  # fmt: skip
    """perf_analyzer's throughput, the average executed batch, and the instance busy fraction;
    the executed batches' p10-p90 is appended to `spreads` when given."""
    model = f"tiny_cnn_{setting.name}"
    address = worker.http
    before = stats(address, model)
    run = subprocess.run(load_command(worker, setting, window_ms, out), capture_output=True,
                         text=True)  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(run.stdout + run.stderr)
    with out.open() as f:
        row = next(csv.DictReader(f))
    after = stats(address, model)
    if spreads is not None:
        spreads.append(batch_spread(before[3], after[3]))
    executions = max(after[1] - before[1], 1)
    executed = (after[0] - before[0]) / executions
    throughput = float(row["Inferences/Second"])
    # compute_infer is charged to every request of a batch: per execution it is ns / requests.
    requests = (after[0] - before[0]) / setting.client_batch
    infer_ns_per_exec = (after[2] - before[2]) / max(requests, 1)
    busy = throughput * infer_ns_per_exec / 1e9 / executed
    return throughput, executed, busy


def ratio_run(args: argparse.Namespace, tmp: Path) -> int:
    """Two settings on one worker, alternating: A/B with the A/A floor beside it."""
    names = args.ratio.split("/")
    by_name = {s.name: s for s in SETTINGS}
    if len(names) != 2 or not all(n in by_name for n in names):
        raise SystemExit(f"--ratio wants A/B of {', '.join(by_name)}, got {args.ratio!r}")
    a, b = by_name[names[0]], by_name[names[1]]
    make_repository(tmp / "repo", [a, b])
    worker = start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus)
    offline = Offline()
    runs = [("A", a), ("B", b), ("A-again", a)]
    got: dict[str, list[tuple[float, float]]] = {n: [] for n, _ in runs}
    spreads: dict[str, list[tuple[int, int]]] = {n: [] for n, _ in runs}
    eff: dict[str, list[float]] = {n: [] for n, _ in runs}
    offline_s = args.window_ms / 1000  # before and after each run: 2 windows' worth in all
    try:
        batch = {n: max(1, round(served(worker, s, 1000, tmp / "warm.csv")[1])) for n, s in runs}
        for i in range(args.pairs):
            order = runs[i % 3:] + runs[: i % 3]
            for n, s in order:
                before = offline.measure(batch[n], offline_s)
                throughput, executed, _ = served(worker, s, args.window_ms, tmp / "p.csv",
                                                 spreads[n])  # fmt: skip
                after = offline.measure(batch[n], offline_s)
                got[n].append((throughput, executed))
                eff[n].append(throughput / (before * after) ** 0.5)
                batch[n] = max(1, round(executed))  # next round's offline runs this batch
            print(f"round {i + 1}: " + ", ".join(
                f"{n} {got[n][-1][0]:.0f} infer/s ({batch_text(got[n][-1][1], spreads[n][-1])}, "
                f"served/offline "
                f"{eff[n][-1]:.3f})" for n, _ in runs), flush=True)  # fmt: skip
    finally:
        offline.close()
        worker.stop()
    ab = [x[0] / y[0] for x, y in zip(got["A"], got["B"], strict=True)]
    aa = [x[0] / y[0] for x, y in zip(got["A-again"], got["A"], strict=True)]
    print(f"{a.name} / {b.name}: {spread(ab)}; A/A {a.name}-again / {a.name}: {spread(aa)}")
    for n, s in runs[:2]:
        batch = statistics.median(x[1] for x in got[n])
        low = min(x[0] for x in spreads[n])
        high = max(x[1] for x in spreads[n])
        print(f"{s.name}: served/offline at its executed batch ({batch_text(batch, (low, high))}) "
              f"{spread(eff[n])}; "
              f"infer/s median {statistics.median(x[0] for x in got[n]):.0f}")
    return 0


def compare(args: argparse.Namespace, settings: list[Setting], tmp: Path) -> int:
    """after / before / after-again workers in rotating order; the A/A floor beside the ratio."""
    workers = {
        "after": start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus),
        "after-again": start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus),
        "before": start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus,
                               source_tree=Path(args.compare_tree).resolve()),
    }  # fmt: skip
    offline = Offline()
    names = list(workers)
    try:
        for s in settings:
            warm = {n: served(w, s, 1000, tmp / "warm.csv")[1] for n, w in workers.items()}
            batch = max(1, round(warm["after"]))  # offline at the batch "after" executes
            got: dict[str, list[float]] = {n: [] for n in names}
            limits = []
            for i in range(args.pairs):
                order = names[i % 3:] + names[: i % 3]
                limits.append(offline.measure(batch, args.window_ms / 1000 * 3))
                for n in order:
                    got[n].append(served(workers[n], s, args.window_ms, tmp / "p.csv")[0])

            def ratio(a: str, b: str, got=got) -> str:
                return spread([x / y for x, y in zip(got[a], got[b], strict=True)])

            eff = ", ".join(
                f"{n} {statistics.median([x / o for x, o in zip(got[n], limits, strict=True)]):.3f}"
                for n in names
            )
            rates = ", ".join(f"{n} {statistics.median(got[n]):.0f}" for n in names)
            print(f"{s.name:>12}: after/before {ratio('after', 'before')}; A/A after/after-again "
                  f"{ratio('after', 'after-again')}; served/offline medians: {eff}; "
                  f"infer/s medians: {rates}", flush=True)  # fmt: skip
    finally:
        offline.close()
        for w in workers.values():
            w.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--window-ms", type=int, default=1500)
    parser.add_argument("--compare-tree", help="another checkout's root: measure after/before")
    parser.add_argument("--settings", help="comma-separated setting names (default: all)")
    parser.add_argument("--ratio", help="A/B: two settings alternating on one worker")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http",
                        help="perf_analyzer's protocol (gRPC is Model Analyzer's default)")
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    PROTOCOL[0] = args.protocol
    tmp = Path(tempfile.mkdtemp(prefix="serving-eff-"))
    if args.ratio:
        try:
            return ratio_run(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    settings = [s for s in SETTINGS if not args.settings or s.name in args.settings.split(",")]
    if args.compare_tree:
        make_repository(tmp / "repo", settings)
        try:
            return compare(args, settings, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    make_repository(tmp / "repo", settings)
    worker = start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus)
    offline = Offline()
    results = {}
    try:
        for s in settings:
            _, warm_batch, _ = served(worker, s, 1000, tmp / "warm.csv")  # warm-up
            batch = max(1, round(warm_batch))  # offline runs the batch the worker executes
            offline.measure(batch, 2.0)
            ratios, busy, detail = [], [], []
            spreads: list[tuple[int, int]] = []
            for i in range(args.pairs):
                # A B, then B A: drift of the machine's speed cancels out in the median
                if i % 2:
                    limit = offline.measure(batch, args.window_ms / 1000 * 3)
                    throughput, executed, b = served(worker, s, args.window_ms, tmp / "p.csv",
                                                     spreads)  # fmt: skip
                else:
                    throughput, executed, b = served(worker, s, args.window_ms, tmp / "p.csv",
                                                     spreads)  # fmt: skip
                    limit = offline.measure(batch, args.window_ms / 1000 * 3)
                ratios.append(throughput / limit)
                busy.append(b)
                detail.append(f"{throughput:.0f}/{limit:.0f} ({batch_text(executed, spreads[-1])})")
            results[s.name] = (statistics.median(ratios), min(ratios), max(ratios))
            print(f"{s.name:>12}: served/offline median {results[s.name][0]:.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f}); instance busy fraction "
                  f"median {statistics.median(busy):.3f}; pairs served/offline: "
                  + ", ".join(detail), flush=True)  # fmt: skip
    finally:
        offline.close()
        worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = max(results, key=lambda k: results[k][0])
    print(f"serving efficiency (best setting {best}): {results[best][0]:.3f} "
          f"(min {results[best][1]:.3f}, max {results[best][2]:.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
