"""Embedded load generator (`model-analyzer perf`) vs NVIDIA perf_analyzer 2.41.0, side by side.

    .venv/bin/python benchmarks/loadgen_vs_perf_analyzer.py
        [--parts agreement,matched,capacity,matrix,client,wire] [--pairs 3] [--concurrency 1,4,16]
        [--protocol http]

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

(d) matrix (issue 19): add_sub and tiny_cnn, each with and without the dynamic batcher, at
    --concurrency (default for this part 1,4,16,64), over both protocols; both tools with the same
    three 1.5 s windows, alternating; per cell the medians ours/perf_analyzer of throughput, p50 and
    p99, perf_analyzer's own A/A (its run against its run of the neighbouring pair), and next to
    them for each tool the server's mean executed batch (statistics deltas around the run) and
    the requests it held in flight (Little's law over its own CSV: throughput x mean latency)
    and those inside the server (throughput x the server's mean time per request, statistics),
    and the worker's CPU per request (its process tree, psutil, over the run).
    Target: +-10% in throughput and p50 on every cell.
(e) client: the client's CPU per completed request, each tool at concurrency 16 on the trivial
    add_mul model, CPU of the client's whole process tree (psutil) and completions from the server's
    statistics over the same 8 s of steady load; capacity on one core = requests per client
    CPU-second. Ours/perf_analyzer per protocol, alternating, with an A/A. Target >= 1.0 on gRPC.
(f) wire: the matrix's batcher cells (and add_sub without it, for contrast) at --concurrency
    (default 4,16,64), each run captured by tcpdump on the loopback (pinned to the worker's core,
    so that neither client is disturbed; `apt-get install tcpdump`, root): the requests in flight
    as the wire saw them, and each client's time per cycle outside the wire,
    (c - in flight) / answers per second (benchmarks/wire.py). Ours also reports it itself
    (its "Client Turnaround" column, socket to socket). This is where the two tools differ when
    the matrix's batcher cells disagree.

On CPU the worker is pinned to core 1 and both load generators to core 0
(../shared/BENCHMARKING.md);
on a machine with more cores the worker gets the upper half and the clients the lower half.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))
from serving import EXAMPLES, start_worker  # noqa: E402
from wire import Capture  # noqa: E402

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


# ---- (d) the issue-19 matrix -----------------------------------------------------------------
MATRIX_MODELS = ("add_sub", "add_sub_dyn", "tiny_cnn", "tiny_cnn_dyn")


def matrix_repository(root: Path) -> Path:
    """The two examples, each with and without `dynamic_batching { }`."""
    for name in ("add_sub", "tiny_cnn"):
        source = EXAMPLES / name
        text = (source / "config.pbtxt").read_text().replace("dynamic_batching { }\n", "")
        for variant, batched in ((name, False), (f"{name}_dyn", True)):
            folder = root / variant
            shutil.copytree(source, folder)
            config = text.replace(f'name: "{name}"', f'name: "{variant}"')
            (folder / "config.pbtxt").write_text(config + ("dynamic_batching { }\n" if batched
                                                           else ""))  # fmt: skip
    return root


def server_counts(http: str, model: str) -> tuple[int, int, int, int]:
    """(inference count, execution count, requests, their summed ns in the server) of a model,
    from the worker's statistics."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    success = stats["inference_stats"]["success"]
    return (int(stats["inference_count"]), int(stats["execution_count"]), int(success["count"]),
            int(success["ns"]))  # fmt: skip


def in_flight(row: dict) -> float:
    """Little's law over a tool's own CSV row: completions per second x mean latency."""
    return float(row["Inferences/Second"]) * float(row["Avg latency"]) / 1e6


