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
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from analyzer.launch.base import LaunchError, LaunchSetupError
from analyzer.loadgen.control import ServerError
from analyzer.loadgen.measure import MeasurementError
from analyzer.loadgen.perf import PerfOptions
from analyzer.results.checkpoint import Checkpoint, point_key
from analyzer.results.finals import (
    RESOLUTION,
    Calibration,
    Comparison,
    FinalResult,
    affordable_rounds,
    calibrate,
    cheapest,
    mark_ties,
    ratio_interval,
    round_orders,
    summarize,
)
from analyzer.results.measurement import Measurement
from analyzer.results.outcome import ModelOutcome
from analyzer.results.ranking import ConfigResult, Ranker
from analyzer.search.base import SearchPoint

if TYPE_CHECKING:
    from analyzer.profiler import Profiler


def finalists(model: ModelOutcome, ranker: Ranker, count: int) -> list[ConfigResult]:
    """The `count` best configs of the search, and the default config if it is not among them."""
    ranked = [r for r in ranker.rank(list(model.results)) if r.measurements and not r.error]
    chosen = ranked[:count]
    default = model.default
    if default is not None and default in ranked and default not in chosen:
        chosen.append(default)
    return chosen


CALIBRATION_WINDOWS = 5
DEFAULT_ROUNDS = 5  # when --final-rounds is unset and no calibration could run


def round_options(options: PerfOptions) -> PerfOptions:
    """One fixed window after a short warm-up, whatever the search's stopping rule: the rounds
    give the interval, so no round needs to be stable on its own."""
    window = max(400, options.settings.min_window_ms // 2)
    settings = dataclasses.replace(
        options.settings, mode="adaptive", stability_pct=1000.0, min_window_ms=window,
        window_ms=window, max_trials=4,
    )  # fmt: skip
    return dataclasses.replace(options, settings=settings)


def calibrate_default(
    profiler: Profiler, result: ConfigResult, trial: SearchPoint, options: PerfOptions,
    checkpoint: Checkpoint, fingerprint: str,
) -> Calibration | None:  # fmt: skip
    """The A/A run at the start: the default config, loaded for the search's first point, gets
    CALIBRATION_WINDOWS more windows of a final round's kind back to back. How much they move
    sets the number of final rounds. Checkpointed, so a rerun does not measure them again."""
    windows = []
    for index in range(CALIBRATION_WINDOWS):
        key = point_key(result.config_text, trial.load, trial.value, trial.batch_size,
                        f"{fingerprint}|calibration {index + 1} of {CALIBRATION_WINDOWS}")
        measurement = checkpoint.points.get(key)
        if measurement is None:
            try:
                measurement = profiler.measure_point(result, trial, round_options(options))
            except (LaunchError, ServerError, MeasurementError, OSError):
                profiler.recover()
                return None  # the search goes on; the rounds fall back to DEFAULT_ROUNDS
            checkpoint.record_point(key, measurement, "calibration")
        windows.append(measurement)
    return calibrate(windows)


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
    chosen = finalists(model, ranker, max(1, profiler.config.num_configs_per_model))
    search_seconds = sum(m.wall_s for r in model.results for m in r.measurements)
    checks = {r.name: up for r in chosen if (up := _level_to_check(r, levels, ranker)) is not None}
    rounds, note = _rounds(profiler.config.final_rounds, model.calibration, len(chosen),
                           search_seconds, len(checks))  # fmt: skip
    if rounds < 2 or len(chosen) < 2:
        return
    comparison = Comparison(
        rounds, [r.name for r in chosen],
        search_points=sum(len(r.measurements) for r in model.results),
        search_seconds=search_seconds, calibration=model.calibration, rounds_note=note,
    )  # fmt: skip
    model.comparison = comparison
    by_name = {r.name: r for r in chosen}
    check = _LoadCheck(checks, ranker, levels.gain if levels else 0.0)  # no levels, no checks
    got = _measure_rounds(profiler, spec.name, comparison, by_name, options, checkpoint,
                          fingerprint, check)  # fmt: skip
    finals = {name: summarize(ms) for name, ms in got.items()
              if len(ms) == rounds and name not in comparison.dropped}  # fmt: skip
    for name, final in finals.items():
        by_name[name].final = final
    if len(finals) < 2:
        return
    ranker.rank(list(model.results))  # the finalists' best is now the mean of their rounds
    _conclude(comparison, ranker, by_name, finals, model.default)


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
    fingerprint: str, check: _LoadCheck,
) -> dict[str, list[Measurement]]:  # fmt: skip
    """Every finalist once a round, in each round's order, at its best search point (or, after
    the first round's load check, one level up): the measurements per finalist. A finalist that
    fails is dropped (with its reason) from the rounds that follow; the finalists left loaded are
    unloaded at the end."""
    rounds = comparison.rounds
    trials = {}
    for r in by_name.values():
        assert r.best is not None
        trials[r.name] = SearchPoint.make(r.params, r.best.load, r.best.value, r.best.batch_size)
    per_round = round_options(options)
    launcher = profiler.ensure_launcher()
    # BLS finalists serve their composing models under the same names: one at a time
    together = not launcher.remote and not any(r.serve_first for r in by_name.values())
    got: dict[str, list[Measurement]] = {name: [] for name in by_name}
    profiler.listener("final_start", {"model": model_name, "comparison": comparison})
    loaded: dict[str, int] = {}  # variant -> the worker start it was loaded into
    for index, order in enumerate(round_orders(list(by_name), rounds)):
        for name in order:
            if name in comparison.dropped:
                continue
            result, trial = by_name[name], trials[name]
            key = point_key(result.config_text, trial.load, trial.value, trial.batch_size,
                            f"{fingerprint}|final round {index + 1} of {rounds}")  # fmt: skip
            measurement = checkpoint.points.get(key)
            if measurement is None:
                measurement = _measure_finalist(profiler, result, trial, per_round, together,
                                                loaded, comparison)  # fmt: skip
                if measurement is None:
                    continue
                checkpoint.record_point(key, measurement, "final_round")
            measurement.config_name = result.name
            comparison.points += 1
            comparison.seconds += measurement.wall_s
            profiler.listener("final_point", {"result": result, "measurement": measurement,
                                              "round": index + 1, "rounds": rounds})  # fmt: skip
            if index == 0 and name in check.levels:
                up = _checked(profiler, result, trial, check.levels[name], per_round, checkpoint,
                              fingerprint, comparison)  # fmt: skip
                if up is not None:
                    moved, comparison.load_checks[name] = check.verdict(measurement, up)
                    if moved:
                        comparison.moved.append(name)
                        trials[name] = SearchPoint.make(result.params, trial.load, up.value,
                                                        trial.batch_size)  # fmt: skip
                        measurement = up
            got[name].append(measurement)
    profiler.session.unload_all({n for n, start in loaded.items()
                                 if start == profiler.outcome.worker_starts})  # fmt: skip
    return got


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


