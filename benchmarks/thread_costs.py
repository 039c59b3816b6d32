"""Where a served sample's CPU goes, thread by thread, beside the offline limit of its minutes.

    .venv/bin/python benchmarks/thread_costs.py [--settings b1_pref8,b1_dynamic0] [--protocol grpc]
                                                [--seconds 6] [--rounds 2]

serving_efficiency.py says how far served throughput is from offline torch; this says why. One
worker serves tiny_cnn in each of serving_efficiency's settings (the same repository, placement
and perf_analyzer load). While the load runs, the worker's threads are read from /proc over
`--seconds` of steady load: run time from `schedstat` (ns), the user/system split from `stat`,
context switches from `status`; the model's statistics give requests, samples, executions and
the model call's wall time. Then offline torch runs the executed batch on the same core.

Reported per round: infer/s; the event loop's CPU per request (user, system); the instance
thread's CPU per sample and, of it, the model call's wall time per sample; other threads; the
offline time per sample; the core's use; and each thread's switches per execution. The budget
line says how many µs per sample the whole worker may spend for served/offline to reach 0.85.

`--perf` also samples the worker's process and then the offline loop's with Linux `perf record`
(the cpu-clock event, which needs no hardware counters; perf itself runs on the client's cores)
and splits each sample's time by shared object: the model's kernels (oneDNN's generated code
shows as `[JIT]`), libtorch, Python, libc, the kernel. Worker minus offline, library by library,
is where the served sample's extra time goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
import serving_efficiency  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import start_worker  # noqa: E402
from serving_efficiency import (  # noqa: E402
    SETTINGS,
    Offline,
    Setting,
    load_command,
    make_repository,
    served,
    stats,
)

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
PERF_HZ = 1000


@dataclass
class ThreadSample:
    run_ns: int  # schedstat: time on a CPU
    user_ns: float  # stat: utime, in clock ticks (coarse; only the split is read from it)
    system_ns: float
    voluntary: int
    involuntary: int


def read_threads(pid: int) -> dict[int, ThreadSample]:
    """Every thread of `pid` that is still alive while it is read."""
    out: dict[int, ThreadSample] = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{entry}"
        try:
            with open(f"{base}/schedstat") as f:
                run_ns = int(f.read().split()[0])
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{base}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read
        out[int(entry)] = ThreadSample(
            run_ns,
            int(fields[11]) * TICK_NS,  # utime is field 14; fields[0] is field 3
            int(fields[12]) * TICK_NS,
            int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"]),
        )
    return out


@dataclass
class Round:
    infer_s: float
    batch: float
    loop_us: float  # per request
    loop_user_us: float
    loop_system_us: float
    instance_us: float  # per sample
    call_us: float  # the model call's wall time, per sample
    others_us: float  # per sample
    offline_us: float  # per sample, at the executed batch
    core_use: float  # the worker's CPU time over the elapsed time
    loop_switches: float  # per execution
    instance_switches: tuple[float, float]  # voluntary, involuntary per execution


def perf_record(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """`perf record` of one process (all its threads) for `seconds`, on the client's cores."""
    cmd = ["taskset", "-c", PLACEMENT.client_cpus, "perf", "record", "-q", "-B", "-e", "cpu-clock",
           "-F", str(PERF_HZ), "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_finish(record: subprocess.Popen) -> None:
    _, err = record.communicate(timeout=60)
    if record.returncode != 0:
        raise RuntimeError(f"perf record failed: {err.strip()}")


def by_library(data: Path) -> dict[str, int]:
    """Samples per shared object in a `perf record` file."""
    run = subprocess.run(["perf", "report", "-i", str(data), "-n", "--sort", "dso", "--stdio"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    counts: dict[str, int] = {}
    for line in run.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or line.startswith("#") or not parts[0].endswith("%"):
            continue
        name = parts[2].strip()
        if name.startswith("[JIT]"):  # code generated at run time: oneDNN's kernels here
            name = "[JIT] (generated kernels)"
        counts[name] = counts.get(name, 0) + int(parts[1])
    return counts


def measure(worker, setting: Setting, seconds: float, offline: Offline, tmp: Path,
            profile: bool = False) -> Round:  # fmt: skip
    """One steady stretch of load, read at both ends, then the offline limit right after."""
    model = f"tiny_cnn_{setting.name}"
    window_ms = int((seconds + 4) * 1000)  # perf_analyzer outlives the stretch we read
    cmd = load_command(worker, setting, window_ms, tmp / "load.csv")
    load = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # connections up, the batcher in its steady pattern
        pid = worker.process.pid
        t0, s0, a = time.perf_counter(), stats(worker.http, model), read_threads(pid)
        if profile:
            perf_finish(perf_record(pid, seconds, tmp / "worker.perf"))
        else:
            time.sleep(seconds)
        t1, s1, b = time.perf_counter(), stats(worker.http, model), read_threads(pid)
        if load.poll() is not None:
            raise RuntimeError(f"perf_analyzer ended early: {load.stderr.read()}")
    finally:
        load.terminate()
        load.wait(10)
    elapsed = t1 - t0
    samples = s1[0] - s0[0]
    executions = max(s1[1] - s0[1], 1)
    requests = samples / setting.client_batch
    batch = samples / executions
    # compute_infer is charged to every request of a batch: per execution it is ns / requests
    call_ns = (s1[2] - s0[2]) / max(requests, 1) / batch
    common = [t for t in a if t in b]
    delta = {t: b[t].run_ns - a[t].run_ns for t in common}
    loop = pid  # the worker's event loop runs on its main thread
    others = [t for t in common if t != loop]
    instance = max(others, key=lambda t: delta[t])  # one instance: the busiest other thread
    rest_ns = sum(delta[t] for t in others if t != instance)

    def split(t: int) -> tuple[float, float]:
        user = b[t].user_ns - a[t].user_ns
        system = b[t].system_ns - a[t].system_ns
        share = delta[t] / max(user + system, 1)  # the ticks' split, scaled to schedstat's
        return user * share, system * share

    loop_user, loop_system = split(loop)
    if profile:
        record = perf_record(offline.proc.pid, seconds / 2 + 1.5, tmp / "offline.perf")
        time.sleep(0.5)  # perf attached before the offline loop starts
        limit = offline.measure(max(1, round(batch)), seconds / 2)
        perf_finish(record)
        per_sample_ns = sum(delta.values()) / max(samples, 1)
        libraries(by_library(tmp / "worker.perf"), per_sample_ns / 1e3,
                  by_library(tmp / "offline.perf"), 1e6 / limit)  # fmt: skip
    else:
        limit = offline.measure(max(1, round(batch)), seconds / 2)
    per_request = 1e-3 / max(requests, 1)
    per_sample = 1e-3 / max(samples, 1)
    return Round(
        infer_s=samples / elapsed,
        batch=batch,
        loop_us=delta[loop] * per_request,
        loop_user_us=loop_user * per_request,
        loop_system_us=loop_system * per_request,
        instance_us=delta[instance] * per_sample,
        call_us=call_ns / 1e3,
        others_us=rest_ns * per_sample,
        offline_us=1e6 / limit,
        core_use=sum(delta.values()) / 1e9 / elapsed,
        loop_switches=(b[loop].voluntary + b[loop].involuntary
                       - a[loop].voluntary - a[loop].involuntary) / executions,  # fmt: skip
        instance_switches=((b[instance].voluntary - a[instance].voluntary) / executions,
                           (b[instance].involuntary - a[instance].involuntary) / executions),
    )  # fmt: skip


def libraries(worker: dict[str, int], worker_us: float, offline: dict[str, int],
              offline_us: float) -> None:  # fmt: skip
    """µs per sample by shared object: each side's total per sample (the worker's threads'
    CPU time over the samples served, offline's rate) split by its own perf samples' shares."""
    worker_total = max(sum(worker.values()), 1)
    offline_total = max(sum(offline.values()), 1)
    rows = []
    for name in set(worker) | set(offline):
        ours = worker.get(name, 0) / worker_total * worker_us
        theirs = offline.get(name, 0) / offline_total * offline_us
        rows.append((name, ours, theirs))
    rows.sort(key=lambda row: -max(row[1], row[2]))
    shown = [row for row in rows if max(row[1], row[2]) >= 1.0]
    rest = [row for row in rows if max(row[1], row[2]) < 1.0]
    if rest:
        shown.append(("others", sum(r[1] for r in rest), sum(r[2] for r in rest)))
    print("  µs per sample by library: worker / offline (difference)")
    for name, ours, theirs in shown:
        print(f"    {name:<40} {ours:7.1f} / {theirs:7.1f} ({ours - theirs:+.1f})")
    ours, theirs = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"    {'total':<40} {ours:7.1f} / {theirs:7.1f} ({ours - theirs:+.1f})", flush=True)


def report(setting: Setting, i: int, r: Round) -> None:
    total = r.loop_us / setting.client_batch + r.instance_us + r.others_us
    print(f"{setting.name} round {i}: {r.infer_s:,.0f} infer/s at batch {r.batch:.1f}, core use "
          f"{r.core_use:.2f}; event loop {r.loop_us:.1f} µs/request ({r.loop_user_us:.1f} user, "
          f"{r.loop_system_us:.1f} system); instance thread {r.instance_us:.1f} µs/sample, its "
          f"model call {r.call_us:.1f}; other threads {r.others_us:.1f} µs/sample; worker "
          f"{total:.1f} µs/sample against offline {r.offline_us:.1f} (served/offline "
          f"{r.offline_us / total:.3f} if the core were all ours; 0.85 needs <= "
          f"{r.offline_us / 0.85:.1f}); switches per execution: loop {r.loop_switches:.2f}, "
          f"instance {r.instance_switches[0]:.2f} voluntary + {r.instance_switches[1]:.2f} "
          f"involuntary", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="b1_pref8",
                        help="comma-separated names from serving_efficiency.py")  # fmt: skip
    parser.add_argument("--protocol", choices=("http", "grpc"), default="grpc")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--perf", action="store_true",
                        help="split each sample's time by library with `perf record`")  # fmt: skip
    parser.add_argument("--tree", help="run the worker of another checkout (e.g. a worktree)")
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    serving_efficiency.PROTOCOL[0] = args.protocol  # the warm-up's protocol too
    by_name = {s.name: s for s in SETTINGS}
    unknown = [n for n in args.settings.split(",") if n not in by_name]
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; known: {', '.join(by_name)}")
    settings = [by_name[n] for n in args.settings.split(",")]
    if args.perf and not shutil.which("perf"):
        raise SystemExit("--perf: no `perf` on PATH (Debian: apt-get install linux-perf)")
    if any(s.instances != 1 for s in settings):
        raise SystemExit("--settings: one instance per setting (the busiest thread is read as it)")
    tmp = Path(tempfile.mkdtemp(prefix="thread-costs-"))
    make_repository(tmp / "repo", settings)
    tree = Path(args.tree).resolve() if args.tree else None
    worker = start_worker(tmp / "repo", cpus=PLACEMENT.server_cpus, source_tree=tree)
    offline = Offline()
    try:
        for s in settings:
            served(worker, s, 1000, tmp / "warm.csv")
        ratios: dict[str, list[float]] = {s.name: [] for s in settings}
        for i in range(args.rounds):
            for s in settings:
                r = measure(worker, s, args.seconds, offline, tmp, args.perf)
                report(s, i + 1, r)
                ratios[s.name].append(r.offline_us / (r.loop_us / s.client_batch + r.instance_us
                                                      + r.others_us))  # fmt: skip
        for name, values in ratios.items():
            print(f"{name}: offline / worker CPU per sample, median "
                  f"{statistics.median(values):.3f}")
    finally:
        offline.close()
        worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
