"""The embedded load generator against a real `model-analyzer serve` process, both protocols."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from serving import EXAMPLES, ROOT, start_worker

from analyzer.loadgen.control import ServerError
from analyzer.loadgen.inputs import InputError, ModelIO, TensorSpec, make_requests, parse_shapes
from analyzer.loadgen.measure import MeasureSettings
from analyzer.loadgen.output import CSV_LATENCY_COLUMNS
from analyzer.loadgen.perf import PerfOptions, parse_range, run_perf
from analyzer.loadgen.records import Records
from analyzer.loadgen.server_stats import stats_delta

# short, but the same code paths as the defaults
QUICK = MeasureSettings(warmup_ms=100, min_window_ms=500, window_ms=1000, max_trials=6)


def address(worker, protocol: str) -> str:
    return worker.grpc if protocol == "grpc" else worker.http


def measure(worker, protocol: str, **kwargs) -> list:
    kwargs.setdefault("settings", QUICK)
    kwargs.setdefault("url", address(worker, protocol))
    options = PerfOptions(protocol=protocol, **kwargs)
    return list(run_perf(options))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrency_mode_matches_server_statistics(examples_worker, protocol):
    points = measure(examples_worker, protocol, model="add_sub", concurrency=[1, 4])
    assert [p.value for p in points] == [1, 4]
    for p in points:
        assert p.error_count == 0 and p.request_count > 20
        assert p.throughput == pytest.approx(p.request_count / p.duration_s)
        assert 0 < p.p50_us <= p.p90_us <= p.p95_us <= p.p99_us
        # the server counted the same requests over the same window (boundary requests aside)
        assert p.server is not None
        assert abs(p.server.success_count - p.request_count) <= max(8, 0.03 * p.request_count)
        assert p.server.compute_infer_us > 0
        assert p.server.request_us < p.latency_avg_us  # the client sees the server's time and more
        assert p.client_processes == 1 and 0 < p.client_cpu_pct < 100
        assert p.monitors["gpu"].available is False or p.monitors["gpu"].gpus
    # 4 outstanding requests on one python instance wait for it: they queue longer than one
    # alone, or the dynamic batcher runs them together (a timing alone flaked under CI load)
    busy = points[1].server
    assert busy.queue_us > points[0].server.queue_us or busy.execution_count < busy.success_count


@pytest.mark.parametrize(
    ("protocol", "distribution", "rate"), [("http", "constant", 200), ("grpc", "poisson", 300)]
)
def test_request_rate_mode_achieves_the_asked_rate(examples_worker, protocol, distribution, rate):
    settings = MeasureSettings(mode="time_windows", window_ms=2000, stability_pct=50, max_trials=4)
    (point,) = measure(
        examples_worker, protocol, model="add_sub", request_rates=[rate],
        distribution=distribution, settings=settings,
    )  # fmt: skip
    assert point.mode == "request_rate" and point.error_count == 0
    assert point.sent_rate == pytest.approx(rate, rel=0.05)
    assert point.throughput == pytest.approx(rate, rel=0.05)
    assert not any("keep up" in w for w in point.warnings), point.warnings


def test_time_and_count_windows_follow_perf_analyzer_rules(examples_worker):
    settings = MeasureSettings(mode="count_windows", request_count=100, stability_pct=50)
    (point,) = measure(examples_worker, "http", model="add_sub", concurrency=[2], settings=settings)
    assert point.windows >= 3 and point.request_count >= 3 * 100 * 0.9
    settings = MeasureSettings(mode="time_windows", window_ms=400, stability_pct=50, max_trials=5)
    (point,) = measure(examples_worker, "http", model="add_sub", concurrency=[2], settings=settings)
    assert 3 <= point.windows <= 5
    assert point.duration_s == pytest.approx(3 * 0.4, rel=0.25)
    # the window-to-window variation, as a 95% CI half-width like the adaptive rule's
    assert point.ci_throughput_pct is not None and 0 <= point.ci_throughput_pct < 1000
    assert point.ci_latency_pct is not None


def test_torchscript_batch_and_several_client_processes(examples_worker):
    (point,) = measure(
        examples_worker, "http", model="tiny_cnn", concurrency=[4], batch_size=4,
        client_processes=2,
    )  # fmt: skip
    assert point.client_processes == 2
    assert point.batch_size == 4
    assert point.throughput == pytest.approx(4 * point.request_count / point.duration_s)
    assert point.server.inference_count == pytest.approx(4 * point.server.success_count)


def test_monitors_sample_the_worker_tree(examples_worker):
    (point,) = measure(
        examples_worker, "http", model="add_sub", concurrency=[2],
        server_pid=examples_worker.process.pid, monitor_interval_s=0.05,
    )  # fmt: skip
    cpu = point.monitors["cpu"]
    assert cpu.available and cpu.samples >= 5
    assert cpu.rss_max_mb > 50  # python + numpy in the worker
    assert cpu.processes >= 2  # the worker and add_sub's python-backend stub
    assert cpu.cpu_pct > 5


def test_saturated_client_is_flagged(examples_worker):
    settings = MeasureSettings(warmup_ms=100, min_window_ms=500, saturation=0.0,
                               window_ms=500, max_trials=4)  # unsteady neighbours: 2 s, not 50
    (point,) = measure(
        examples_worker, "http", model="add_sub", concurrency=[1], settings=settings,
        client_processes=1,
    )  # fmt: skip
    assert point.client_saturated
    assert any("load generator used" in w for w in point.warnings)


def _core_busy_s(core: str) -> float:
    """Seconds CPU `core` has run processes, or been taken by the hypervisor, since boot
    (/proc/stat's user, nice, system and steal; not interrupts, which a client's own
    loopback traffic makes)."""
    with open("/proc/stat") as f:
        fields = next(line for line in f if line.startswith(f"cpu{core} ")).split()[1:]
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def _others_share(core: str, run) -> tuple[object, float]:
    """`run()`'s result, and the share of its wall time that processes other than its own
    children kept `core` busy: what the "alone" leg needs to be ~0 to mean anything."""
    import resource

    def children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    busy, own, start = _core_busy_s(core), children(), time.monotonic()
    result = run()
    wall = time.monotonic() - start
    others = _core_busy_s(core) - busy - (children() - own)
    return result, max(others, 0.0) / wall


def _perf_csv(url: str, tmp_path, core: str, name: str) -> tuple[dict, str]:
    """Run `perf` at c=2 pinned to `core`; its one CSV row and its stdout."""
    out = tmp_path / f"{name}.csv"
    run = subprocess.run(
        ["taskset", "-c", core, sys.executable, "-m", "analyzer", "perf", "-m", "add_sub",
         "-u", url, "--concurrency-range", "2", "--client-processes", "1", "-f", str(out),
         "--min-window-ms", "1000", "--warmup-ms", "200", "-p", "500", "-r", "4",
         "--verbose-csv"],
        capture_output=True, text=True, cwd=ROOT, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    with out.open() as f:
        (row,) = list(csv.DictReader(f))
    return row, run.stdout


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
    or not os.path.exists("/proc/self/schedstat"),
    reason="needs two CPUs to pin client and server apart, and Linux schedstat",
)  # fmt: skip
@pytest.mark.exclusive_cpu  # its first leg needs the client's core to itself
def test_client_starved_of_cpu_is_flagged_client_bound(tmp_path):
    """A client whose core is shared with busy processes is flagged client-bound in the CSV and
    the console; the same client with the core to itself is not."""
    client_core, server_core = (str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    worker = start_worker(EXAMPLES, cpus=server_core)
    try:
        # the lock holds other tests back, not what runs beside pytest (`make test`'s mypy, a
        # docker build under a fixture's setup): a leg whose core others used is not "alone",
        # and is run again, for up to a minute
        end = time.monotonic() + 60
        while True:
            (row, stdout), others = _others_share(
                client_core, lambda: _perf_csv(worker.http, tmp_path, client_core, "alone"))
            if row["Client Bound"] == "false" or others < 0.05 or time.monotonic() > end:
                break
            time.sleep(2)
        assert row["Client Bound"] == "false", (f"others used {others:.0%} of the core", row)
        assert "CLIENT-BOUND" not in stdout and "client-bound" not in stdout
        assert float(row["Effective Concurrency"]) > 1.8
        hogs = [
            subprocess.Popen(["taskset", "-c", client_core, sys.executable, "-c", "while 1: pass"])
            for _ in range(3)
        ]
        try:
            row, stdout = _perf_csv(worker.http, tmp_path, client_core, "starved")
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    finally:
        worker.stop()
    assert row["Client Bound"] == "true", row
    assert float(row["Client CPU Wait"]) > 10
    assert "CLIENT-BOUND" in stdout and "client-bound" in stdout
    assert "starved by other processes" in stdout


def test_in_flight_and_turnaround_from_client_timestamps():
    # two slots, each: 100 ns in flight, then 20 ns before its next request; one rate-mode row
    start = np.array([0, 120, 240, 0, 120, 240, 50])
    records = Records(
        start=start, end=start + 100, send=np.zeros(7, np.int64), recv=np.zeros(7, np.int64),
        sched=np.zeros(7, np.int64), ok=np.ones(7, bool), slot=np.array([0, 0, 0, 7, 7, 7, -1]),
    )  # fmt: skip
    assert records.turnaround_ns(0, 400) == pytest.approx(20)
    # Little's law: 7 requests of 100 ns ended in [0, 400): 700 / 400
    assert records.in_flight(0, 400) == pytest.approx(700 / 400)
    assert Records(slot=np.array([-1]), start=np.array([0]), end=np.array([5])).turnaround_ns(
        0, 10
    ) is None
    # socket to socket: a response read 30 ns before its coroutine ended, the next request
    # written 15 ns after its coroutine started: 30 + 20 + 15 ns between the two on the wire
    wire = Records(
        start=start, end=start + 100, send=np.full(7, 15), recv=np.full(7, 30),
        sched=np.zeros(7, np.int64), ok=np.ones(7, bool), slot=records.slot,
    )  # fmt: skip
    assert wire.turnaround_ns(0, 400) == pytest.approx(65)


def test_a_window_counts_requests_by_their_end_like_perf_analyzer():
    # a closed loop of 4 slots, each request 100 ns: at t0=250 four requests are in flight.
    # perf_analyzer's ValidLatencyMeasurement keeps every request that ends inside the window;
    # requiring the start inside too would read 12 instead of 16 per 400 ns (the bias was c/N)
    start = np.repeat(np.arange(0, 1000, 100), 4)
    n = start.size
    records = Records(
        start=start, end=start + 100, send=np.zeros(n, np.int64), recv=np.zeros(n, np.int64),
        sched=np.zeros(n, np.int64), ok=np.ones(n, bool), slot=np.tile(np.arange(4), n // 4),
    )  # fmt: skip
    window = records.ended_in(250, 650)
    assert len(window) == 16
    assert window.in_flight(250, 650) == pytest.approx(4.0)


def test_input_data_file(examples_worker, tmp_path):
    data = {"data": [{"INPUT0": [1, 2, 3, 4], "INPUT1": {"content": [1, 1, 1, 1], "shape": [4]}}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    (point,) = measure(
        examples_worker, "grpc", model="add_sub", concurrency=[1], input_data=str(path)
    )
    assert point.error_count == 0 and point.request_count > 0


def test_unreachable_server_and_unknown_model_are_one_sentence_errors(examples_worker):
    with pytest.raises(ServerError, match="cannot reach the server at 127.0.0.1:1"):
        measure(examples_worker, "http", model="add_sub", concurrency=[1], url="127.0.0.1:1")
    with pytest.raises(ServerError, match="nope"):
        measure(examples_worker, "grpc", model="nope", concurrency=[1])


def test_perf_cli_writes_perf_analyzer_csv(examples_worker, tmp_path):
    out = tmp_path / "perf.csv"
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "add_sub", "-u", examples_worker.http,
         "--concurrency-range", "1:3:2", "-f", str(out), "--min-window-ms", "500",
         "--warmup-ms", "100", "--verbose-csv",
         "-p", "1000", "-r", "3"],  # a point gives up after 3 s: busy neighbours, not its subject
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Request concurrency: 1" in run.stdout and "Request concurrency: 3" in run.stdout
    assert "Inferences/Second vs. Client Average Batch Latency" in run.stdout
    with out.open() as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0])
    assert header[:2] == ["Concurrency", "Inferences/Second"]
    assert header[2 : 2 + len(CSV_LATENCY_COLUMNS)] == list(CSV_LATENCY_COLUMNS)
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 3]
    throughputs = [float(r["Inferences/Second"]) for r in rows]
    assert throughputs == sorted(throughputs)  # perf_analyzer orders rows by throughput


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency-range", "4:1"], "--concurrency-range '4:1' must be start[:end[:step]]"),
        (["--concurrency-range", "1", "--request-rate-range", "5"], "not both"),
        (["-u", "127.0.0.1:1"], "cannot reach the server at 127.0.0.1:1"),
        (["--shape", "INPUT0"], "--shape 'INPUT0' must be NAME:d1,d2"),
        (["-b", "9"], "-b 9 exceeds model 'add_sub' max_batch_size 8"),
    ],
)
def test_perf_cli_bad_input(examples_worker, args, message):
    argv = [sys.executable, "-m", "analyzer", "perf", "-m", "add_sub", "-u", examples_worker.http]
    run = subprocess.run(argv + args, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode != 0
    assert message in run.stderr
    assert "Traceback" not in run.stderr


# ---- pure parts ---------------------------------------------------------------------------------


def test_ranges_like_perf_analyzer():
    assert parse_range("--concurrency-range", "1:16:5", True) == [1, 6, 11, 16]
    assert parse_range("--concurrency-range", "3", True) == [3]
    assert parse_range("--request-rate-range", "10:20:5", False) == [10.0, 15.0, 20.0]


def test_requests_from_shapes_and_json(tmp_path):
    specs = (TensorSpec("X", "FP32", (-1, 3)), TensorSpec("S", "BYTES", (1,)))
    io = ModelIO("m", "1", 8, specs, ())
    with pytest.raises(InputError, match="input 'X' has dynamic shape"):
        make_requests(io)
    requests = make_requests(io, batch_size=2, shapes=parse_shapes(["X:5,3"]))
    assert requests[0]["X"].shape == (2, 5, 3) and requests[0]["S"].shape == (2, 1)
    assert make_requests(io, input_data="zero", shapes={"X": (1, 3)})[0]["X"].sum() == 0
    # a shape no request could carry is named, not allocated (it was a 65 TiB MemoryError)
    with pytest.raises(InputError, match=r"input 'X' of model 'm' makes one request "
                       r"1,000\.0 GiB \(shape \[\d+, 3\], batch 1\), more than the 2 GiB"):
        make_requests(io, shapes={"X": (1000 * (1 << 30) // 12, 3)})
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"data": [{"X": [1, 2, 3, 4, 5, 6], "S": ["a"]},
                                         {"X": [0, 0, 0], "S": ["b"]}]}))  # fmt: skip
    steps = make_requests(io, batch_size=1, input_data=str(path))
    assert steps[0]["X"].shape == (1, 2, 3) and steps[1]["X"].shape == (1, 1, 3)
    assert steps[1]["S"].ravel()[0] == b"b"
    path.write_text(json.dumps({"data": [{"X": [1, 2, 3]}]}))
    with pytest.raises(InputError, match="input 'S' is missing"):
        make_requests(io, input_data=str(path))
    path.write_text(json.dumps({"data": [{"X": [1, 2], "S": ["a"]}]}))
    with pytest.raises(InputError, match="input 'X' has 2 values, which do not fill"):
        make_requests(io, input_data=str(path))


def test_stats_delta_picks_the_version_that_served():
    def entry(version, count, ns):
        stat = {"count": count, "ns": ns}
        names = ("success", "queue", "compute_input", "compute_infer", "compute_output")
        return {"name": "m", "version": version, "inference_count": count,
                "execution_count": count // 2,
                "inference_stats": {name: dict(stat) for name in names}}  # fmt: skip

    before = {"model_stats": [entry("1", 10, 1000), entry("2", 0, 0)]}
    after = {"model_stats": [entry("1", 10, 1000), entry("2", 100, 2_000_000)]}
    delta = stats_delta(before, after, "m")
    assert delta.success_count == 100 and delta.execution_count == 50
    assert delta.queue_us == pytest.approx(20.0) and delta.avg_batch == 2.0
    assert stats_delta(after, after, "m") is None
    assert np.isclose(delta.overhead_us, 0.0)
