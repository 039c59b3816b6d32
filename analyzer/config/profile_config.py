"""`model-analyzer profile` settings: NVIDIA Model Analyzer's flag names, YAML keys and defaults.

One declaration per setting (config/settings.py, read here as FIELDS) drives the command line
(`--kebab-case` flags), the YAML file (the same keys in snake_case) and validation, so a key can
never be accepted in one place and refused in the other.
Precedence: defaults < YAML (`-f config.yaml`) < command line. Every bad key or value becomes one
ProfileConfigError that names the key (and the file) and the value.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from analyzer.config.settings import Settings
from analyzer.cpulist import CpuListError, parse_cpu_list
from analyzer.errors import AnalyzerError
from analyzer.results.metrics import DIRECTIONS


class ProfileConfigError(AnalyzerError):
    """A profile setting is unknown or has a bad value; the message names it."""


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # str | path | int | float | bool | ints | strs | multi | choice | object
    default: Any = None
    help: str = ""
    flags: tuple[str, ...] = ()  # extra short flags, e.g. ("-m",)
    choices: tuple[str, ...] = ()
    cli: bool = True  # objects (objectives, constraints, ...) are YAML-only, as in MA


def _field(f: dataclasses.Field[Any]) -> Field:
    m = f.metadata
    if m["kind"] == "object":  # YAML-only objects: None = not given, normalised by the loader
        default = None
    else:
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    return Field(f.name, m["kind"], default, m["help"], m["flags"], m["choices"], m["cli"])


# the loader's view of Settings (config/settings.py), where every setting is declared
FIELDS: tuple[Field, ...] = tuple(_field(f) for f in dataclasses.fields(Settings))

# MA keys that mean nothing here: accepted so an MA config file works, with a note saying why.
IGNORED = {
    "perf_analyzer_path": "the load generator is built in",
    "perf_analyzer_timeout": "the load generator is built in",
    "perf_analyzer_cpu_util": "the load generator measures its own CPU use",
    "perf_analyzer_max_auto_adjusts": "the load generator is built in",
    "perf_output": "the load generator is built in",
    "perf_output_path": "the load generator is built in",
    "triton_server_path": "the worker is model-analyzer serve",
    "triton_install_path": "the worker is model-analyzer serve",
    "triton_output_path": "the worker's log goes to EXPORT_PATH/logs",
    "dcgm_disable": "GPUs are read through NVML",
    "collect_cpu_metrics": "CPU metrics are always collected for a local worker",
    "duration_seconds": "points stop when stable",
    "client_max_retries": "requests are not retried",
    "reload_model_disable": "variants are always loaded fresh",
    "skip_summary_reports": "reports come with `model-analyzer report`",
    "skip_detailed_reports": "reports come with `model-analyzer report`",
    "always_report_gpu_metrics": "GPU metrics are reported whenever a GPU was sampled",
    "log_level": "output is fixed",
}

_BY_NAME = {f.name: f for f in FIELDS}
_MODEL_KEYS = {
    "cpu_only", "parameters", "objectives", "constraints", "weighting",
    "model_config_parameters", "perf_analyzer_flags", "triton_server_flags",
}  # fmt: skip
_PARAMETER_KEYS = {"batch_sizes", "concurrency", "request_rate"}


# perf_analyzer flag names accepted in perf_analyzer_flags -> what they set
PERF_FLAGS = {
    "shape", "input-data", "measurement-mode", "measurement-interval", "measurement-request-count",
    "stability-percentage", "max-trials", "percentile", "request-distribution", "string-length",
    "protocol", "batch-size",
}  # fmt: skip


@dataclass
class ModelSpec:
    """One model to profile and everything set for it alone."""

    name: str
    cpu_only: bool = False
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    concurrency: list[int] = field(default_factory=list)
    request_rate: list[int] = field(default_factory=list)
    objectives: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, dict[str, float]] = field(default_factory=dict)
    model_config_parameters: dict[str, Any] = field(default_factory=dict)
    perf_analyzer_flags: dict[str, Any] = field(default_factory=dict)
    triton_server_flags: dict[str, Any] = field(default_factory=dict)


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


# ---- command line -----------------------------------------------------------------------------
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def argument_parser(prog: str = "model-analyzer profile") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Search serving configs of the models, measure each, rank them and write "
        "the winners (NVIDIA Model Analyzer's flags; the same keys in snake_case in -f YAML).",
        argument_default=argparse.SUPPRESS,
    )
    for f in FIELDS:
        if not f.cli:
            continue
        names = [*f.flags, _flag(f.name)]
        if f.kind == "bool":
            # MA: a bare switch sets true; `--flag=false` is accepted too
            parser.add_argument(*names, dest=f.name, nargs="?", const="true", help=f.help)
        elif f.kind == "multi":
            parser.add_argument(*names, dest=f.name, action="append", help=f.help,
                                metavar="VALUE")  # fmt: skip
        else:
            parser.add_argument(*names, dest=f.name, help=f.help, metavar=f.kind.upper())
    return parser


def parse_cli(argv: list[str]) -> dict[str, Any]:
    """Flags given on the command line, as raw strings (validated with the YAML values)."""

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one sentence, not usage + exit 2
            raise ProfileConfigError(f"command line: {message}")

    parser = argument_parser()
    parser.__class__ = _Parser
    return vars(parser.parse_args(argv))


# ---- values -----------------------------------------------------------------------------------
def _convert(f: Field, value: Any, where: str) -> Any:
    def bad(expected: str) -> ProfileConfigError:
        return ProfileConfigError(f"{where}: '{f.name}' is {value!r}; expected {expected}")

    if value is None:
        return None
    if f.kind in ("str", "path"):
        if isinstance(value, bool | dict | list):
            raise bad("a string")
        return str(value)
    if f.kind == "choice":
        text = str(value).strip().lower()
        if text not in f.choices:
            raise bad("one of " + ", ".join(f.choices))
        return text
    if f.kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise bad("true or false")
    if f.kind in ("int", "float"):
        kind = int if f.kind == "int" else float
        if isinstance(value, bool):
            raise bad(f"a number ({f.kind})")
        try:
            number = kind(value) if not isinstance(value, str) else kind(value.strip())
        except (TypeError, ValueError):
            raise bad(f"a number ({f.kind})") from None
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise bad("a whole number")
        if number < 0:
            raise bad("a number >= 0")
        return number
    if f.kind == "multi":
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str | int) for v in items):
            raise bad("a string or a list of strings")
        return [str(v) for v in items]
    if f.kind in ("ints", "strs"):
        return _as_list(f.name, value, int if f.kind == "ints" else str, where)
    if f.kind == "mapping":
        return _as_mapping(value, bad)
    return value  # objects are validated where they are interpreted


def _as_mapping(value: Any, bad: Callable[[str], ProfileConfigError]) -> dict[str, Any]:
    """A YAML mapping, or on the command line a JSON object or k=v,k2=v2."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, str):
        raise bad("a mapping")
    text = value.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            raise bad("a JSON object") from None
        if not isinstance(parsed, dict):
            raise bad("a JSON object")
        return parsed
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise bad("k=v pairs separated by commas, or a JSON object")
        out[key.strip()] = val.strip()
    return out


