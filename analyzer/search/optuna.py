"""Optuna search: one study over the joint space of instance count, max_batch_size, queue delay and
concurrency; each Optuna trial is one measured point.

The study lives in an Optuna storage (a SQLite file in the checkpoint folder by default, so a rerun
resumes it; PostgreSQL to share one study between processes and hosts). Every point -- baseline,
study trial, final sweep -- is claimed in the study's points ledger (ledger.py) before it is
measured: a point any process finished is reused, one another process is measuring is skipped
(study) or waited for (sweeps), so processes sharing a study divide the work. Constraints go
to the samplers through `optuna.Trial.set_constraint` (feasible when <= 0). Trials stop after MA's
budget:
between optuna_min_trials (default: scaled to the space) / min_percentage_of_search_space and
optuna_max_trials / max_percentage_of_search_space, and early when the best has not improved
for optuna_early_exit_threshold trials. The best configs then get a full concurrency sweep.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import optuna

from analyzer.search.base import Outcome, SearchLimits, SearchPoint
from analyzer.search.ledger import (
    Claim,
    Ledger,
    SharedPoint,
    StudyStorageError,
    open_storage,
    outcome_of,
    study_point_id,
)
from analyzer.search.quick import QuickSearch, State, score_of
from analyzer.search.space import SearchSpace

SAMPLERS = ("tpe", "gp", "nsga2", "random")
OFFSET_RANGE = 3  # concurrency from 1/8 to 8 x MA's formula, clipped to the search's levels


@dataclass
class OptunaSettings:
    storage: str
    study_name: str
    sampler: str = "tpe"
    seed: int | None = None
    min_trials: int | None = None  # None: scaled to the space (scaled_min_trials)
    max_trials: int = 200
    early_exit_threshold: int = 10
    min_percentage: float = 5.0
    max_percentage: float = 10.0
    objectives: tuple[str, ...] = ()  # () = the weighted score; else tags for multi-objective
    fingerprint: str = ""  # what makes points comparable: processes joining a study must match


def scaled_min_trials(size: int) -> int:
    """The trial floor when none is set: a tenth of the space, within 10..20.

    MA's floor is 20 whatever the space. On a 150-point space that alone is 13% of it, and with
    the top configs' sweeps optuna then measured more than a quarter of brute force's points. Ten
    is TPE's 6 random start-up trials plus 4 guided ones. A tenth, not less: on the synthetic
    model of tests/test_profile_parts.py, 15 trials on such a space find what 20 find, and 10 find
    less. MA's 20 is reached at 200 points.
    """
    return min(20, max(10, math.ceil(size / 10)))


def _sampler(name: str, seed: int | None, multi: bool) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=6)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"optuna sampler '{name}' is unknown; known: {', '.join(SAMPLERS)}")


class OptunaSearch(QuickSearch):
    def __init__(self, space: SearchSpace, limits: SearchLimits, settings: OptunaSettings,
                 top_configs: int = 3, directions: list[str] | None = None) -> None:  # fmt: skip
        super().__init__(space, limits, top_configs)
        self.settings = settings
        multi = bool(settings.objectives)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = open_storage(settings.storage)
        self.study = optuna.create_study(
            storage=storage,
            study_name=settings.study_name,
            sampler=_sampler(settings.sampler, settings.seed, multi),
            directions=directions or ["maximize"],  # type: ignore[arg-type]
            load_if_exists=True,
        )
        size = len(self.counts) * max(1, len(self.sizes)) * len(self.delays) * len(self.levels)
        floor = scaled_min_trials(size) if settings.min_trials is None else settings.min_trials
        low = max(floor, math.ceil(size * settings.min_percentage / 100))
        high = min(settings.max_trials, math.ceil(size * settings.max_percentage / 100))
        self.space_size = size
        self._check_fingerprint(directions or ["maximize"])
        self.ledger = Ledger(storage, settings.study_name)
        self._claims: dict[SearchPoint, Claim] = {}
        self.shared = 0  # points finished by another process (or an earlier run) and reused
        self.min_trials = min(low, size)
        self.max_trials = min(max(high, self.min_trials), size)

    def _check_fingerprint(self, directions: list[str]) -> None:
        """Points of one study must be comparable: same measurement settings, objectives and
        search space in every process that joins it."""
        mine = json.dumps([self.settings.fingerprint, self.settings.objectives, directions,
                           self.counts, self.sizes, self.delays, self.levels])  # fmt: skip
        theirs = self.study.user_attrs.get("fingerprint")
        if theirs is None:
            self.study.set_user_attr("fingerprint", mine)
        elif theirs != mine:
            raise StudyStorageError(
                f"study '{self.settings.study_name}' was started with other measurement settings, "
                "objectives or search limits than this run; pass another --study-name (or the "
                "same settings) to continue"
            )

    # ---- the study -----------------------------------------------------------------------------
    def _suggest(self, trial: optuna.Trial) -> tuple[dict[str, Any], int]:
        limits = self.limits
        params: dict[str, Any] = {
            "instance_count": trial.suggest_categorical("instance_count_listed", self.counts)
            if self.listed_counts
            else trial.suggest_int("instance_count", self.counts[0], self.counts[-1])
        }
        if limits.own_max_batch_size > 0:
            if self.listed_sizes:  # model_config_parameters' values, as MA's optuna takes them
                mbs = trial.suggest_categorical("max_batch_size_listed", self.sizes)
            else:
                low, high = math.log2(self.sizes[0]), math.log2(self.sizes[-1])
                exponent = trial.suggest_int("max_batch_size_log2", int(low), int(high))
                mbs = max(self.sizes[0], min(self.sizes[-1], 2**exponent))
            params["max_batch_size"] = mbs
            params["max_queue_delay_microseconds"] = (
                trial.suggest_categorical("max_queue_delay_microseconds", self.delays)
                if mbs > 1 else self.delays[0]
            )  # fmt: skip
        # Concurrency relative to MA's formula (2 x max_batch_size x instances), in powers of two:
        # the concurrency a config needs scales with the requests it can hold, so one offset
        # means the same load for every config and the sampler learns it across configs.
        if self.load == "request_rate":  # no formula for a rate: its levels are the dimension
            return params, self.levels[trial.suggest_int("request_rate_index", 0,
                                                         len(self.levels) - 1)]  # fmt: skip
        offset = 0 if limits.concurrency_formula else trial.suggest_int(
            "concurrency_offset_log2", -OFFSET_RANGE, OFFSET_RANGE)  # fmt: skip
        target = 2.0 * params.get("max_batch_size", 1) * params["instance_count"] * 2.0**offset
        if limits.concurrency_formula and not limits.concurrency:  # MA's: the formula's own value
            return params, max(self.levels[0], min(self.levels[-1], int(target)))
        index = min(range(len(self.levels)),
                    key=lambda i: abs(math.log2(self.levels[i]) - math.log2(target)))
        return params, self.levels[index]

    def _values(self, outcome: Outcome) -> list[float]:
        if not self.settings.objectives:
            return [outcome.objective]
        return [float(outcome.metrics.get(tag, 0.0)) for tag in self.settings.objectives]

    def _completed(self) -> int:
        """Distinct points the study has finished: a trial that re-proposed a known point is told
        its value again but does not use up the budget."""
        done = (optuna.trial.TrialState.COMPLETE,)
        trials = self.study.get_trials(deepcopy=False, states=done)
        return len({t.user_attrs.get("point", t.number) for t in trials})

    # ---- points, through the ledger ------------------------------------------------------------
    def _measure(self, trial: SearchPoint) -> Generator[SearchPoint, None, Outcome]:
        """Every point (baseline, study, sweeps) is claimed in the ledger first: one finished by
        any process is reused, one another process is measuring is waited for."""
        if trial not in self.asked:
            outcome = yield from self._claimed(trial, wait=True)
            assert outcome is not None
        return self.asked[trial]

    def _claimed(
        self, trial: SearchPoint, wait: bool
    ) -> Generator[SearchPoint, None, Outcome | None]:
        claim = self.ledger.claim(trial, wait)
        if claim.state == "busy":
            return None
        if claim.state == "done":
            assert claim.done is not None
            self.shared += 1
            self._told(trial, outcome_of(claim.done))
        else:
            self._claims[trial] = claim
            yield trial
        return self.asked[trial]

    def _told(self, trial: SearchPoint, outcome: Outcome) -> None:
        super()._told(trial, outcome)
        claim = self._claims.pop(trial, None)
        if claim is not None:
            self.ledger.finish(claim, outcome)

    def shared_points(self) -> list[SharedPoint]:
        return self.ledger.points()

    def close(self) -> None:
        """Give back a claim left unmeasured (the run was interrupted) and stop the heartbeats."""
        for claim in self._claims.values():
            try:
                self.ledger.release(claim)
            except Exception:  # noqa: BLE001 - a claim not given back goes stale after the grace
                pass
        self._claims.clear()
        self.ledger.close()

    def _walk(self) -> Generator[SearchPoint, None, None]:
        self.phase = "baseline"
        yield from self._measure(self._trial({}, self.levels[self._start().concurrency_index]))
        self.phase = "study"
        best, since_best, repeats = -math.inf, 0, 0
        while self._completed() < self.max_trials and repeats < 50:
            if self._completed() >= self.min_trials and since_best >= (
                self.settings.early_exit_threshold
            ):
                break
            trial = self.study.ask()
            params, level = self._suggest(trial)
            ours = self._trial(params, level)
            trial.set_user_attr("point", study_point_id(ours))
            if ours in self.asked:
                repeats += 1  # the sampler proposed a point this search already knows
                self._tell(trial, self.asked[ours])
                continue
            shared = self.shared
            outcome = yield from self._claimed(ours, wait=False)
            if outcome is None:
                repeats += 1  # another process is measuring this point right now
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            score = self._tell(trial, outcome)
            if self.shared > shared:
                repeats += 1  # another process (or an earlier run) finished it already
                continue
            repeats = 0
            if score is not None and self._beats(score, best):
                best, since_best = score, 0
            else:
                since_best += 1
        # the study samples the space thinly: around its top configs, on a flat top, a config
        # one step away is as likely the best as the ones sampled (QuickSearch._look_around);
        # not with MA's use_concurrency_formula, which fixes each config's load by its formula
        self.phase = "look"
        if not self.limits.concurrency_formula:
            for point, outcome in list(self.asked.items()):
                state = self._state_of(point)
                if state is not None and outcome.ok:
                    self.scored[state] = score_of(outcome)
            yield from self._look_around()
        self.phase = "sweeps"
        yield from self._final_sweeps()

    def _state_of(self, point: SearchPoint) -> State | None:
        """The climb state of a study point (None for the default config and the sweeps' other
        client batch sizes): the axes' indices of its values."""
        params = point.params
        if not params or point.batch_size != self.batch or point.value not in self.levels:
            return None
        try:
            count = params["instance_count"]
            if count not in self.counts:
                return None
            batch = delay = 0
            if self.limits.own_max_batch_size > 0:
                batch = self.sizes.index(params["max_batch_size"])
                delay = self.delays.index(params["max_queue_delay_microseconds"])
        except (KeyError, ValueError):
            return None
        return State(count, batch, delay, self.levels.index(point.value))

    def _tell(self, trial: optuna.Trial, outcome: Outcome) -> float | None:
        if not outcome.ok:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return None
        for name, value in outcome.constraints.items():
            trial.set_constraint(name, value)
        values = self._values(outcome)
        self.study.tell(trial, values if len(values) > 1 else values[0])
        return score_of(outcome) if outcome.satisfies_constraints else None