def matrix_run(tool: str, worker, protocol: str, model: str, level: int, tmp: Path):
    """(CSV row, server batch, requests inside the server, the worker's CPU µs per request)."""
    import psutil

    address = worker.grpc if protocol == "grpc" else worker.http
    args = ["-m", model, "-u", address, "-i", protocol, "--concurrency-range", str(level),
            *MATCHED, "--verbose-csv"]  # fmt: skip
    if tool == "ours":
        args += ["--measurement-mode", "time_windows"]
    served = psutil.Process(worker.process.pid)
    for _ in range(3):  # perf_analyzer exits without a result now and then
        before, cpu0 = server_counts(worker.http, model), tree_cpu(served)
        row, _, text = run_tool(tool, args, tmp / f"m-{tool}.csv")
        after, cpu1 = server_counts(worker.http, model), tree_cpu(served)
        if row:
            executions, requests = after[1] - before[1], after[2] - before[2]
            batch = (after[0] - before[0]) / executions if executions else 0.0
            # Little's law inside the server: completions/s x mean time a request spent there
            server_time = (after[3] - before[3]) / requests / 1e9 if requests else 0.0
            worker_us = 1e6 * (cpu1 - cpu0) / requests if requests else 0.0
            return row, batch, float(row["Inferences/Second"]) * server_time, worker_us
    print(f"    {tool} gave no result: {text.strip().splitlines()[-1:]}", flush=True)
    return None, 0.0, 0.0, 0.0


def matrix(
    worker, protocols: list[str], levels: list[int], pairs: int, tmp: Path,
    models: tuple[str, ...] = MATRIX_MODELS,
) -> None:
    print(f"(d) matrix: worker on CPU {SERVER_CPU}, clients on CPU {CLIENT_CPU}, both tools with "
          f"3 x 1.5 s windows, {pairs} alternating pairs per cell", flush=True)  # fmt: skip
    print("  cell | throughput ours/pa | p50 ours/pa | p99 ours/pa | pa A/A throughput | "
          "server batch ours, pa | in flight ours, pa (ours' own timestamps) | "
          "inside the server ours, pa | worker CPU us per request ours, pa", flush=True)
    for model in MATRIX_MODELS:
        run_tool("ours", ["-m", model, "-u", worker.http, "--concurrency-range", "4", *MATCHED,
                          "--measurement-mode", "time_windows"], tmp / "warm.csv")  # fmt: skip
    outside = 0
    for protocol in protocols:
        for model in models:
            for level in levels:
                thr, p50, p99, aa, own = [], [], [], [], []
                batch: dict[str, list[float]] = {}
                flight: dict[str, list[float]] = {}
                served: dict[str, list[float]] = {}
                worker_cpu: dict[str, list[float]] = {}
                last_pa = None
                for i in range(pairs):
                    order = ("perf_analyzer", "ours") if i % 2 == 0 else ("ours", "perf_analyzer")
                    got = {t: matrix_run(t, worker, protocol, model, level, tmp) for t in order}
                    pa, pa_batch, pa_server, pa_cpu = got["perf_analyzer"]
                    ours, ours_batch, ours_server, ours_cpu = got["ours"]
                    if not pa or not ours:
                        continue
                    t_pa = float(pa["Inferences/Second"])
                    thr.append(float(ours["Inferences/Second"]) / t_pa)
                    p50.append(float(ours["p50 latency"]) / float(pa["p50 latency"]))
                    p99.append(float(ours["p99 latency"]) / float(pa["p99 latency"]))
                    if last_pa:
                        aa.append(t_pa / last_pa)
                    last_pa = t_pa
                    batch.setdefault("ours", []).append(ours_batch)
                    batch.setdefault("pa", []).append(pa_batch)
                    flight.setdefault("ours", []).append(in_flight(ours))
                    flight.setdefault("pa", []).append(in_flight(pa))
                    served.setdefault("ours", []).append(ours_server)
                    served.setdefault("pa", []).append(pa_server)
                    worker_cpu.setdefault("ours", []).append(ours_cpu)
                    worker_cpu.setdefault("pa", []).append(pa_cpu)
                    if ours.get("Effective Concurrency"):
                        own.append(float(ours["Effective Concurrency"]))
                if not thr:
                    print(f"  {protocol} {model} c={level}: no result", flush=True)
                    continue
                agree = all(0.9 <= statistics.median(v) <= 1.1 for v in (thr, p50))
                outside += not agree
                mid = statistics.median
                print(f"  {protocol} {model} c={level} | {med(thr)} | {med(p50)} | {med(p99)} | "
                      f"{med(aa)} | {mid(batch['ours']):.2f}, {mid(batch['pa']):.2f} | "
                      f"{mid(flight['ours']):.2f}, {mid(flight['pa']):.2f}"
                      f"{f' ({mid(own):.2f})' if own else ''} | "
                      f"{mid(served['ours']):.2f}, {mid(served['pa']):.2f} | "
                      f"{mid(worker_cpu['ours']):.0f}, {mid(worker_cpu['pa']):.0f}"
                      f"{'' if agree else ' | OUTSIDE +-10%'}", flush=True)  # fmt: skip
    print(f"  cells outside +-10% (throughput or p50 median): {outside}", flush=True)