def _as_list(name: str, value: Any, kind: type, where: str) -> list[Any]:
    """MA list syntax: a list, a comma-separated string, one value, or {start, stop, step}."""
    if isinstance(value, dict):
        try:
            start, stop = int(value["start"]), int(value["stop"])
            step = int(value.get("step", 1))
        except (KeyError, TypeError, ValueError):
            raise ProfileConfigError(
                f"{where}: '{name}' is {value!r}; a range needs integer start, stop (and step)"
            ) from None
        if step <= 0 or stop < start:
            raise ProfileConfigError(f"{where}: '{name}' range {value!r} is empty")
        return list(range(start, stop + 1, step))
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        items = [items]
    out: list[Any] = []
    for item in items:
        text = str(item).strip()
        if kind is int:
            try:
                number = int(text)
            except ValueError:
                raise ProfileConfigError(
                    f"{where}: '{name}' has {item!r}; expected whole numbers"
                ) from None
            if number <= 0:
                raise ProfileConfigError(f"{where}: '{name}' has {number}; values must be > 0")
            out.append(number)
        elif text:
            out.append(text)
    if not out:
        raise ProfileConfigError(f"{where}: '{name}' is empty")
    return out


def _objectives(value: Any, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list):
        value = {str(v): 1 for v in value}
    if not isinstance(value, dict) or not value:
        raise ProfileConfigError(f"{where}: 'objectives' is {value!r}; expected tag: weight pairs")
    out = {}
    for tag, weight in value.items():
        if tag not in DIRECTIONS:
            raise ProfileConfigError(
                f"{where}: objective '{tag}' is unknown; known: {', '.join(DIRECTIONS)}"
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ProfileConfigError(
                f"{where}: objective '{tag}' has weight {weight!r}; expected a number > 0"
            )
        out[tag] = float(weight)
    return out


def _constraints(value: Any, where: str) -> dict[str, dict[str, float]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileConfigError(f"{where}: 'constraints' is {value!r}; expected a mapping")
    out: dict[str, dict[str, float]] = {}
    for tag, bounds in value.items():
        if tag not in DIRECTIONS:
            raise ProfileConfigError(
                f"{where}: constraint '{tag}' is unknown; known: {', '.join(DIRECTIONS)}"
            )
        if not isinstance(bounds, dict) or not bounds or set(bounds) - {"min", "max"}:
            raise ProfileConfigError(
                f"{where}: constraint '{tag}' is {bounds!r}; expected {{min: N}} and/or {{max: N}}"
            )
        for key, number in bounds.items():
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise ProfileConfigError(
                    f"{where}: constraint '{tag}.{key}' is {number!r}; expected a number"
                )
        out[tag] = {k: float(v) for k, v in bounds.items()}
    return out


def _perf_flags(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileConfigError(f"{where}: 'perf_analyzer_flags' is {value!r}; expected a mapping")
    for key in value:
        if key not in PERF_FLAGS:
            raise ProfileConfigError(
                f"{where}: perf_analyzer_flags key '{key}' is not supported; supported: "
                + ", ".join(sorted(PERF_FLAGS))
            )
    return dict(value)


def _model_specs(
    raw: Any, values: dict[str, Any], where: str, notes: list[str]
) -> list[ModelSpec]:
    if raw is None:
        raise ProfileConfigError(f"{where}: 'profile_models' is required (which models to profile)")
    if isinstance(raw, str):
        raw = [m.strip() for m in raw.split(",") if m.strip()]
    if isinstance(raw, list):
        entries: dict[str, Any] = {}
        for item in raw:
            if isinstance(item, dict):
                entries.update(item)
            else:
                entries[str(item)] = {}
        raw = entries
    if not isinstance(raw, dict) or not raw:
        raise ProfileConfigError(f"{where}: 'profile_models' is {raw!r}; expected model names")
    specs = []
    for name, params in raw.items():
        params = params or {}
        here = f"{where}: profile_models.{name}"
        if not isinstance(params, dict):
            raise ProfileConfigError(f"{here} is {params!r}; expected a mapping")
        unknown = set(params) - _MODEL_KEYS
        if unknown:
            raise ProfileConfigError(
                f"{here}: key '{sorted(unknown)[0]}' is unknown; known: "
                + ", ".join(sorted(_MODEL_KEYS))
            )
        parameters = params.get("parameters") or {}
        if not isinstance(parameters, dict) or set(parameters) - _PARAMETER_KEYS:
            raise ProfileConfigError(
                f"{here}.parameters is {parameters!r}; keys: {', '.join(sorted(_PARAMETER_KEYS))}"
            )
        mcp = params.get("model_config_parameters") or {}
        if not isinstance(mcp, dict):
            raise ProfileConfigError(
                f"{here}.model_config_parameters is {mcp!r}; expected a mapping"
            )
        cpu_only = _convert(_BY_NAME["cpu_only"], params.get("cpu_only", values["cpu_only"]), here)
        if "weighting" in params:
            notes.append(f"profile_models.{name}.weighting has no effect here: it weights models "
                         "profiled concurrently, and models are profiled one after another")
        spec = ModelSpec(
            name=str(name),
            cpu_only=cpu_only,
            batch_sizes=_as_list("batch_sizes", parameters["batch_sizes"], int, here)
            if "batch_sizes" in parameters else list(values["batch_sizes"]),
            concurrency=_as_list("concurrency", parameters["concurrency"], int, here)
            if "concurrency" in parameters else list(values["concurrency"] or []),
            request_rate=_as_list("request_rate", parameters["request_rate"], int, here)
            if "request_rate" in parameters else list(values["request_rate"] or []),
            objectives=_objectives(params["objectives"], here) if "objectives" in params
            else dict(values["objectives"]),
            constraints=_constraints(params["constraints"], here) if "constraints" in params
            else {k: dict(v) for k, v in values["constraints"].items()},
            model_config_parameters=mcp,
            perf_analyzer_flags={**values["perf_analyzer_flags"],
                                 **_perf_flags(params.get("perf_analyzer_flags"), here)},
            triton_server_flags=dict(params.get("triton_server_flags") or {}),
        )  # fmt: skip
        specs.append(spec)
    return specs


def load_profile_config(argv: list[str], cwd: Path | None = None) -> ProfileConfig:
    """Defaults, then the YAML file named by -f, then the command line; all validated."""
    cwd = cwd or Path.cwd()
    cli = parse_cli(argv)
    raw: dict[str, Any] = {}
    notes: list[str] = []
    where = "command line"
    if cli.get("config_file"):
        path = Path(cli["config_file"])
        where = str(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise ProfileConfigError(
                f"config file '{path}' cannot be read: {err.strerror}"
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = f" at line {mark.line + 1}" if mark else ""
            raise ProfileConfigError(f"config file '{path}' is not valid YAML{line}") from None
        if not isinstance(loaded, dict):
            raise ProfileConfigError(f"config file '{path}' must be a mapping of settings")
        for key, value in loaded.items():
            if key in IGNORED:
                notes.append(f"'{key}' has no effect here: {IGNORED[key]}")
            elif key not in _BY_NAME or key == "config_file":
                raise ProfileConfigError(f"{path}: key '{key}' is not a profile setting")
            else:
                raw[key] = value
    sources = {k: where for k in raw}
    for key, value in cli.items():
        raw[key] = value
        sources[key] = "command line"

    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.name in raw:
            values[f.name] = _convert(f, raw[f.name], sources[f.name])
        else:
            values[f.name] = copy.deepcopy(f.default)  # a list or dict of this run alone
    for key in ("objectives", "constraints", "perf_analyzer_flags", "triton_server_flags"):
        src = sources.get(key, "defaults")
        if key == "objectives":
            values[key] = _objectives(values[key], src) or {"perf_throughput": 10.0}
        elif key == "constraints":
            values[key] = _constraints(values[key], src)
        elif key == "perf_analyzer_flags":
            values[key] = _perf_flags(values[key], src)
        else:
            values[key] = dict(values[key] or {})
    if values["latency_budget"] is not None:
        values["constraints"].setdefault("perf_latency_p99", {})["max"] = values["latency_budget"]
    if values["min_throughput"] is not None:
        values["constraints"].setdefault("perf_throughput", {})["min"] = values["min_throughput"]
    _check_ranges(values)
    if values["storage"] is None and storage_from_environment():
        values["storage"] = storage_from_environment()
        if values["run_config_search_mode"] == "optuna":
            notes.append(f"the Optuna storage is {STORAGE_VARIABLE}'s (its password is not shown)")
    if values["model_repository"] is None:
        raise ProfileConfigError("'model_repository' is required (--model-repository or -m)")
    for key in ("model_repository", "output_model_repository_path", "export_path",
                "checkpoint_directory", "search_space"):  # fmt: skip
        if values[key] is not None:
            values[key] = str((cwd / os.path.expanduser(values[key])).resolve())
    if values["checkpoint_directory"] is None:
        values["checkpoint_directory"] = str(Path(values["export_path"]) / "checkpoints")
    models = _model_specs(
        raw.get("profile_models"), values, sources.get("profile_models", where), notes
    )
    return ProfileConfig.from_values(values, models, notes)


STORAGE_VARIABLE = "MODEL_ANALYZER_STORAGE"


def storage_from_environment() -> str | None:
    """The storage URL in MODEL_ANALYZER_STORAGE, used when none is given: the environment,
    unlike argv, is not readable by every local user through `ps`."""
    return os.environ.get(STORAGE_VARIABLE) or None


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
    for key in ("measurement_interval", "max_trials", "num_configs_per_model"):
        if values[key] < 1:
            raise ProfileConfigError(f"'{key}' is {values[key]}; expected >= 1")
    for key in ("worker_cpus", "client_cpus"):
        if values[key] not in ("", "all"):
            try:
                parse_cpu_list(values[key], key)
            except CpuListError as err:
                raise ProfileConfigError(str(err)) from None
    rounds = values["final_rounds"]  # None: calibrated
    if rounds is not None and (rounds == 1 or rounds < 0):
        raise ProfileConfigError(
            f"'final_rounds' is {values['final_rounds']}; expected 0 (no final comparison) or >= 2"
        )
