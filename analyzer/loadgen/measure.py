"""Turn a running load into one trustworthy measurement point.

Three ways to decide that a point is measured:

- `time_windows` / `count_windows`: perf_analyzer's rule. Consecutive windows (fixed length, or
  until N requests finished); stable when the last 3 windows' throughput and latency all lie within
  +-stability% of their average; at most max_trials windows. Only requests that started and ended
  inside a window count, as in perf_analyzer.
- `adaptive` (the default, beyond perf_analyzer): one growing window after a short warm-up, cut into
  equal sub-windows whose throughput and mean latency are treated as batch means. The point is
  done as soon as the 95% confidence interval of both lies within half the stability band
  (+-stability/2 %) and the window's two halves agree within the same band (no drift). That takes
  about a second on a steady server instead of perf_analyzer's 3 x 5 s windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.loadgen.client import Drained, LoadClient
from analyzer.loadgen.control import ControlClient
from analyzer.loadgen.records import Records
from analyzer.loadgen.server_stats import ServerBreakdown, stats_delta
from analyzer.monitor.base import Sampler


@dataclass
class MeasureSettings:
    mode: str = "adaptive"
    window_ms: int = 5000  # perf_analyzer's -p / --measurement-interval
    request_count: int = 50  # --measurement-request-count (count_windows)
    stability_pct: float = 10.0  # -s
    max_trials: int = 10  # -r
    percentile: int | None = None  # --percentile: stabilise and report on this latency
    warmup_ms: int = 250  # adaptive: load runs this long before the window opens
    min_window_ms: int = 1000  # adaptive: shortest window that may be declared stable
    check_ms: int = 250  # adaptive: how often the stopping rule is evaluated
    tick_ms: int = 50  # how often shards are drained
    saturation: float = 0.9  # client CPU share of one core above which it is the bottleneck
    min_in_flight: float = 0.9  # effective concurrency below this share of the asked: client-bound
    max_wait: float = 0.1  # client loop waiting for a CPU longer than this share: client-bound

    @property
    def max_time_ms(self) -> int:
        return self.window_ms * self.max_trials


@dataclass
class PerfPoint:
    """One measured load level: what perf_analyzer reports, plus how much to trust it."""

    mode: str  # concurrency | request_rate
    value: float  # the concurrency or the asked request rate
    batch_size: int
    throughput: float  # inferences/s (requests/s x batch size)
    request_count: int
    error_count: int
    latency_avg_us: float
    latency_std_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    client_send_us: float
    client_recv_us: float
    server: ServerBreakdown | None
    duration_s: float  # length of the window the figures come from
    wall_s: float  # time the point cost, warm-up and unstable windows included
    windows: int
    stable: bool
    sent_rate: float  # requests/s the client sent in the window
    client_cpu_pct: float  # busiest client process, % of one core
    client_processes: int
    client_saturated: bool  # the busiest client process used >= `saturation` of a core
    # mean requests in flight by the client's own clock (Little's law over the window)
    effective_concurrency: float = 0.0
    client_loop_pct: float = 0.0  # the busiest client event loop's time on a CPU, %
    client_wait_pct: float = 0.0  # the same loop's time runnable but waiting for a CPU, %
    client_turnaround_us: float | None = None  # response -> next send on a slot (concurrency)
    client_starved: bool = False  # its loop waited for a CPU more than `max_wait` of the window
    client_bound: bool = False  # saturated, starved of CPU, or < 90% of the asked concurrency
    percentile: int | None = None
    percentile_us: float | None = None
    ci_throughput_pct: float | None = None  # adaptive: 95% CI half-width, % of the mean
    ci_latency_pct: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    monitors: dict[str, Any] = field(default_factory=dict)

    @property
    def more_clients_help(self) -> bool:
        """Client-bound by its own work (not only by a neighbour's): another process can take
        some of it. A client that is only starved would compete with itself for the same CPU."""
        return self.client_saturated or (self.client_bound and not self.client_starved)

    @property
    def stability_latency_us(self) -> float:
        return self.percentile_us if self.percentile_us is not None else self.latency_avg_us

    @property
    def network_us(self) -> float:
        """perf_analyzer's "Network+Server Send/Recv": what the server breakdown leaves over."""
        s = self.server
        inside = 0.0
        if s is not None:
            inside = s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us
        return max(0.0, self.latency_avg_us - self.client_send_us - self.client_recv_us - inside)


class MeasurementError(RuntimeError):
    """The load could not produce a single successful request; the message says why."""


@dataclass
class _Window:
    t0: int
    t1: int
    records: Records
    stats0: dict
    stats1: dict

    @property
    def seconds(self) -> float:
        return (self.t1 - self.t0) / 1e9


class Measurer:
    """Measures points on one model with one LoadClient; the client's shards are reused."""

    def __init__(
        self,
        client: LoadClient,
        control: ControlClient,
        model: str,
        version: str = "",
        batch_size: int = 1,
        settings: MeasureSettings | None = None,
        samplers: dict[str, Sampler] | None = None,
        use_stats: bool = True,
    ) -> None:
        self.client = client
        self.control = control
        self.model = model
        self.version = version
        self.batch_size = batch_size
        self.settings = settings or MeasureSettings()
        self.samplers = samplers or {}
        self.use_stats = use_stats
        self._parts: list[Records] = []
        self._errors: dict[str, int] = {}
        self._waited_before = 0

    # ---- plumbing -----------------------------------------------------------------------------
    def _take(self, drained: Drained) -> None:
        if len(drained.records):
            self._parts.append(drained.records)
        for message, count in drained.errors.items():
            self._errors[message] = self._errors.get(message, 0) + count

    def _run_for(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Drain the shards every tick for `seconds` (or until `until()` holds)."""
        tick = self.settings.tick_ms / 1000.0
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (until is not None and until()):
                break
            time.sleep(min(tick, left))
            self._take(self.client.drain())

    def _stats(self) -> tuple[int, dict]:
        if not self.use_stats:
            return time.monotonic_ns(), {}
        t_a = time.monotonic_ns()
        stats = self.control.model_stats()
        t_b = time.monotonic_ns()
        return (t_a + t_b) // 2, stats

    def _records(self) -> Records:
        if len(self._parts) > 1:
            self._parts = [Records.concat(self._parts)]
        return self._parts[0] if self._parts else Records()

    # ---- entry --------------------------------------------------------------------------------
    def measure(self, mode: str, value: float, distribution: str = "constant") -> PerfPoint:
        started = time.monotonic()
        self._parts, self._errors = [], {}
        self._waited_before = sum(shard.waited_for_slot for shard in self.client.shards)
        if mode == "concurrency":
            self._take(self.client.set_concurrency(int(value)))
        else:
            self._take(self.client.set_rate(float(value), distribution))
        self._parts = []  # records of the previous load level are not this point's
        if self.settings.mode == "adaptive":
            window, windows, stable, ci = self._adaptive(mode, value)
        else:
            window, windows, stable, ci = self._perf_analyzer_windows()
        point = self._point(mode, value, window, windows, stable, ci, time.monotonic() - started)
        return point

    # ---- perf_analyzer's rule ----------------------------------------------------------------
    def _perf_analyzer_windows(self) -> tuple[_Window, int, bool, tuple[float, float]]:
        s = self.settings
        windows: list[_Window] = []
        for _ in range(s.max_trials):
            t0, stats0 = self._stats()
            mark = len(self._records())
            if s.mode == "count_windows":

                def enough(mark=mark, t0=t0) -> bool:
                    recs = self._records()
                    return int(np.count_nonzero(recs.end[mark:] >= t0)) >= s.request_count

                self._run_for(s.max_time_ms / 1000.0, until=enough)
            else:
                self._run_for(s.window_ms / 1000.0)
            t1, stats1 = self._stats()
            recs = self._records().ended_in(t0, t1)
            windows.append(_Window(t0, t1, recs, stats0, stats1))
            if len(windows) >= 3 and self._windows_stable(windows[-3:]):
                return self._merge(windows[-3:]), len(windows), True, self._windows_ci(windows)
        return self._merge(windows[-3:]), len(windows), False, self._windows_ci(windows)

    def _windows_ci(self, windows: list[_Window]) -> tuple[float | None, float | None]:
        """95% CI half-widths (% of the mean) of throughput and latency over the kept windows:
        the point's window-to-window variation, in the adaptive rule's terms."""
        kept = windows[-3:]
        if len(kept) < 2:
            return None, None
        thr = np.array([np.count_nonzero(w.records.ok) / w.seconds for w in kept], dtype=float)
        lats = [w.records.latency_ns() for w in kept]
        lat = np.array([self._latency_statistic(x) for x in lats if x.size], dtype=float)

        def half_width(series: np.ndarray) -> float | None:
            if series.size < 2 or series.mean() <= 0:
                return None
            spread = series.std(ddof=1) / math.sqrt(series.size) / series.mean()
            return 100.0 * t95(series.size - 1) * spread

        return half_width(thr), half_width(lat)

    def _windows_stable(self, windows: list[_Window]) -> bool:
        band = self.settings.stability_pct / 100.0
        throughputs = [int(np.count_nonzero(w.records.ok)) / w.seconds for w in windows]
        latencies = []
        for w in windows:
            lat = w.records.latency_ns()
            if lat.size == 0:
                return False
            latencies.append(self._latency_statistic(lat))
        for series in (throughputs, latencies):
            mean = sum(series) / len(series)
            if mean <= 0 or any(abs(x - mean) > band * mean for x in series):
                return False
        return True

    def _latency_statistic(self, latency_ns: np.ndarray) -> float:
        p = self.settings.percentile
        return float(np.percentile(latency_ns, p)) if p else float(latency_ns.mean())

    @staticmethod
    def _merge(windows: list[_Window]) -> _Window:
        return _Window(
            windows[0].t0,
            windows[-1].t1,
            Records.concat([w.records for w in windows]),
            windows[0].stats0,
            windows[-1].stats1,
        )

    # ---- adaptive rule -------------------------------------------------------------------------
    def _adaptive(self, mode: str, value: float):
        s = self.settings
        t_load = time.monotonic_ns()
        self._run_for(s.warmup_ms / 1000.0)
        snapshots = [self._stats()]
        checks = 0
        ci: tuple[float | None, float | None] = (None, None)
        while True:
            self._run_for(s.check_ms / 1000.0)
            snapshots.append(self._stats())
            checks += 1
            t0, stats0 = snapshots[0]
            t1, stats1 = snapshots[-1]
            recs = self._records().ended_in(t0, t1)
            elapsed_ms = (t1 - t0) / 1e6
            verdict, ci = self._ci_verdict(recs, t0, t1)
            if elapsed_ms >= s.min_window_ms and verdict == "stable":
                return _Window(t0, t1, recs, stats0, stats1), checks, True, ci
            if (t1 - t_load) / 1e6 >= s.max_time_ms:
                return _Window(t0, t1, recs, stats0, stats1), checks, False, ci
            if mode == "request_rate" and elapsed_ms >= s.min_window_ms:
                done = int(np.count_nonzero(recs.ok)) / ((t1 - t0) / 1e9)
                if done < 0.9 * value and verdict == "drift":
                    # an open-loop queue that only grows: the server cannot keep up, and waiting
                    # longer just measures a longer queue
                    return _Window(t0, t1, recs, stats0, stats1), checks, False, ci
            if verdict == "drift" and elapsed_ms >= 2 * s.min_window_ms:
                # a transient (warm-up, a neighbour's burst): drop the older half of the window
                middle = (t0 + t1) // 2
                snapshots = [snap for snap in snapshots if snap[0] >= middle] or snapshots[-1:]

    def _ci_verdict(self, recs: Records, t0: int, t1: int):
        """'stable', 'wide' (CI still too wide) or 'drift' (halves differ), and the CIs in %.

        Sub-windows are batch means: long enough (>= 50 ms, ~10 requests) to be nearly
        independent. Drift is a difference between the window's halves that is both larger than
        the band and statistically clear, so noise alone does not keep restarting the window.
        """
        ok = recs.ok
        n = int(np.count_nonzero(ok))
        if n < 20:
            return "wide", (None, None)
        span = t1 - t0
        width = max(50e6, 10 * span / n)
        k = int(span // width)
        if k < 8:
            return "wide", (None, None)
        ends = recs.end[ok]
        latency = (recs.end - recs.start)[ok].astype(np.float64)
        slot = np.minimum(((ends - t0) * k // span).astype(np.int64), k - 1)
        counts = np.bincount(slot, minlength=k).astype(np.float64)
        sums = np.bincount(slot, weights=latency, minlength=k)
        thr = counts / (span / k / 1e9)
        busy = counts > 0  # a stall leaves a sub-window empty: no latency sample there
        lat = sums[busy] / counts[busy]
        if lat.size < 8:
            return "wide", (None, None)
        band = self.settings.stability_pct / 200.0  # half the band
        ci_thr = t95(k - 1) * thr.std(ddof=1) / math.sqrt(k) / thr.mean()
        ci_lat = t95(lat.size - 1) * lat.std(ddof=1) / math.sqrt(lat.size) / lat.mean()
        cis = (100.0 * ci_thr, 100.0 * ci_lat)
        for series in (thr, lat):
            half = series.size // 2
            a, b = series[:half], series[half:]
            diff = abs(a.mean() - b.mean())
            noise = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
            if diff > band * series.mean() and diff > 2.0 * noise:
                return "drift", cis
        if ci_thr <= band and ci_lat <= band:
            return "stable", cis
        return "wide", cis

    # ---- the point ------------------------------------------------------------------------------
    def _point(self, mode, value, window: _Window, windows, stable, ci, wall_s) -> PerfPoint:
        s = self.settings
        recs = window.records
        ok = recs.ok
        n_ok = int(np.count_nonzero(ok))
        errors = dict(self._errors)
        n_err = sum(errors.values())
        if n_ok == 0:
            reason = next(iter(errors), "no request finished within the measurement window")
            raise MeasurementError(f"{mode} {value:g}: no successful request ({reason})")
        latency = recs.latency_ns() / 1000.0
        seconds = window.seconds
        server = (
            stats_delta(window.stats0, window.stats1, self.model, self.version)
            if self.use_stats
            else None
        )
        cpu = self.client.cpu_utilization(window.t0, window.t1)
        busiest = max(cpu) if cpu else 0.0
        # the event loop that wanted a CPU most: ran plus waited for one, a share of the window
        loops = self.client.loop_demand(window.t0, window.t1)
        demand, ran, waited = max(
            ((run + wait, run, wait) for run, wait in loops), default=(0.0, 0.0, 0.0)
        )
        everything = self._records()  # in-flight figures count every request, valid or not
        in_flight = everything.in_flight(window.t0, window.t1)
        turnaround = everything.turnaround_ns(window.t0, window.t1)
        point = PerfPoint(
            mode=mode,
            value=value,
            batch_size=self.batch_size,
            throughput=n_ok * self.batch_size / seconds,
            request_count=n_ok,
            error_count=n_err,
            latency_avg_us=float(latency.mean()),
            latency_std_us=float(latency.std()),
            p50_us=float(np.percentile(latency, 50)),
            p90_us=float(np.percentile(latency, 90)),
            p95_us=float(np.percentile(latency, 95)),
            p99_us=float(np.percentile(latency, 99)),
            client_send_us=float(recs.send[ok].mean() / 1000.0),
            client_recv_us=float(recs.recv[ok].mean() / 1000.0),
            server=server,
            duration_s=seconds,
            wall_s=wall_s,
            windows=windows,
            stable=stable,
            sent_rate=self.client.sent_rate(window.t0, window.t1),
            client_cpu_pct=100.0 * busiest,
            client_processes=len(cpu),
            client_saturated=busiest >= s.saturation,
            effective_concurrency=in_flight,
            client_loop_pct=100.0 * ran,
            client_wait_pct=100.0 * waited,
            client_turnaround_us=turnaround / 1000.0 if turnaround is not None else None,
            client_starved=waited > s.max_wait,
            client_bound=(
                busiest >= s.saturation
                or demand >= s.saturation
                or waited > s.max_wait
                or (mode == "concurrency" and in_flight < s.min_in_flight * value)
            ),
            percentile=s.percentile,
            percentile_us=float(np.percentile(latency, s.percentile)) if s.percentile else None,
            ci_throughput_pct=ci[0],
            ci_latency_pct=ci[1],
            errors=errors,
        )
        point.monitors = {
            name: sampler.summary(window.t0, window.t1) for name, sampler in self.samplers.items()
        }
        self._warn(point)
        return point

    def _warn(self, point: PerfPoint) -> None:
        if point.client_saturated:
            point.warnings.append(
                f"the load generator used {point.client_cpu_pct:.0f}% of a core: it may be the "
                "bottleneck, so this point is not trustworthy (add --client-processes or cores)"
            )
        elif point.client_loop_pct + point.client_wait_pct >= 100.0 * self.settings.saturation:
            point.warnings.append(
                f"the load generator's event loop wanted a whole core (ran "
                f"{point.client_loop_pct:.0f}%, waited {point.client_wait_pct:.0f}% for one): it "
                "is the bottleneck, so this point is not trustworthy (add client processes or "
                "cores)"
            )
        if point.client_starved:
            point.warnings.append(
                f"the load generator waited for a CPU {point.client_wait_pct:.0f}% of the time: "
                "it is starved by other processes (the server among them, when they share "
                "cores), so its timestamps are late and this point is not trustworthy (give the "
                "client cores of its own)"
            )
        if point.mode == "concurrency" and point.effective_concurrency < (
            self.settings.min_in_flight * point.value
        ):
            point.warnings.append(
                f"the load generator kept {point.effective_concurrency:.2f} requests in flight "
                f"on average, not {point.value:g}: the client, not the server, sets this point"
            )
        if point.mode == "request_rate":
            waited = sum(shard.waited_for_slot for shard in self.client.shards)
            if waited > self._waited_before:
                point.warnings.append(
                    f"the server did not keep up with {point.value:g} requests/s: "
                    f"{waited - self._waited_before} requests waited for one of the "
                    "outstanding-request slots to free up"
                )
            elif point.sent_rate < 0.95 * point.value:
                point.warnings.append(
                    f"the client could not keep up with {point.value:g} requests/s: it sent "
                    f"{point.sent_rate:.1f}/s"
                )
            elif point.request_count / point.duration_s < 0.95 * point.value:
                point.warnings.append(
                    f"the server did not keep up with {point.value:g} requests/s: "
                    f"{point.request_count / point.duration_s:.1f}/s completed"
                )
        if not point.stable:
            point.warnings.append(
                f"no stable measurement within {point.windows} "
                + ("checks" if self.settings.mode == "adaptive" else "windows")
                + f" (stability {self.settings.stability_pct:g}%)"
            )
        if point.error_count:
            first = next(iter(point.errors))
            point.warnings.append(f"{point.error_count} requests failed, e.g. {first}")


_T95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021,
    60: 2.000, 120: 1.980,
}


def t95(dof: int) -> float:
    """Two-sided 95% Student t quantile (table, rounded down to the nearest tabulated dof)."""
    if dof > 120:
        return 1.960
    return _T95[max(k for k in _T95 if k <= dof)]