# ---- (f) requests in flight on the wire ---------------------------------------------------------
WIRE_MODELS = ("add_sub_dyn", "tiny_cnn_dyn", "add_sub")


def wire(worker, protocols: list[str], levels: list[int], pairs: int, tmp: Path) -> None:
    if not shutil.which("tcpdump"):
        print("(f) wire needs tcpdump (apt-get install tcpdump) and root: skipped", flush=True)
        return
    print(f"(f) wire: tcpdump on CPU {SERVER_CPU} (the worker's), clients on CPU {CLIENT_CPU}, "
          f"3 x 1.5 s windows, {pairs} alternating pairs; medians", flush=True)  # fmt: skip
    print("  cell | infer/s ours, pa | server batch ours, pa | in flight on the wire ours, pa | "
          "client us per cycle ours, pa | ours' own Client Turnaround us", flush=True)
    mid = statistics.median
    for protocol in protocols:
        port = int((worker.grpc if protocol == "grpc" else worker.http).rsplit(":", 1)[1])
        for model in WIRE_MODELS:
            for level in levels:
                got: dict[str, dict[str, list[float]]] = {"ours": {}, "perf_analyzer": {}}
                for i in range(pairs):
                    order = ("perf_analyzer", "ours") if i % 2 == 0 else ("ours", "perf_analyzer")
                    for tool in order:
                        with Capture(port, tmp / "wire.pcap", SERVER_CPU) as capture:
                            row, batch, *_ = matrix_run(tool, worker, protocol, model, level, tmp)
                        if not row:
                            continue
                        seen = capture.flight(protocol, level)
                        if seen is None:
                            print(f"    {tool}: tcpdump dropped {capture.dropped} packets; run "
                                  "left out", flush=True)  # fmt: skip
                            continue
                        into = got[tool]
                        into.setdefault("thr", []).append(float(row["Inferences/Second"]))
                        into.setdefault("batch", []).append(batch)
                        into.setdefault("flight", []).append(seen.in_flight)
                        into.setdefault("client", []).append(seen.client_us)
                        if row.get("Client Turnaround"):
                            into.setdefault("turn", []).append(float(row["Client Turnaround"]))
                ours, pa = got["ours"], got["perf_analyzer"]
                if not ours.get("thr") or not pa.get("thr"):
                    print(f"  {protocol} {model} c={level}: no result", flush=True)
                    continue
                print(f"  {protocol} {model} c={level}"
                      f" | {mid(ours['thr']):.0f}, {mid(pa['thr']):.0f}"
                      f" | {mid(ours['batch']):.2f}, {mid(pa['batch']):.2f}"
                      f" | {mid(ours['flight']):.2f}, {mid(pa['flight']):.2f}"
                      f" | {mid(ours['client']):.0f}, {mid(pa['client']):.0f}"
                      f" | {mid(ours['turn']) if ours.get('turn') else float('nan'):.0f}",
                      flush=True)  # fmt: skip


# ---- (e) client CPU per request -----------------------------------------------------------------
now = time.monotonic


def tree_cpu(process) -> float:
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except Exception:  # noqa: BLE001 - a child that just ended
            pass
    return total


