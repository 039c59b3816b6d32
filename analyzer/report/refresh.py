"""Results of a study shared by several profile processes, merged into one run's results file.

Each `model-analyzer profile` process that joins a study (`--storage`, `--study-name`) writes its
own export folder, with what it measured and what the others had finished when it ended. `model-
analyzer report` calls `refresh_from_studies` first: it reads every finished point from the
study's ledger, adds the ones the results file lacks, ranks again and rewrites the results file
and the CSVs -- so one report shows the work of all processes, whichever finished last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analyzer.config.profile_config import storage_from_environment
from analyzer.report.exports import write_csvs, write_results
from analyzer.results.measurement import from_shared
from analyzer.results.outcome import ModelOutcome, outcome_from_document
from analyzer.results.ranking import ConfigResult, Ranker, recommended_first
from analyzer.search.ledger import StudyStorageError, load_points, redact_url, unmerged


def _study_reachable(url: str) -> bool:
    """A SQLite study that is not there (results copied elsewhere) is not created empty."""
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")).exists()
    return True


def merge_points(model: ModelOutcome) -> int:
    """Adds the study's finished points this model's results lack; returns how many."""
    study = model.study
    points = load_points(study["storage"], study["study_name"])
    by_params = {json.dumps(r.params, sort_keys=True): r for r in model.results}
    added = 0
    for point in unmerged(points, by_params):
        t = point.trial
        result = by_params.get(t.params_json)
        if result is None:
            index = sum(1 for r in model.results if not r.is_default)
            name = f"{model.spec.name}_config_{'default' if t.params_json == '{}' else index}"
            result = ConfigResult(
                model=model.spec.name, name=name, params=t.params,
                description=point.config.get("description", {}),
                config_text=point.config.get("config_text", ""), path="",
                is_default=t.params_json == "{}",
            )  # fmt: skip
            model.results.append(result)
            by_params[t.params_json] = result
        result.measurements.append(from_shared(point, result.name))
        added += 1
    return added


def refresh_from_studies(
    export_path: Path, document: dict[str, Any], storage: str | None = None
) -> list[str]:
    """Merge the shared studies' points into the results files; returns notes for the user.
    `storage` replaces the URL the results file names (which has no password); without it,
    MODEL_ANALYZER_STORAGE does where it is that URL with the password."""
    if not any(m.get("study") for m in document["models"]):
        return []
    outcome = outcome_from_document(document)
    from_environment = storage_from_environment()
    notes, added = [], 0
    for model in outcome.models:
        study = model.study
        if not study:
            continue
        if storage:
            study = model.study = {**study, "storage": storage}
        elif from_environment and study["storage"] == redact_url(from_environment):
            study = model.study = {**study, "storage": from_environment}  # the run's own URL
        if "***" in study["storage"]:
            notes.append(f"study '{study['study_name']}' is in {study['storage']}: pass --storage "
                         "with the password to merge the other processes' points")  # fmt: skip
            continue
        if not _study_reachable(study["storage"]):
            notes.append(f"study '{study['study_name']}' is not at {redact_url(study['storage'])}; "
                         "the report shows the results stored with this run")  # fmt: skip
            continue
        try:
            count = merge_points(model)
        except StudyStorageError as exc:
            notes.append(f"{exc}; the report shows the results stored with this run")
            continue
        added += count
        if count:
            notes.append(f"{model.spec.name}: {count} points measured by other processes sharing "
                         f"study '{study['study_name']}' merged into the results")  # fmt: skip
    if added:
        outcome.shared += added
        for model in outcome.models:
            if model.study:
                model.study = {**model.study, "storage": redact_url(model.study["storage"])}
        for model in outcome.models:
            ranker = Ranker(model.spec.objectives, model.spec.constraints, model.pareto)
            model.results = recommended_first(ranker.rank(model.results), model.comparison)
        results = export_path / "results"
        write_csvs(outcome, results)
        write_results(outcome, results)
    return notes
