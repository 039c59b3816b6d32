"""After a model's search: its top configs and the default measured again, side by side.

The rules and the statistics are in `analyzer.results.finals`; this is the loop that drives the
worker. The finalists stay loaded together in a local worker, so that moving from one to the next
costs a payload switch, not a model load (one at a time on a remote server, which serves a
variant under the model's own name). When memory is ranked on, every measurement needs a fresh
worker (allocators keep freed memory), and the comparison is skipped: the configs keep their
search points.

Each round's measurement goes to the checkpoint (as a `final_round` entry): a rerun measures only
the rounds that are missing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from analyzer.launch.base import LaunchError, LaunchSetupError
from analyzer.loadgen.control import ServerError
from analyzer.loadgen.measure import MeasurementError
from analyzer.loadgen.perf import PerfOptions
from analyzer.results.checkpoint import Checkpoint, point_key
from analyzer.results.finals import (
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


def run_final_comparison(
    profiler: Profiler, model: ModelOutcome, options: PerfOptions, checkpoint: Checkpoint,
    fingerprint: str,
) -> None:  # fmt: skip
    """The model's finalists measured again in interleaved rounds, when there are two or more and
    two or more rounds; the result goes to `model.comparison` and each finalist's `final`."""
    if profiler.session.fresh_worker_per_variant:
        # memory is ranked: each measurement needs a fresh worker, and rounds of worker starts
        # would cost more than the search; the configs keep their search points
        return
    spec = model.spec
    ranker = Ranker(spec.objectives, spec.constraints, model.pareto)
    chosen = finalists(model, ranker, max(1, profiler.config.num_configs_per_model))
    search_seconds = sum(m.wall_s for r in model.results for m in r.measurements)
    rounds, note = _rounds(profiler.config.final_rounds, model.calibration, len(chosen),
                           search_seconds)  # fmt: skip
    if rounds < 2 or len(chosen) < 2:
        return
    comparison = Comparison(
        rounds, [r.name for r in chosen],
        search_points=sum(len(r.measurements) for r in model.results),
        search_seconds=search_seconds, calibration=model.calibration, rounds_note=note,
    )  # fmt: skip
    model.comparison = comparison
    by_name = {r.name: r for r in chosen}
    got = _measure_rounds(profiler, spec.name, comparison, by_name, options, checkpoint,
                          fingerprint)  # fmt: skip
    finals = {name: summarize(ms) for name, ms in got.items()
              if len(ms) == rounds and name not in comparison.dropped}  # fmt: skip
    for name, final in finals.items():
        by_name[name].final = final
    if len(finals) < 2:
        return
    ranker.rank(list(model.results))  # the finalists' best is now the mean of their rounds
    _conclude(comparison, ranker, by_name, finals, model.default)


def _measure_rounds(
    profiler: Profiler, model_name: str, comparison: Comparison,
    by_name: dict[str, ConfigResult], options: PerfOptions, checkpoint: Checkpoint,
    fingerprint: str,
) -> dict[str, list[Measurement]]:  # fmt: skip
    """Every finalist once a round, in each round's order, at its best search point: the
    measurements per finalist. A finalist that fails is dropped (with its reason) from the rounds
    that follow; the finalists left loaded are unloaded at the end."""
    rounds = comparison.rounds
    trials = {}
    for r in by_name.values():
        assert r.best is not None
        trials[r.name] = SearchPoint.make(r.params, r.best.load, r.best.value, r.best.batch_size)
    per_round = round_options(options)
    launcher = profiler.ensure_launcher()
    together = not launcher.remote
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
            got[name].append(measurement)
            comparison.points += 1
            comparison.seconds += measurement.wall_s
            profiler.listener("final_point", {"result": result, "measurement": measurement,
                                              "round": index + 1, "rounds": rounds})  # fmt: skip
    profiler.session.unload_all({n for n, start in loaded.items()
                                 if start == profiler.outcome.worker_starts})  # fmt: skip
    return got


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
    try:
        measurement = profiler.measure_point(result, trial, per_round)
    except LaunchSetupError:
        raise
    except (LaunchError, ServerError, MeasurementError, OSError) as err:
        comparison.dropped[name] = profiler.failure_text(err)
        profiler.recover()
        return None
    loaded[profiler.session.loaded_as] = profiler.outcome.worker_starts
    return measurement


def _conclude(comparison: Comparison, ranker: Ranker, by_name: dict[str, ConfigResult],
              finals: dict[str, FinalResult], default: ConfigResult | None) -> None:  # fmt: skip
    """What the rounds say: the leader, the configs tied with it within noise, the cheapest of
    those as the recommendation, and its throughput against the default config's."""
    meeting = [n for n in finals if by_name[n].satisfies] or list(finals)
    leader = max(meeting, key=lambda n: by_name[n].score)
    comparison.leader = leader
    comparison.tied = mark_ties({n: finals[n] for n in meeting}, leader, ranker.score)
    chosen_name, reason = cheapest([(n, by_name[n].description, finals[n].combined)
                                    for n in comparison.tied])  # fmt: skip
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
            search_s: float) -> tuple[int, str]:  # fmt: skip
    """The number of rounds and one clause saying how it was chosen."""
    if configured is not None:
        return configured, "as --final-rounds asks"
    if calibration is None:
        return DEFAULT_ROUNDS, "the default (no A/A calibration ran)"
    spent = len(calibration.throughputs) * calibration.window_s
    rounds = affordable_rounds(calibration.rounds, finalists, calibration.window_s, search_s,
                               spent)  # fmt: skip
    text = (f"from an A/A calibration of the default config: {len(calibration.throughputs)} "
            f"windows ({spent:.0f} s) varied by "
            f"{calibration.noise_pct:.1f}% (CV), which asks for "
            f"{calibration.rounds} rounds to resolve 5%")  # fmt: skip
    if rounds < calibration.rounds:
        text += (f"; {rounds} keep the comparison and the calibration within a quarter of the "
                 "search's time")
    return rounds, text