def client_cost(tool: str, worker, protocol: str, level: int, seconds: float = 8.0):
    """(requests/s completed, client CPU-seconds per second) over `seconds` of steady load."""
    import psutil

    address = worker.grpc if protocol == "grpc" else worker.http
    long_window = ["-p", "30000", "-r", "1"]
    if tool == "perf_analyzer":
        cmd = [str(PERF_ANALYZER), "-m", "add_mul", "-u", address, "-i", protocol,
               "--concurrency-range", str(level), *long_window, "-s", "1000"]  # fmt: skip
    else:
        cmd = [*OURS, "-m", "add_mul", "-u", address, "-i", protocol, "--concurrency-range",
               str(level), *long_window, "--measurement-mode", "time_windows",
               "--client-processes", "1"]  # fmt: skip
    proc = subprocess.Popen(["taskset", "-c", CLIENT_CPU, *cmd], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        process = psutil.Process(proc.pid)
        time.sleep(4)  # start-up and warm-up
        cpu0, done0, t0 = tree_cpu(process), server_counts(worker.http, "add_mul")[2], now()
        time.sleep(seconds)
        cpu1, done1, t1 = tree_cpu(process), server_counts(worker.http, "add_mul")[2], now()
    finally:
        proc.kill()
        proc.wait()
    return (done1 - done0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)


def client(worker, protocols: list[str], pairs: int, level: int = 16) -> None:
    print(f"(e) client CPU per request: add_mul, concurrency {level}, client on CPU {CLIENT_CPU}",
          flush=True)  # fmt: skip
    for protocol in protocols:
        ratios, aa, detail, last = [], [], [], {}
        for i in range(pairs):
            order = ("perf_analyzer", "ours") if i % 2 == 0 else ("ours", "perf_analyzer")
            per_cpu = {}
            for tool in order:
                rate, cpu = client_cost(tool, worker, protocol, level)
                per_cpu[tool] = rate / cpu if cpu else 0.0
                detail.append(f"{tool} {rate:.0f}/s at {cpu * 100:.0f}% of a core = "
                              f"{cpu / rate * 1e6 if rate else 0:.1f} us/request")  # fmt: skip
            ratios.append(per_cpu["ours"] / per_cpu["perf_analyzer"])
            if last:
                aa.append(per_cpu["perf_analyzer"] / last["perf_analyzer"])
            last = per_cpu
        print(f"  {protocol}: requests per client CPU-second ours/perf_analyzer {med(ratios)}; "
              f"perf_analyzer A/A {med(aa)}", flush=True)  # fmt: skip
        for line in detail:
            print(f"    {line}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="agreement,capacity",
                        help="agreement, matched (agreement with equal windows), capacity, "
                             "matrix (issue 19), client (client CPU per request), wire (requests "
                             "in flight seen on the loopback)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--concurrency", default="",
                        help="levels (default 1,4,16; 1,4,16,64 for the matrix)")
    parser.add_argument("--models", default=",".join(MATRIX_MODELS),
                        help="the matrix's models (a subset, to look again at some cells)")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc", "both"),
                        help="both: matrix and client run each protocol")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        print(f"perf_analyzer is not installed at {PERF_ANALYZER} (make venv installs it)")
        return 1
    parts = set(args.parts.split(","))
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    port = "grpc" if args.protocol == "grpc" else "http"
    if args.protocol == "both" and parts & {"agreement", "matched", "capacity"}:
        print("--protocol both is for the matrix, wire and client parts")
        return 2
    try:
        if parts & {"agreement", "matched"}:
            worker = start_worker(EXAMPLES, "--model-control-mode", "explicit", "--load-model",
                                  "tiny_cnn", cpus=SERVER_CPU)  # fmt: skip
            try:
                address = getattr(worker, port)
                levels = [int(c) for c in (args.concurrency or "1,4,16").split(",")]
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
        if "matrix" in parts:
            worker = start_worker(matrix_repository(tmp / "matrix"), cpus=SERVER_CPU)
            try:
                levels = [int(c) for c in (args.concurrency or "1,4,16,64").split(",")]
                matrix(worker, protocols, levels, args.pairs, tmp, tuple(args.models.split(",")))
            finally:
                worker.stop()
        if "wire" in parts:
            worker = start_worker(matrix_repository(tmp / "wire"), cpus=SERVER_CPU)
            try:
                levels = [int(c) for c in (args.concurrency or "4,16,64").split(",")]
                wire(worker, protocols, levels, args.pairs, tmp)
            finally:
                worker.stop()
        if "client" in parts:
            worker = start_worker(trivial_repository(tmp / "client"), cpus=SERVER_CPU)
            try:
                client(worker, protocols, args.pairs)
            finally:
                worker.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
