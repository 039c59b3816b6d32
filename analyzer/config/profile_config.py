"""`model-analyzer profile` settings: NVIDIA Model Analyzer's flag names, YAML keys and defaults.

One declaration per setting (config/settings.py) drives the command line (config/flags.py), the
YAML file (the same keys in snake_case) and validation (config/values.py), so a key can never be
accepted in one place and refused in the other.
Precedence: defaults < YAML (`-f config.yaml`) < command line. Every bad key or value becomes one
ProfileConfigError that names the key (and the file) and the value.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.config.flags import parse_flags
from analyzer.config.ignored import IGNORED
from analyzer.config.ignored import note as ignored_note
from analyzer.config.model_specs import (
    ModelSpec,
    constraints,
    environment,
    model_specs,
    objectives,
    perf_flags,
    server_flags,
    with_budgets,
)
from analyzer.config.settings import Settings
from analyzer.config.values import BY_NAME, FIELDS, ProfileConfigError, convert
from analyzer.config.yaml_file import YamlFileError, read_user_yaml
from analyzer.cpulist import CpuListError, parse_cpu_list
from analyzer.metrics import OUTPUT_FIELDS

__all__ = ["ModelSpec", "ProfileConfig", "ProfileConfigError", "load_profile_config",
           "load_settings"]  # fmt: skip

STORAGE_VARIABLE = "MODEL_ANALYZER_STORAGE"
_PATHS = ("model_repository", "output_model_repository_path", "export_path",
          "checkpoint_directory", "search_space", "triton_output_path",
          "perf_output_path")  # fmt: skip


@dataclass(frozen=True)
class ProfileConfig(Settings):
    """The validated settings of one profile run (MA's names, snake_case), typed, with the models
    to profile and the notes the loader has for the user."""

    models: list[ModelSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_values(cls, values: dict[str, Any], models: list[ModelSpec] | None = None,
                    notes: list[str] | None = None) -> ProfileConfig:  # fmt: skip
        """From validated values (or a results file's settings: keys it does not know of are
        left out, and settings it lacks keep their defaults)."""
        known = {f.name for f in dataclasses.fields(Settings)}
        return cls(**{k: v for k, v in values.items() if k in known},
                   models=list(models or []), notes=list(notes or []))  # fmt: skip

    @property
    def values(self) -> dict[str, Any]:
        """The settings by name (the results file stores them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Settings)}

    @property
    def export(self) -> Path:
        return Path(self.export_path)

    @property
    def checkpoints(self) -> Path:
        return Path(str(self.checkpoint_directory))

    @property
    def output_repository(self) -> Path:
        return Path(self.output_model_repository_path)


def load_profile_config(argv: list[str], cwd: Path | None = None) -> ProfileConfig:
    """The settings of `model-analyzer profile ARGV`, read as the command reads them."""
    return load_settings(parse_flags(argv), cwd)


def load_settings(cli: dict[str, Any], cwd: Path | None = None) -> ProfileConfig:
    """Defaults, then the YAML file named by -f, then the flags given (`cli`); all validated."""
    cwd = cwd or Path.cwd()
    notes: list[str] = []
    where = "command line"
    raw: dict[str, Any] = {}
    if cli.get("config_file"):
        where = str(cli["config_file"])
        raw = _read_yaml(Path(cli["config_file"]), notes)
    notes += [ignored_note(k) for k in cli if k in IGNORED]
    cli = {k: v for k, v in cli.items() if k not in IGNORED}
    sources = {k: where for k in raw} | {k: "command line" for k in cli}
    raw |= cli
    values = {f.name: convert(f, raw[f.name], sources[f.name]) if f.name in raw
              else copy.deepcopy(f.default) for f in FIELDS}  # fmt: skip
    _objects(values, sources, notes)
    _check_ranges(values)
    notes += _unknown_output_fields(values, sources)
    if values["storage"] is None and storage_from_environment():
        values["storage"] = storage_from_environment()
        if values["run_config_search_mode"] == "optuna":
            notes.append(f"the Optuna storage is {STORAGE_VARIABLE}'s (its password is not shown)")
    if values["model_repository"] is None:
        raise ProfileConfigError("'model_repository' is required (--model-repository or -m)")
    for key in _PATHS:
        if values[key] is not None:
            values[key] = str((cwd / os.path.expanduser(values[key])).resolve())
    if values["checkpoint_directory"] is None:
        values["checkpoint_directory"] = str(Path(values["export_path"]) / "checkpoints")
    if values["run_config_search_disable"] and not values["concurrency"] \
            and not values["request_rate"]:  # fmt: skip
        # MA's: with the search off and no load given, one point at concurrency 1 (request
        # rate 1 with request_rate_search_enable: search/space.load_levels), not a sweep
        values["concurrency"] = [1]
    models = model_specs(
        raw.get("profile_models"), values, sources.get("profile_models", where), notes
    )
    mode = raw.get("run_config_search_mode")
    if values["run_config_profile_models_concurrently_enable"] and len(models) > 1 \
            and mode in ("brute", "optuna"):  # fmt: skip
        notes.append(f"{sources['run_config_search_mode']}: run_config_search_mode {mode}: "
                     "models profiled together (run_config_profile_models_concurrently_enable) "
                     "are searched with the quick search, as MA's multi-model search is")
    return ProfileConfig.from_values(values, models, notes)


