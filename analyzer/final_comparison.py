"""After a model's search: its top configs and the default measured again, side by side.

The rules and the statistics are in `analyzer.results.finals`; this is the loop that drives the
worker. The finalists stay loaded together in a local worker, so that moving from one to the next
costs a payload switch, not a model load (one at a time on a remote server, which serves a
variant under the model's own name). When memory is ranked on, every measurement needs a fresh
worker (allocators keep freed memory), and the comparison is skipped: the configs keep their
search points.

Each round's measurement goes to the checkpoint (as a `final_round` entry): a rerun measures only
the rounds that are missing.

A search picks each config's load from single noisy points, and a load one level too low costs
more than any config difference (winner stability on tiny_cnn: three quick winners 23% apart, the
gap all in the load). So in the first round each finalist is also measured one load level up,
right after its own point: when that beats it by the sweep's plateau gain and meets the
constraints, the finalist's rounds run there (the first round's point is the check's).

A search's single points rank its configs by noise as much as by merit: on tiny_cnn brute force
placed the true best 4th to 6th, 4-12% below its leader, in 6 of 10 runs. So the finalists are the
search's top `num_configs_per_model`, plus up to as many more whose best point is within the
search's noise band of the leader's (`pool_band`), plus the default. The rounds then race them:
from the third round on, a finalist shown behind the leader beyond noise leaves the rounds, and
rounds go on, within the budget, while a finalist is still tied with the leader: the budget goes
into the configs the rounds cannot yet tell apart (a quiet calibration asks for 3 rounds, but
rounds of different configs vary more than back-to-back windows of one).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import TYPE_CHECKING

from analyzer.launch.base import LaunchError, LaunchSetupError
from analyzer.loadgen.control import ServerError
from analyzer.loadgen.measure import MeasurementError
from analyzer.loadgen.perf import PerfOptions
from analyzer.results.checkpoint import Checkpoint, point_key
from analyzer.results.finals import (
    BUDGET,
    CLOSE_MARGIN,
    MIN_ROUNDS,
    RACE_MAX_ROUNDS,
    RESOLUTION,
    Calibration,
    Comparison,
    FinalResult,
    behind_text,
    calibrate,
    cheapest,
    combine,
    mark_ties,
    paired_difference,
    ratio_interval,
    round_order,
    summarize,
)
from analyzer.results.measurement import Measurement
from analyzer.results.outcome import ModelOutcome
from analyzer.results.ranking import ConfigResult, Ranker
from analyzer.search.base import SearchPoint

if TYPE_CHECKING:
    from analyzer.profiler import Profiler


POOL_BAND_MIN, POOL_BAND_MAX = 0.10, 0.25


def pool_band(calibration: Calibration | None) -> float:
    """How far below the search's leader a config's best point may be and still be a finalist.
    Two single points of one config differ by up to ~2.8x the window noise (95%, sqrt(2) x 1.96)
    and search points are minutes apart, so drift adds to that: three times the calibrated noise,
    at least POOL_BAND_MIN (brute force's true best lay 4-12% below its leader on days whose
    calibration said 1.4-3.7%), at most POOL_BAND_MAX."""
    noise = calibration.noise_pct / 100.0 if calibration is not None else 0.0
    return min(POOL_BAND_MAX, max(POOL_BAND_MIN, 3.0 * noise))


def finalists(model: ModelOutcome, ranker: Ranker, count: int, band: float = 0.0,
              extra: int = 0) -> list[ConfigResult]:  # fmt: skip
    """The `count` best configs of the search; then up to `extra` more whose best point is within
    `band` of the leader's (in the ranking score: the log of throughput for a throughput
    objective) and meets the constraints as the leader's does; then the default config if it is
    not among them."""
    ranked = [r for r in ranker.rank(list(model.results)) if r.measurements and not r.error]
    chosen = ranked[:count]
    if ranked and extra > 0:
        floor = ranked[0].score - math.log1p(band)
        near = [r for r in ranked[count:]
                if r.satisfies == ranked[0].satisfies and r.score >= floor]  # fmt: skip
        chosen += near[:extra]
    default = model.default
    if default is not None and default in ranked and default not in chosen:
        chosen.append(default)
    return chosen


CALIBRATION_WINDOWS = 5
DEFAULT_ROUNDS = 5  # when --final-rounds is unset and no calibration could run


ROUND_REQUESTS = 400  # what a round's window should hold: a p99 read from its 4 slowest
ROUND_WINDOW_MIN_MS = 200


def round_window_ms(options: PerfOptions, throughput: float | None) -> int:
    """A round's window: long enough for ROUND_REQUESTS at `throughput` (infer/s), between
    ROUND_WINDOW_MIN_MS and half the search's shortest window (at least 400 ms). A fast model's
    search is short, and the comparison must stay within a quarter of it: its windows shrink to
    what its request rate makes meaningful. The calibration's windows follow the same rule at the
    default's throughput, so its noise is that of windows of about as many requests."""
    ceiling = max(400, options.settings.min_window_ms // 2)
    if not throughput or throughput <= 0:
        return ceiling
    wanted = math.ceil(1000.0 * ROUND_REQUESTS / throughput)
    return min(ceiling, max(ROUND_WINDOW_MIN_MS, wanted))


def round_options(options: PerfOptions, window_ms: int) -> PerfOptions:
    """One fixed window after a short warm-up, whatever the search's stopping rule: the rounds
    give the interval, so no round needs a stopping rule (the adaptive rule's sub-windows would
    stretch a short window to 400 ms at least). The warm-up is a quarter of the
    window (at least 50 ms, at most the search's): a finalist stays loaded between rounds, so it
    only has to fill the pipeline again."""
    warmup = min(options.settings.warmup_ms, max(50, window_ms // 4))
    settings = dataclasses.replace(
        options.settings, mode="fixed", window_ms=window_ms, min_window_ms=window_ms,
        warmup_ms=warmup,
    )  # fmt: skip
    return dataclasses.replace(options, settings=settings)


def calibrate_default(
    profiler: Profiler, result: ConfigResult, trial: SearchPoint, options: PerfOptions,
    checkpoint: Checkpoint, fingerprint: str,
) -> Calibration | None:  # fmt: skip
    """The A/A run at the start: the default config, loaded for the search's first point, gets
    CALIBRATION_WINDOWS more windows of a final round's kind back to back. How much they move
    sets the number of final rounds. Checkpointed, so a rerun does not measure them again."""
    searched = result.measurements[-1].metrics.get("perf_throughput")  # the point just measured
    window_ms = round_window_ms(options, searched)
    windows = []
    for index in range(CALIBRATION_WINDOWS):
        key = point_key(result.config_text, trial.load, trial.value, trial.batch_size,
                        f"{fingerprint}|calibration {index + 1} of {CALIBRATION_WINDOWS}")
        measurement = checkpoint.points.get(key)
        if measurement is None:
            try:
                measurement = profiler.measure_point(result, trial,
                                                     round_options(options, window_ms))
            except (LaunchError, ServerError, MeasurementError, OSError):
                profiler.recover()
                return None  # the search goes on; the rounds fall back to DEFAULT_ROUNDS
            checkpoint.record_point(key, measurement, "calibration")
        windows.append(measurement)
    return calibrate(windows, window_ms)


@dataclasses.dataclass
class LoadLevels:
    """The loads the search swept, in order, and the gain that made it climb (a level up must
    beat the one below by more than `gain` to be taken)."""

    load: str  # "concurrency" or "request_rate"
    values: list[int]
    gain: float = 0.05

    def above(self, load: str, value: int) -> int | None:
        if load != self.load:
            return None
        return next((v for v in sorted(self.values) if v > value), None)


def run_final_comparison(
    profiler: Profiler, model: ModelOutcome, options: PerfOptions, checkpoint: Checkpoint,
    fingerprint: str, levels: LoadLevels | None = None,
) -> None:  # fmt: skip
    """The model's finalists measured again in interleaved rounds, when there are two or more and
    two or more rounds; the result goes to `model.comparison` and each finalist's `final`.
    `levels`: the search's loads, for the first round's load checks (none without them)."""
    if profiler.session.fresh_worker_per_variant:
        # memory is ranked: each measurement needs a fresh worker, and rounds of worker starts
        # would cost more than the search; the configs keep their search points
        return
    spec = model.spec
    ranker = Ranker(spec.objectives, spec.constraints, model.pareto)
    count = max(1, profiler.config.num_configs_per_model)
    band = pool_band(model.calibration)
    chosen = finalists(model, ranker, count, band, extra=count)
    search_seconds = sum(m.wall_s for r in model.results for m in r.measurements)
    plan = _plan(profiler.config.final_rounds, model.calibration, search_seconds)
    chosen, checks = _fit_pool(chosen, count, model.default, plan, levels, ranker)
    if plan.wanted < 2 or len(chosen) < 2:
        return
    comparison = Comparison(
        plan.wanted, [r.name for r in chosen],
        search_points=sum(len(r.measurements) for r in model.results),
        search_seconds=search_seconds, calibration=model.calibration, rounds_note=plan.note,
        pool_note=_pool_note(chosen, count, model.default, band),
    )  # fmt: skip
    model.comparison = comparison
    by_name = {r.name: r for r in chosen}
    check = _LoadCheck(checks, ranker, levels.gain if levels else 0.0)  # no levels, no checks
    got = _measure_rounds(profiler, spec.name, comparison, by_name, options, checkpoint,
                          fingerprint, check, plan, model.default)  # fmt: skip
    least = min(MIN_ROUNDS, plan.wanted)
    finals = {name: summarize(ms) for name, ms in got.items()
              if len(ms) >= least and name not in comparison.dropped}  # fmt: skip
    for name, final in finals.items():
        final.left_race = name in comparison.eliminated
        by_name[name].final = final
    if len(finals) < 2:
        return
    ranker.rank(list(model.results))  # the finalists' best is now the mean of their rounds
    _conclude(comparison, ranker, by_name, finals, model.default)


@dataclasses.dataclass
class RoundPlan:
    """How many rounds the comparison wants, and how many windows it may spend in all."""

    wanted: int
    budget: float | None  # windows (None: no budget, --final-rounds or no calibration)
    note: str  # how `wanted` was chosen, one clause


def _plan(configured: int | None, calibration: Calibration | None,
          search_s: float) -> RoundPlan:  # fmt: skip
    if configured is not None:
        return RoundPlan(configured, None, "as --final-rounds asks")
    if calibration is None:
        return RoundPlan(DEFAULT_ROUNDS, None, "the default (no A/A calibration ran)")
    spent = len(calibration.throughputs) * calibration.window_s
    budget = (BUDGET * search_s - spent) / calibration.window_s if calibration.window_s else None
    text = (f"from an A/A calibration of the default config: {len(calibration.throughputs)} "
            f"windows ({spent:.0f} s) varied by "
            f"{calibration.noise_pct:.1f}% (CV), which asks for "
            f"{calibration.rounds} rounds to resolve 5%")  # fmt: skip
    return RoundPlan(calibration.rounds, budget, text)


def _fit_pool(chosen: list[ConfigResult], count: int, default: ConfigResult | None,
              plan: RoundPlan, levels: LoadLevels | None,
              ranker: Ranker) -> tuple[list[ConfigResult], dict[str, int]]:  # fmt: skip
    """The finalists whose first MIN_ROUNDS rounds and load checks fit the budget: the configs
    beyond the search's top `count` leave, last first, until they do (the top and the default
    stay whatever the budget). With each finalist's load to check."""
    while True:
        checks = {r.name: up for r in chosen
                  if (up := _level_to_check(r, levels, ranker)) is not None}  # fmt: skip
        extras = [r for r in chosen[count:] if r is not default]
        cost = min(MIN_ROUNDS, plan.wanted) * len(chosen) + len(checks)
        if not extras or plan.budget is None or cost <= plan.budget:
            return chosen, checks
        chosen = [r for r in chosen if r is not extras[-1]]


def _pool_note(chosen: list[ConfigResult], count: int, default: ConfigResult | None,
               band: float) -> str:  # fmt: skip
    extras = [r for r in chosen[count:] if r is not default]
    if not extras:
        return ""
    return (f"Beyond the search's top {count}, {', '.join(r.name for r in extras)} joined for a "
            f"best point within {100 * band:.0f}% of its leader's (the search's noise band)")


def _level_to_check(result: ConfigResult, levels: LoadLevels | None,
                    ranker: Ranker) -> int | None:  # fmt: skip
    """The load one level above the finalist's best search point, unless there is none or the
    search already saw it break a constraint (more load only adds latency)."""
    best = result.best
    if levels is None or best is None:
        return None
    up = levels.above(best.load, best.value)
    if up is None:
        return None
    seen = [m for m in result.measurements if (m.load, m.value, m.batch_size)
            == (best.load, up, best.batch_size)]  # fmt: skip
    if any(ranker.violations(m) for m in seen):
        return None
    return up


@dataclasses.dataclass
class _LoadCheck:
    """The first round's checks: finalist -> the load above its own; how to judge them."""

    levels: dict[str, int]
    ranker: Ranker
    gain: float  # the sweep's plateau gain: what a level up must beat its own point by

    def verdict(self, own: Measurement, up: Measurement) -> tuple[bool, str]:
        """Whether the finalist moves up, and one clause saying what the check found."""
        ahead = self.ranker.score(up) - self.ranker.score(own)
        violations = self.ranker.violations(up)
        a, b = own.metrics["perf_throughput"], up.metrics["perf_throughput"]
        text = (f"{own.load} {own.value} -> {up.value}: {a:.1f} -> {b:.1f} infer/s, p99 "
                f"{own.metrics['perf_latency_p99']:.3f} -> {up.metrics['perf_latency_p99']:.3f} ms")
        if violations:
            return False, f"{text}; stays ({'; '.join(violations)})"
        if ahead > math.log1p(self.gain):
            return True, f"{text}; moved up"
        return False, f"{text}; stays (not {100 * self.gain:.0f}% better)"


def _measure_rounds(
    profiler: Profiler, model_name: str, comparison: Comparison,
    by_name: dict[str, ConfigResult], options: PerfOptions, checkpoint: Checkpoint,
    fingerprint: str, check: _LoadCheck, plan: RoundPlan, default: ConfigResult | None,
) -> dict[str, list[Measurement]]:  # fmt: skip
    """Every finalist still racing once a round, in each round's order, at its best search point
    (or, after the first round's load check, one level up): the measurements per finalist.
    Rounds go on until `plan.wanted`, and past it (up to RACE_MAX_ROUNDS) while a finalist is still
    tied with the leader, unless the next one would pass the budget (the first MIN_ROUNDS always
    run); from MIN_ROUNDS on, finalists shown behind the leader leave (see `_eliminate`). A
    finalist that fails is dropped (with its reason); the finalists left loaded are unloaded at
    the end."""
    planned = plan.wanted
    trials = {}
    for r in by_name.values():
        assert r.best is not None
        trials[r.name] = SearchPoint.make(r.params, r.best.load, r.best.value, r.best.batch_size)
    per_round = {name: round_options(options, round_window_ms(
        options, r.best.metrics.get("perf_throughput") if r.best else None))
        for name, r in by_name.items()}  # fmt: skip
    launcher = profiler.ensure_launcher()
    # BLS finalists serve their composing models under the same names, and finalists of models
    # profiled together share their models' variants: one at a time
    together = not launcher.remote and not any(r.serve_first or r.together
                                               for r in by_name.values())  # fmt: skip
    got: dict[str, list[Measurement]] = {name: [] for name in by_name}
    profiler.listener("final_start", {"model": model_name, "comparison": comparison})
    loaded: dict[str, int] = {}  # variant -> the worker start it was loaded into
    racing = list(by_name)
    used = float(len(check.levels))  # windows spent: the load checks are paid up front
    ran = 0
    open_tie = True
    # with a budget, rounds beyond the calibration's go on while a tie is open
    limit = max(planned, RACE_MAX_ROUNDS) if plan.budget is not None else planned
    for index in range(limit):
        names = [n for n in racing if n not in comparison.dropped]
        if index >= MIN_ROUNDS and plan.budget is not None and used + len(names) > plan.budget:
            break
        if index >= planned and not open_tie:
            break
        ran = index + 1
        for name in round_order(names, index):
            result, trial = by_name[name], trials[name]
            key = point_key(result.config_text, trial.load, trial.value, trial.batch_size,
                            f"{fingerprint}|final round {index + 1} of {planned}")  # fmt: skip
            measurement = checkpoint.points.get(key)
            if measurement is None:
                measurement = _measure_finalist(profiler, result, trial, per_round[name], together,
                                                loaded, comparison)  # fmt: skip
                if measurement is None:
                    continue
                checkpoint.record_point(key, measurement, "final_round")
            measurement.config_name = result.name
            comparison.points += 1
            comparison.seconds += measurement.wall_s
            used += 1
            profiler.listener("final_point", {"result": result, "measurement": measurement,
                                              "round": index + 1, "rounds": planned})  # fmt: skip
            if index == 0 and name in check.levels:
                up = _checked(profiler, result, trial, check.levels[name], per_round[name],
                              checkpoint, fingerprint, comparison)  # fmt: skip
                if up is not None:
                    moved, comparison.load_checks[name] = check.verdict(measurement, up)
                    if moved:
                        comparison.moved.append(name)
                        trials[name] = SearchPoint.make(result.params, trial.load, up.value,
                                                        trial.batch_size)  # fmt: skip
                        measurement = up
            got[name].append(measurement)
        if ran >= MIN_ROUNDS:
            racing, open_tie = _eliminate(racing, got, comparison, check.ranker, default, ran)
            if len([n for n in racing if default is None or n != default.name]) <= 1:
                break  # one config left in the race: more rounds would only refine the default
    comparison.rounds = ran
    if plan.budget is not None and ran < planned:
        comparison.rounds_note += (f"; {ran} kept the comparison, its load checks and the "
                                   "calibration within a quarter of the search's time")  # fmt: skip
    elif ran > planned:
        comparison.rounds_note += f"; {ran} ran, while a finalist was still tied with the leader"
    profiler.session.unload_all({n for n, start in loaded.items()
                                 if start == profiler.outcome.worker_starts})  # fmt: skip
    return got


def _eliminate(racing: list[str], got: dict[str, list[Measurement]], comparison: Comparison,
               ranker: Ranker, default: ConfigResult | None,
               ran: int) -> tuple[list[str], bool]:  # fmt: skip
    """The finalists still racing after round `ran`, and whether one of them is still tied with
    the leader: one whose paired score difference to the current leader lies wholly below zero
    has lost (the reason goes to `comparison.eliminated`). The default races to the end (the
    recommendation's gain over it needs its rounds) but never keeps the race going."""
    alive = [n for n in racing if n not in comparison.dropped and got[n]]
    meeting = [n for n in alive if not ranker.violations(combine(got[n]))] or alive
    if not meeting:
        return racing, False
    mean = {n: statistics.fmean(ranker.score(m) for m in got[n]) for n in alive}
    leader = max(meeting, key=lambda n: mean[n])
    keep = []
    open_tie = False
    for name in racing:
        if name == leader or name not in alive or (default is not None and name == default.name):
            keep.append(name)
            continue
        diff = paired_difference(got[name], got[leader], ranker.score)
        if diff.high < 0.0:
            comparison.eliminated[name] = (f"behind {leader} by {behind_text(diff)} after "
                                           f"{ran} rounds")  # fmt: skip
        else:
            keep.append(name)
            open_tie = True
    return keep, open_tie


def _checked(
    profiler: Profiler, result: ConfigResult, trial: SearchPoint, value: int,
    per_round: PerfOptions, checkpoint: Checkpoint, fingerprint: str, comparison: Comparison,
) -> Measurement | None:  # fmt: skip
    """The finalist at load `value`, measured right after its first round's point (still
    loaded). None when it failed: the finalist keeps its load (the worker recovered)."""
    up = SearchPoint.make(result.params, trial.load, value, trial.batch_size)
    key = point_key(result.config_text, up.load, up.value, up.batch_size,
                    f"{fingerprint}|load check")  # fmt: skip
    measurement = checkpoint.points.get(key)
    if measurement is None:
        got = _attempt(profiler, result, up, per_round)
        if isinstance(got, str):
            comparison.load_checks[result.name] = f"{trial.load} {value} failed: {got}"
            return None
        measurement = got
        checkpoint.record_point(key, measurement, "load_check")
    measurement.config_name = result.name
    comparison.points += 1
    comparison.seconds += measurement.wall_s
    profiler.listener("final_point", {"result": result, "measurement": measurement,
                                      "round": 1, "rounds": comparison.rounds,
                                      "label": "load check"})  # fmt: skip
    return measurement


def _attempt(profiler: Profiler, result: ConfigResult, trial: SearchPoint,
             per_round: PerfOptions) -> Measurement | str:  # fmt: skip
    """The point measured now, or why it failed (the worker recovered); a set-up error ends
    the run."""
    try:
        return profiler.measure_point(result, trial, per_round)
    except LaunchSetupError:
        raise
    except (LaunchError, ServerError, MeasurementError, OSError) as err:
        why = profiler.failure_text(err)
        profiler.recover()
        return why


def _measure_finalist(
    profiler: Profiler, result: ConfigResult, trial: SearchPoint, per_round: PerfOptions,
    together: bool, loaded: dict[str, int], comparison: Comparison,
) -> Measurement | None:  # fmt: skip
    """One round's point of one finalist, measured now. `together`: the finalists stay loaded
    side by side (`loaded`: the worker start each was loaded into), so one still loaded is not
    loaded again; on a remote server the previous one is unloaded first. None when it failed: it
    is dropped from the comparison and the worker recovered."""
    name = result.name
    if not together:
        profiler.unload_variant()
    elif loaded.get(name) == profiler.outcome.worker_starts:
        profiler.session.mark_loaded(name)  # still loaded: no reload
    measurement = _attempt(profiler, result, trial, per_round)
    if isinstance(measurement, str):
        comparison.dropped[name] = measurement
        return None
    loaded[profiler.session.loaded_as] = profiler.outcome.worker_starts
    return measurement


def _close_lead(leader: str, finals: dict[str, FinalResult], meeting: list[str]) -> str:
    """When the leader is ahead of every finalist beyond noise but of the nearest by less than
    CLOSE_MARGIN, one clause saying so: identical configs side by side came out 1.4% apart
    "beyond noise" (A/A), as one pair in twenty will."""
    others = [n for n in meeting if n != leader and finals[n].vs_leader is not None]
    if not others:
        return ""
    nearest = max(others, key=lambda n: finals[n].vs_leader.estimate)  # type: ignore[union-attr]
    gap = finals[nearest].vs_leader
    assert gap is not None
    if -gap.estimate >= math.log1p(CLOSE_MARGIN):
        return ""
    return (f"but by only {behind_text(gap).replace('%', '% over ' + nearest, 1)}: under "
            f"{100 * CLOSE_MARGIN:.0f}%, a gap that another run may reverse")


def _conclude(comparison: Comparison, ranker: Ranker, by_name: dict[str, ConfigResult],
              finals: dict[str, FinalResult], default: ConfigResult | None) -> None:  # fmt: skip
    """What the rounds say: the leader, the configs tied with it within noise, the cheapest of
    those shown no more than RESOLUTION behind it as the recommendation, and its throughput
    against the default config's."""
    meeting = [n for n in finals if by_name[n].satisfies] or list(finals)
    # The leader is one of the finalists that raced to the end. One that left was shown behind
    # the leader of its round beyond noise; its mean is over fewer, earlier rounds, which a
    # drifting machine makes higher or lower than the others' (`make demo` once made such a
    # finalist the leader, and then no finalist was left to recommend).
    finishers = [n for n in meeting if n not in comparison.eliminated] or meeting
    leader = max(finishers, key=lambda n: by_name[n].score)
    comparison.leader = leader
    comparison.tied = mark_ties({n: finals[n] for n in meeting}, leader, ranker.score)
    # A tie says the rounds cannot tell a config from the leader; it may still be well behind
    # (three rounds "tie" configs 10% apart). A cheaper config replaces the leader only when the
    # rounds show it is not worse by more than RESOLUTION: the 95% interval of its paired score
    # difference lies above -log(1 + RESOLUTION) (a non-inferiority margin of 5% throughput).
    # A finalist that left the race was shown behind the leader of its day beyond noise: it may
    # tie the final leader over the rounds it ran, but it is not recommended.
    # With Pareto objectives, a cheaper tie another finalist beats on every objective is not
    # recommended either: the recommendation stays on the front the ranking puts first.
    margin = -math.log1p(RESOLUTION)
    dominated = ranker.dominated_finalists({n: finals[n] for n in meeting}) - {leader}
    close = [n for n in comparison.tied if n not in comparison.eliminated and n not in dominated
             and (finals[n].vs_leader is None or finals[n].vs_leader.low >= margin)]  # fmt: skip
    chosen_name, reason = cheapest([(n, by_name[n].description, finals[n].combined)
                                    for n in close or [leader]])  # fmt: skip
    comparison.recommended = chosen_name
    if comparison.tied == [leader]:
        comparison.close_lead = _close_lead(leader, finals, meeting)
    if chosen_name != leader:
        comparison.why = (f"{chosen_name} is tied with {leader} within noise and is cheaper: "
                          f"{reason}; it is recommended")  # fmt: skip
    if default is not None and default.name in finals and chosen_name != default.name:
        comparison.vs_default = ratio_interval(
            [m.metrics["perf_throughput"] for m in finals[chosen_name].rounds],
            [m.metrics["perf_throughput"] for m in finals[default.name].rounds],
        )
