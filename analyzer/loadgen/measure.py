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

The data (MeasureSettings, PerfPoint, MeasurementError) is defined in point.py and the rules'
statistics in stability.py; the three classes are importable from here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from analyzer.loadgen.client import Drained, LoadClient
from analyzer.loadgen.control import ControlClient
from analyzer.loadgen.point import MeasurementError, MeasureSettings, PerfPoint
from analyzer.loadgen.records import Records
from analyzer.loadgen.server_stats import stats_delta, with_composing
from analyzer.loadgen.stability import Window, ci_verdict, merge, windows_ci, windows_stable
from analyzer.monitor.base import Sampler

__all__ = ["MeasureSettings", "MeasurementError", "Measurer", "PerfPoint"]


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
        composing: list[str] | None = None,
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
        self.composing = composing or []  # an ensemble's step models: their stats too

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
        stats = self.control.model_stats(every_model=bool(self.composing))
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
        elif self.settings.mode == "fixed":
            window, windows, stable, ci = self._fixed()
        else:
            window, windows, stable, ci = self._perf_analyzer_windows()
        point = self._point(mode, value, window, windows, stable, ci, time.monotonic() - started)
        return point

    # ---- perf_analyzer's rule ----------------------------------------------------------------
    def _perf_analyzer_windows(self) -> tuple[Window, int, bool, tuple[float, float]]:
        s = self.settings
        windows: list[Window] = []
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
            windows.append(Window(t0, t1, recs, stats0, stats1))
            if len(windows) >= 3 and windows_stable(windows[-3:], s.stability_pct, s.percentile):
                return merge(windows[-3:]), len(windows), True, windows_ci(windows, s.percentile)
        return merge(windows[-3:]), len(windows), False, windows_ci(windows, s.percentile)

    # ---- one fixed window -----------------------------------------------------------------------
    def _fixed(self) -> tuple[Window, int, bool, tuple[float | None, float | None]]:
        """A warm-up, then one window of window_ms, with no stopping rule: the final
        comparison's rounds, whose spread across rounds is the interval. Stable by definition;
        the window's own CIs are still reported."""
        s = self.settings
        self._run_for(s.warmup_ms / 1000.0)
        t0, stats0 = self._stats()
        self._run_for(s.window_ms / 1000.0)
        t1, stats1 = self._stats()
        recs = self._records().ended_in(t0, t1)
        _, ci = ci_verdict(recs, t0, t1, s.stability_pct)
        return Window(t0, t1, recs, stats0, stats1), 1, True, ci

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
            verdict, ci = ci_verdict(recs, t0, t1, s.stability_pct)
            if elapsed_ms >= s.min_window_ms and verdict == "stable":
                return Window(t0, t1, recs, stats0, stats1), checks, True, ci
            if (t1 - t_load) / 1e6 >= s.max_time_ms:
                return Window(t0, t1, recs, stats0, stats1), checks, False, ci
            if mode == "request_rate" and elapsed_ms >= s.min_window_ms:
                done = int(np.count_nonzero(recs.ok)) / ((t1 - t0) / 1e9)
                if done < 0.9 * value and verdict == "drift":
                    # an open-loop queue that only grows: the server cannot keep up, and waiting
                    # longer just measures a longer queue
                    return Window(t0, t1, recs, stats0, stats1), checks, False, ci
            if verdict == "drift" and elapsed_ms >= 2 * s.min_window_ms:
                # a transient (warm-up, a neighbour's burst): drop the older half of the window
                middle = (t0 + t1) // 2
                snapshots = [snap for snap in snapshots if snap[0] >= middle] or snapshots[-1:]

    # ---- the point ------------------------------------------------------------------------------
    def _point(self, mode, value, window: Window, windows, stable, ci, wall_s) -> PerfPoint:
        errors = dict(self._errors)
        requests = self._request_figures(mode, value, window, errors)
        server = (
            with_composing(stats_delta(window.stats0, window.stats1, self.model, self.version),
                           window.stats0, window.stats1, self.composing)
            if self.use_stats
            else None
        )  # fmt: skip
        point = PerfPoint(
            mode=mode,
            value=value,
            batch_size=self.batch_size,
            error_count=sum(errors.values()),
            server=server,
            duration_s=window.seconds,
            wall_s=wall_s,
            windows=windows,
            stable=stable,
            ci_throughput_pct=ci[0],
            ci_latency_pct=ci[1],
            errors=errors,
            **requests,
            **self._client_figures(mode, value, window),
        )
        point.monitors = {
            name: sampler.summary(window.t0, window.t1) for name, sampler in self.samplers.items()
        }
        self._warn(point)
        return point

    def _request_figures(
        self, mode: str, value: float, window: Window, errors: dict[str, int]
    ) -> dict[str, Any]:
        """The PerfPoint fields of the window's successful requests: throughput, latency and its
        percentiles, the client's send and receive times. None succeeded: MeasurementError."""
        recs = window.records
        ok = recs.ok
        n_ok = int(np.count_nonzero(ok))
        if n_ok == 0:
            reason = next(iter(errors), "no request finished within the measurement window")
            raise MeasurementError(f"{mode} {value:g}: no successful request ({reason})")
        latency = recs.latency_ns() / 1000.0
        percentile = self.settings.percentile
        return {
            "throughput": n_ok * self.batch_size / window.seconds,
            "request_count": n_ok,
            "latency_avg_us": float(latency.mean()),
            "latency_std_us": float(latency.std()),
            "p50_us": float(np.percentile(latency, 50)),
            "p90_us": float(np.percentile(latency, 90)),
            "p95_us": float(np.percentile(latency, 95)),
            "p99_us": float(np.percentile(latency, 99)),
            "client_send_us": float(recs.send[ok].mean() / 1000.0),
            "client_recv_us": float(recs.recv[ok].mean() / 1000.0),
            "percentile": percentile,
            "percentile_us": float(np.percentile(latency, percentile)) if percentile else None,
        }

    def _client_figures(self, mode: str, value: float, window: Window) -> dict[str, Any]:
        """The PerfPoint fields that say whether the client, not the server, set the point: its
        CPU use, its event loops' time on and waiting for a CPU, the requests it kept in flight."""
        s = self.settings
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
        return {
            "sent_rate": self.client.sent_rate(window.t0, window.t1),
            "client_cpu_pct": 100.0 * busiest,
            "client_processes": len(cpu),
            "client_saturated": busiest >= s.saturation,
            "effective_concurrency": in_flight,
            "client_loop_pct": 100.0 * ran,
            "client_wait_pct": 100.0 * waited,
            "client_turnaround_us": turnaround / 1000.0 if turnaround is not None else None,
            "client_starved": waited > s.max_wait,
            "client_bound": (
                busiest >= s.saturation
                or demand >= s.saturation
                or waited > s.max_wait
                or (mode == "concurrency" and in_flight < s.min_in_flight * value)
            ),
        }

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
