"""What a profile run found, as the objects the reports are written from: per model its ranked
configs, its final comparison and calibration; per run the counts, the machine and the CPU
placement. The profiler builds these; `outcome_from_document` rebuilds them from a results file
(the `report` command and a shared study's refresh)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analyzer.config.profile_config import ModelSpec, ProfileConfig
from analyzer.results.finals import Calibration, Comparison, FinalResult
from analyzer.results.measurement import Measurement
from analyzer.results.ranking import ConfigResult


@dataclass
class ModelOutcome:
    spec: ModelSpec
    results: list[ConfigResult] = field(default_factory=list)  # ranked after the run
    error: str = ""  # the model could not be profiled at all
    skipped: list[str] = field(default_factory=list)  # combinations that cannot work
    study: dict[str, str] = field(default_factory=dict)  # optuna: storage URL and study name
    pareto: list[str] = field(default_factory=list)  # the objectives of a multi-objective study
    comparison: Comparison | None = None  # the final side-by-side rounds, when they ran
    calibration: Calibration | None = None  # the A/A run of the default at the start

    @property
    def default(self) -> ConfigResult | None:
        return next((r for r in self.results if r.is_default), None)


@dataclass
class ProfileOutcome:
    config: ProfileConfig
    models: list[ModelOutcome]
    measured: int = 0  # points measured in this run
    reused: int = 0  # points taken from the checkpoint
    shared: int = 0  # points another process sharing the study measured
    worker_starts: int = 0
    wall_s: float = 0.0
    server_only: list[dict[str, Any]] = field(default_factory=list)
    kind: str = "CPU"
    machine: dict[str, Any] | None = None  # None: this machine (set when rebuilt from a file)
    placement: dict[str, str] = field(default_factory=dict)  # worker's and client's CPU sets


def outcome_from_document(document: dict[str, Any]) -> ProfileOutcome:
    """The run a results file describes, as the objects the exports are written from."""
    config = ProfileConfig.from_values(document["settings"])
    models = []
    for m in document["models"]:
        spec = ModelSpec(name=m["name"], objectives=m["objectives"], constraints=m["constraints"])
        model = ModelOutcome(spec, error=m["error"], skipped=m["skipped"],
                             study=m.get("study") or {},
                             pareto=m.get("pareto_objectives") or [])  # fmt: skip
        if m.get("final_comparison"):
            model.comparison = Comparison.from_dict(m["final_comparison"])
        if m.get("calibration"):
            model.calibration = Calibration.from_dict(m["calibration"])
        for c in m["configs"]:
            model.results.append(ConfigResult(
                model=m["name"], name=c["name"], params=c["params"],
                description=c["description"], config_text="", path=c["path"],
                is_default=c["is_default"], error=c["error"],
                measurements=[Measurement.from_dict(x) for x in c["measurements"]],
                final=FinalResult.from_dict(c["final_comparison"])
                if c.get("final_comparison") else None,
            ))  # fmt: skip
        models.append(model)
    stats = document["stats"]
    return ProfileOutcome(
        config, models, measured=stats["measured"], reused=stats["reused"],
        shared=stats.get("shared", 0), worker_starts=stats["worker_starts"],
        wall_s=stats["wall_s"], server_only=document["server_only"],
        kind=document["instance_kind"], machine=document["machine"],
        placement=document.get("cpu_placement") or {},
    )  # fmt: skip
