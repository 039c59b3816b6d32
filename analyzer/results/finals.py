"""The final comparison: the search's top configs and the default, re-measured side by side.

A search measures each point once, minutes apart, on machines whose speed drifts by more than the
differences between the top configs; a ranking read off those points is decided by noise. After
the search the finalists are measured again, each at the load of its best point, in interleaved
rounds whose order changes from round to round, and the ranking and the numbers shown come from
those rounds only.

Intervals are Student-t 95% intervals over the rounds: of the mean for throughput and p99, and,
for comparisons, of the mean per-round difference of the ranking score (for a throughput
objective, the log of the throughput ratio), paired by round so that drift between rounds cancels.
A config whose interval of the difference to the leader contains zero is tied with it within
noise; among the tied the recommendation takes the cheapest: fewest instances, then least memory,
then the smallest max batch size.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analyzer.loadgen.stability import t95
from analyzer.results.measurement import Measurement

METHOD = "Student t, 95%, over rounds (comparisons paired by round)"


@dataclass
class Interval:
    estimate: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


def mean_interval(values: list[float]) -> Interval:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean)
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half)


def ratio_interval(a: list[float], b: list[float]) -> Interval:
    """a/b from rounds paired by index, over the rounds both ran (a finalist that left the race
    ran fewer than the default): the geometric mean ratio and its interval."""
    logs = [math.log(max(x, 1e-12) / max(y, 1e-12)) for x, y in zip(a, b, strict=False)]
    d = mean_interval(logs)
    return Interval(math.exp(d.estimate), math.exp(d.low), math.exp(d.high))


def combine(rounds: list[Measurement]) -> Measurement:
    """One measurement from the rounds of a config: every metric is the mean over the rounds that
    have it (a monitor may have had no sample in one short round: that round says nothing of
    memory, it does not make the config's memory unknown)."""
    first = rounds[0]
    tags = set.union(*(set(m.metrics) for m in rounds))
    metrics = {t: statistics.fmean(m.metrics[t] for m in rounds if t in m.metrics)
               for t in sorted(tags)}  # fmt: skip
    warnings = sorted({w for m in rounds for w in m.warnings})
    errors: dict[str, int] = {}
    for m in rounds:
        for message, count in m.errors.items():
            errors[message] = errors.get(message, 0) + count
    gpus = max((m.gpus for m in rounds), key=len)
    return Measurement(
        model=first.model, config_name=first.config_name, load=first.load, value=first.value,
        batch_size=first.batch_size, metrics=metrics, gpus=gpus,
        stable=all(m.stable for m in rounds),
        client_saturated=any(m.client_saturated for m in rounds),
        client_bound=any(m.client_bound for m in rounds), warnings=warnings, errors=errors,
        wall_s=sum(m.wall_s for m in rounds), taken_at=rounds[-1].taken_at, host=first.host,
    )  # fmt: skip


def round_order(names: list[str], index: int) -> list[str]:
    """Round `index`'s order: rotated by one every round, reversed every other round, so that no
    config is always measured first, or always right after the same neighbour."""
    shift = index % len(names) if names else 0
    order = names[shift:] + names[:shift]
    return order[::-1] if index % 2 else order


@dataclass
class FinalResult:
    """What the rounds say of one finalist."""

    rounds: list[Measurement]
    combined: Measurement  # the mean of the rounds: what ranking and tables read
    throughput: Interval
    p99: Interval
    vs_leader: Interval | None = None  # paired score difference to the leader
    tied: bool = False  # within noise of the leader (the leader itself too)
    left_race: bool = False  # shown behind the leader of its round beyond noise, it stopped

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": len(self.rounds),
            "left_race": self.left_race,
            "perf_throughput": self.throughput.to_dict(),
            "perf_latency_p99": self.p99.to_dict(),
            "score_vs_leader": self.vs_leader.to_dict() if self.vs_leader else None,
            "tied_with_leader": self.tied,
            "measurements": [m.to_dict() for m in self.rounds],
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FinalResult:
        final = summarize([Measurement.from_dict(m) for m in data["measurements"]])
        final.tied = bool(data["tied_with_leader"])
        final.left_race = bool(data.get("left_race", False))
        vs = data.get("score_vs_leader")
        final.vs_leader = Interval(**vs) if vs else None
        return final


def summarize(rounds: list[Measurement]) -> FinalResult:
    return FinalResult(
        rounds=rounds,
        combined=combine(rounds),
        throughput=mean_interval([m.metrics["perf_throughput"] for m in rounds]),
        p99=mean_interval([m.metrics["perf_latency_p99"] for m in rounds]),
    )


def paired_difference(rounds: list[Measurement], base: list[Measurement],
                      score: Callable[[Measurement], float]) -> Interval:  # fmt: skip
    """The interval of the mean per-round score difference rounds - base, paired by round over
    the rounds both ran (a finalist that left the race ran fewer)."""
    return mean_interval([score(m) - score(b) for m, b in zip(rounds, base, strict=False)])


def behind_text(difference: Interval) -> str:
    """A negative log-score difference as "X% (95% CI a-b%)" behind."""
    def pct(x: float) -> str:
        return f"{100 * -math.expm1(x):.1f}"

    return f"{pct(difference.estimate)}% (95% CI {pct(difference.high)}-{pct(difference.low)}%)"


CLOSE_MARGIN = 0.02  # a lead smaller than this is "beyond noise" but no reason to prefer a config


def mark_ties(
    finals: dict[str, FinalResult], leader: str, score: Callable[[Measurement], float]
) -> list[str]:
    """Sets vs_leader/tied on every finalist; returns the names tied with the leader (leader
    first): those whose interval of the difference contains zero. Paired by round (round i of
    each config was measured minutes apart at most), over the rounds both ran (a finalist that
    left the race ran fewer)."""
    tied = [leader]
    finals[leader].tied = True
    for name, final in finals.items():
        if name == leader:
            continue
        final.vs_leader = paired_difference(final.rounds, finals[leader].rounds, score)
        final.tied = final.vs_leader.low <= 0.0 <= final.vs_leader.high
        if final.tied:
            tied.append(name)
    return tied


MEMORY_TOLERANCE = 0.10  # memory readings closer than this (relative) are the same cost


def memory_of(m: Measurement) -> float | None:
    """The point's memory: GPU memory where a GPU was read, else host RAM; None when neither
    was read (no sample fell in its windows)."""
    memory = m.metric("gpu_used_memory")
    if memory is None:
        memory = m.metric("cpu_used_ram")
    return None if memory is None else float(memory)


def cheaper(a: tuple[dict[str, Any], Measurement], b: tuple[dict[str, Any], Measurement]) -> str:
    """Why config a (description, point) costs less than b, or "" when it does not: fewer
    instances; else less memory by more than MEMORY_TOLERANCE (a few MB of RSS is noise, not a
    saving; a config whose memory was not read is never "less"); else a smaller max batch
    size. Not the queue delay: tried as a last criterion, it chose max_queue_delay 200 us over
    its tied leader at 1000 us in 4 of 10 brute runs on tiny_cnn, which every one-config-at-a-time
    reference put 4-5% behind (BENCHMARKS.md, "Winner stability ... 20-round races")."""
    (da, ma), (db, mb) = a, b
    ia, ib = int(da.get("instance_count") or 0), int(db.get("instance_count") or 0)
    if ia != ib:
        return f"fewer instances ({ia} vs {ib})" if ia < ib else ""
    mem_a, mem_b = memory_of(ma), memory_of(mb)
    if mem_a is not None and mem_b is not None \
            and abs(mem_a - mem_b) > MEMORY_TOLERANCE * max(mem_a, mem_b):  # fmt: skip
        return f"less memory ({mem_a:.0f} vs {mem_b:.0f} MB)" if mem_a < mem_b else ""
    sa, sb = int(da.get("max_batch_size") or 0), int(db.get("max_batch_size") or 0)
    if sa < sb:
        return f"a smaller max batch size ({sa} vs {sb})"
    return ""


def cheapest(tied: list[tuple[str, dict[str, Any], Measurement]]) -> tuple[str, str]:
    """The name of the cheapest of the tied configs (leader first) and why it beats the leader
    ("" when it is the leader): a config replaces the one chosen so far only when it is cheaper
    by `cheaper`'s rule, so a tie in cost keeps the leader, the best mean."""
    name, desc, point = tied[0]
    why = ""
    for other, other_desc, other_point in tied[1:]:
        reason = cheaper((other_desc, other_point), (desc, point))
        if reason:
            name, desc, point, why = other, other_desc, other_point, reason
    return name, why


RESOLUTION = 0.05  # the throughput difference the rounds should resolve: 5%
MIN_ROUNDS, MAX_ROUNDS = 3, 10  # what a calibration may ask for
# how far rounds go on while a finalist is still tied with the leader, within the budget: on
# tiny_cnn brute force's ten rounds (5-10% of its search) left a config 5.4% behind tied, and
# recommended it in 2 of 10 runs; twice the rounds shrink the paired interval by 1.4x
RACE_MAX_ROUNDS = 20
BUDGET = 0.25  # the comparison may cost at most this share of the search's measuring time


@dataclass
class Calibration:
    """An A/A run of the default config before the search: how far one config's round-sized
    windows move from one to the next on this machine, now."""

    throughputs: list[float]  # infer/s of each window, in order
    noise_pct: float  # standard deviation of log throughput, in % (a CV)
    rounds: int  # rounds it asks for (rounds_for_noise)
    window_s: float  # mean wall time of one window: what one finalist's round will cost
    window_ms: int = 0  # its windows, sized like the rounds' (round_window_ms) at its throughput

    def to_dict(self) -> dict[str, Any]:
        return {"throughputs": [round(t, 2) for t in self.throughputs],
                "noise_pct": round(self.noise_pct, 2), "rounds": self.rounds,
                "window_s": round(self.window_s, 3), "window_ms": self.window_ms}  # fmt: skip

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Calibration:
        return Calibration(list(data["throughputs"]), float(data["noise_pct"]),
                           int(data["rounds"]), float(data["window_s"]),
                           int(data.get("window_ms", 0)))  # fmt: skip


def calibrate(windows: list[Measurement], window_ms: int = 0) -> Calibration:
    throughputs = [m.metrics["perf_throughput"] for m in windows]
    logs = [math.log(max(t, 1e-12)) for t in throughputs]
    noise = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return Calibration(throughputs, 100.0 * noise, rounds_for_noise(noise),
                       statistics.fmean(m.wall_s for m in windows), window_ms)  # fmt: skip


def rounds_for_noise(noise: float) -> int:
    """The fewest rounds whose 95% interval of a paired difference between two configs is within
    RESOLUTION, when each config's rounds vary by `noise` (log scale) independently: the
    difference then varies by sqrt(2) x noise. Between MIN_ROUNDS and MAX_ROUNDS."""
    for n in range(MIN_ROUNDS, MAX_ROUNDS + 1):
        if t95(n - 1) * math.sqrt(2.0) * noise / math.sqrt(n) <= RESOLUTION:
            return n
    return MAX_ROUNDS


@dataclass
class Comparison:
    """The final comparison of one model, as the summary and the results file report it."""

    rounds: int
    finalists: list[str]
    points: int = 0  # measurements the rounds took
    seconds: float = 0.0
    search_points: int = 0
    search_seconds: float = 0.0
    leader: str = ""  # best score over the rounds
    recommended: str = ""  # the cheapest of those tied with the leader
    tied: list[str] = field(default_factory=list)
    why: str = ""  # one sentence when the recommendation is not the leader
    vs_default: Interval | None = None  # throughput ratio recommended/default, paired
    dropped: dict[str, str] = field(default_factory=dict)  # finalists that failed in the rounds
    calibration: Calibration | None = None  # set the number of rounds (--final-rounds unset)
    rounds_note: str = ""  # how the number of rounds was chosen, one clause
    # per finalist, what its load check in the first round found (one clause); `moved`: the
    # finalists whose rounds run one load level above the search's best point
    load_checks: dict[str, str] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)
    # finalists that left the race: shown behind the leader beyond noise (one clause each)
    eliminated: dict[str, str] = field(default_factory=dict)
    pool_note: str = ""  # why finalists beyond the search's top joined, one clause
    # with no tie: the nearest finalist's lead, when under CLOSE_MARGIN (one clause), else ""
    close_lead: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": METHOD, "rounds": self.rounds, "finalists": self.finalists,
            "points": self.points, "seconds": round(self.seconds, 2),
            "search_points": self.search_points, "search_seconds": round(self.search_seconds, 2),
            "leader": self.leader, "recommended": self.recommended, "tied": self.tied,
            "why": self.why,
            "throughput_vs_default": self.vs_default.to_dict() if self.vs_default else None,
            "dropped": self.dropped,
            "calibration": self.calibration.to_dict() if self.calibration else None,
            "rounds_note": self.rounds_note, "load_checks": self.load_checks, "moved": self.moved,
            "eliminated": self.eliminated, "pool_note": self.pool_note,
            "close_lead": self.close_lead,
        }  # fmt: skip

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Comparison:
        skip = ("method", "throughput_vs_default", "calibration")
        fields = {k: v for k, v in data.items() if k not in skip}
        vs = data.get("throughput_vs_default")
        aa = data.get("calibration")
        return Comparison(**fields, vs_default=Interval(**vs) if vs else None,
                          calibration=Calibration.from_dict(aa) if aa else None)  # fmt: skip
