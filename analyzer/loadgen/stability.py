"""The statistics of the stopping rules (measure.py): perf_analyzer's test that the last windows
agree within the stability band, and the adaptive rule's batch-means confidence intervals and
drift test on one growing window; Student's t quantile for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analyzer.loadgen.records import Records


@dataclass
class Window:
    t0: int
    t1: int
    records: Records
    stats0: dict
    stats1: dict

    @property
    def seconds(self) -> float:
        return (self.t1 - self.t0) / 1e9


def merge(windows: list[Window]) -> Window:
    """Consecutive windows as one."""
    return Window(
        windows[0].t0,
        windows[-1].t1,
        Records.concat([w.records for w in windows]),
        windows[0].stats0,
        windows[-1].stats1,
    )


def latency_statistic(latency_ns: np.ndarray, percentile: int | None) -> float:
    """The latency a point is stabilised on: the asked percentile, else the mean."""
    return float(np.percentile(latency_ns, percentile)) if percentile else float(latency_ns.mean())


def windows_ci(windows: list[Window], percentile: int | None) -> tuple[float | None, float | None]:
    """95% CI half-widths (% of the mean) of throughput and latency over the kept windows:
    the point's window-to-window variation, in the adaptive rule's terms."""
    kept = windows[-3:]
    if len(kept) < 2:
        return None, None
    thr = np.array([np.count_nonzero(w.records.ok) / w.seconds for w in kept], dtype=float)
    lats = [w.records.latency_ns() for w in kept]
    lat = np.array([latency_statistic(x, percentile) for x in lats if x.size], dtype=float)

    def half_width(series: np.ndarray) -> float | None:
        if series.size < 2 or series.mean() <= 0:
            return None
        spread = series.std(ddof=1) / math.sqrt(series.size) / series.mean()
        return 100.0 * t95(series.size - 1) * spread

    return half_width(thr), half_width(lat)


def windows_stable(windows: list[Window], stability_pct: float, percentile: int | None) -> bool:
    """perf_analyzer's rule: every window's throughput and latency within +-stability_pct % of
    their average over `windows`."""
    band = stability_pct / 100.0
    throughputs = [int(np.count_nonzero(w.records.ok)) / w.seconds for w in windows]
    latencies = []
    for w in windows:
        lat = w.records.latency_ns()
        if lat.size == 0:
            return False
        latencies.append(latency_statistic(lat, percentile))
    for series in (throughputs, latencies):
        mean = sum(series) / len(series)
        if mean <= 0 or any(abs(x - mean) > band * mean for x in series):
            return False
    return True


def ci_verdict(
    recs: Records, t0: int, t1: int, stability_pct: float
) -> tuple[str, tuple[float | None, float | None]]:
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
    band = stability_pct / 200.0  # half the band
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