def _conclude(comparison: Comparison, ranker: Ranker, by_name: dict[str, ConfigResult],
              finals: dict[str, FinalResult], default: ConfigResult | None) -> None:  # fmt: skip
    """What the rounds say: the leader, the configs tied with it within noise, the cheapest of
    those shown no more than RESOLUTION behind it as the recommendation, and its throughput
    against the default config's."""
    meeting = [n for n in finals if by_name[n].satisfies] or list(finals)
    leader = max(meeting, key=lambda n: by_name[n].score)
    comparison.leader = leader
    comparison.tied = mark_ties({n: finals[n] for n in meeting}, leader, ranker.score)
    # A tie says the rounds cannot tell a config from the leader; it may still be well behind
    # (three rounds "tie" configs 10% apart). A cheaper config replaces the leader only when the
    # rounds show it is not worse by more than RESOLUTION: the 95% interval of its paired score
    # difference lies above -log(1 + RESOLUTION) (a non-inferiority margin of 5% throughput).
    margin = -math.log1p(RESOLUTION)
    close = [n for n in comparison.tied
             if finals[n].vs_leader is None or finals[n].vs_leader.low >= margin]  # fmt: skip
    chosen_name, reason = cheapest([(n, by_name[n].description, finals[n].combined)
                                    for n in close])  # fmt: skip
    comparison.recommended = chosen_name
    if chosen_name != leader:
        comparison.why = (f"{chosen_name} is tied with {leader} within noise and is cheaper: "
                          f"{reason}; it is recommended")  # fmt: skip
    if default is not None and default.name in finals and chosen_name != default.name:
        comparison.vs_default = ratio_interval(
            [m.metrics["perf_throughput"] for m in finals[chosen_name].rounds],
            [m.metrics["perf_throughput"] for m in finals[default.name].rounds],
        )


def _rounds(configured: int | None, calibration: Calibration | None, finalists: int,
            search_s: float, checks: int = 0) -> tuple[int, str]:  # fmt: skip
    """The number of rounds and one clause saying how it was chosen; the calibration's windows
    and the `checks` load checks count against the budget."""
    if configured is not None:
        return configured, "as --final-rounds asks"
    if calibration is None:
        return DEFAULT_ROUNDS, "the default (no A/A calibration ran)"
    spent = len(calibration.throughputs) * calibration.window_s
    rounds = affordable_rounds(calibration.rounds, finalists, calibration.window_s, search_s,
                               spent + checks * calibration.window_s)  # fmt: skip
    text = (f"from an A/A calibration of the default config: {len(calibration.throughputs)} "
            f"windows ({spent:.0f} s) varied by "
            f"{calibration.noise_pct:.1f}% (CV), which asks for "
            f"{calibration.rounds} rounds to resolve 5%")  # fmt: skip
    if rounds < calibration.rounds:
        text += (f"; {rounds} keep the comparison, its load checks and the calibration within a "
                 "quarter of the search's time")
    return rounds, text