def _unknown_output_fields(values: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """A `*_output_fields` name that is no column of its table, said now rather than after the
    run; the CSV is written without it."""
    notes = []
    for key, known in OUTPUT_FIELDS.items():
        for tag in values[key] or []:
            if tag not in known:
                notes.append(f"{sources[key]}: '{key}' names '{tag}', which is not a column of "
                             f"that table; it is left out (known: {', '.join(sorted(known))})")
    return notes


def _read_yaml(path: Path, notes: list[str]) -> dict[str, Any]:
    """The settings of a YAML file; MA keys that mean nothing here become notes."""
    try:
        loaded = read_user_yaml(path, "config file")
    except YamlFileError as err:
        raise ProfileConfigError(str(err)) from None
    if not isinstance(loaded, dict):
        raise ProfileConfigError(f"config file '{path}' must be a mapping of settings")
    raw: dict[str, Any] = {}
    for key, value in loaded.items():
        if key in IGNORED:
            notes.append(ignored_note(key))
        elif key not in BY_NAME or key == "config_file":
            raise ProfileConfigError(f"{path}: key '{key}' is not a profile setting")
        else:
            raw[key] = value
    return raw


def _objects(values: dict[str, Any], sources: dict[str, str], notes: list[str]) -> None:
    """The YAML-only objects validated; the latency budget and throughput floor as constraints."""
    values["objectives"] = objectives(
        values["objectives"], sources.get("objectives", "defaults")
    ) or {"perf_throughput": 10.0}
    values["constraints"] = constraints(
        values["constraints"], sources.get("constraints", "defaults")
    )
    values["perf_analyzer_flags"] = perf_flags(
        values["perf_analyzer_flags"], sources.get("perf_analyzer_flags", "defaults"), notes
    )
    values["triton_server_flags"] = server_flags(
        values["triton_server_flags"] or None,
        sources.get("triton_server_flags", "defaults") + ": triton_server_flags")
    values["triton_server_environment"] = environment(
        values["triton_server_environment"] or None,
        sources.get("triton_server_environment", "defaults") + ": triton_server_environment")
    values["constraints"] = with_budgets(values["constraints"], values)


def storage_from_environment() -> str | None:
    """The storage URL in MODEL_ANALYZER_STORAGE, used when none is given: the environment,
    unlike argv, is not readable by every local user through `ps`."""
    return os.environ.get(STORAGE_VARIABLE) or None


MAX_CLIENT_PROCESSES = 256  # load-generator processes one profile may start
_FILE_NAME_KEYS = ("filename_model_inference", "filename_model_gpu", "filename_server_only")


def _check_file_names(values: dict[str, Any]) -> None:
    """The CSVs' names are file names inside EXPORT_PATH/results, each its own: a path there
    once overwrote whatever it named (a model's config.pbtxt), and two equal names lost a CSV."""
    taken = {"profile_results.json": "the results file"}
    for key in _FILE_NAME_KEYS:
        name = values[key]
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ProfileConfigError(
                f"'{key}' is {name!r}; expected a plain file name, which is written inside "
                "EXPORT_PATH/results"
            )
        if name in taken:
            raise ProfileConfigError(f"'{key}' is '{name}', the name of {taken[name]} too; "
                                     "give each output file its own name")  # fmt: skip
        taken[name] = f"'{key}'"


def _check_ranges(values: dict[str, Any]) -> None:
    for what in ("concurrency", "request_rate", "model_batch_size", "instance_count"):
        low = values[f"run_config_search_min_{what}"]
        high = values[f"run_config_search_max_{what}"]
        if low < 1 or high < low:
            raise ProfileConfigError(
                f"run_config_search_min_{what} ({low}) must be >= 1 and <= "
                f"run_config_search_max_{what} ({high})"
            )
    if not 0 < values["stability_percentage"] <= 1000:
        raise ProfileConfigError(
            f"'stability_percentage' is {values['stability_percentage']}; expected (0, 1000]"
        )
    low, high = values["optuna_min_trials"], values["optuna_max_trials"]
    if low is not None and low > high:
        raise ProfileConfigError(f"'optuna_min_trials' ({low}) is more than 'optuna_max_trials' "
                                 f"({high})")  # fmt: skip
    low, high = (values["min_percentage_of_search_space"],
                 values["max_percentage_of_search_space"])  # fmt: skip
    if low > high or high > 100:
        raise ProfileConfigError(f"'min_percentage_of_search_space' ({low:g}) and "
                                 f"'max_percentage_of_search_space' ({high:g}) must be in order, "
                                 "up to 100")  # fmt: skip
    for key in ("server_startup_timeout", "model_load_timeout"):
        if values[key] <= 0:
            raise ProfileConfigError(f"'{key}' is {values[key]}; expected seconds > 0")
    if values["client_processes"] > MAX_CLIENT_PROCESSES:  # 100000 hung at the worker's start
        raise ProfileConfigError(f"'client_processes' is {values['client_processes']}; expected "
                                 f"0 (grow as needed) to {MAX_CLIENT_PROCESSES}")  # fmt: skip
    for key in ("measurement_interval", "max_trials", "num_configs_per_model"):
        if values[key] < 1:
            raise ProfileConfigError(f"'{key}' is {values[key]}; expected >= 1")
    for key in ("worker_cpus", "client_cpus"):
        if values[key] not in ("", "all"):
            try:
                parse_cpu_list(values[key], key)
            except CpuListError as err:
                raise ProfileConfigError(str(err)) from None
    _check_file_names(values)
    rounds = values["final_rounds"]  # None: calibrated
    if rounds is not None and (rounds == 1 or rounds < 0):
        raise ProfileConfigError(
            f"'final_rounds' is {values['final_rounds']}; expected 0 (no final comparison) or >= 2"
        )
