"""The models to profile (`profile_models`) and what is set for each alone: its parameters,
objectives, constraints, model_config_parameters and load-generator flags (MA's YAML)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from analyzer.config.values import BY_NAME, ProfileConfigError, as_list, convert
from analyzer.metrics import DIRECTIONS
from analyzer.tls import SSL_FLAGS

_MODEL_KEYS = {
    "cpu_only", "parameters", "objectives", "constraints", "weighting",
    "model_config_parameters", "perf_analyzer_flags", "triton_server_flags",
    "triton_server_environment", "triton_docker_args", "genai_perf_flags",
}  # fmt: skip
_PARAMETER_KEYS = {"batch_sizes", "concurrency", "request_rate"}

# perf_analyzer flag names accepted in perf_analyzer_flags -> what they set
PERF_FLAGS = {
    "shape", "input-data", "measurement-mode", "measurement-interval", "measurement-request-count",
    "stability-percentage", "max-trials", "percentile", "request-distribution", "string-length",
    "protocol", "batch-size", "num-of-sequences", "sequence-length", "sequence-id-range",
    "streaming", "http-header", "shared-memory", "output-shared-memory-size", "max-threads",
    "async", *SSL_FLAGS,
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
    # one worker serves every model of a run: these are merged, the run's own settings last
    triton_server_environment: dict[str, str] = field(default_factory=dict)
    triton_docker_args: dict[str, Any] = field(default_factory=dict)
    weighting: float = 1.0  # its weight among models profiled together (MA's weighting)


def objectives(value: Any, where: str) -> dict[str, float]:
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
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            0 < weight < math.inf
        ):  # (nan fails both comparisons)
            raise ProfileConfigError(
                f"{where}: objective '{tag}' has weight {weight!r}; expected a number > 0"
            )
        out[tag] = float(weight)
    return out


def constraints(value: Any, where: str) -> dict[str, dict[str, float]]:
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
            if isinstance(number, bool) or not isinstance(number, int | float) or not (
                math.isfinite(number)
            ):
                raise ProfileConfigError(
                    f"{where}: constraint '{tag}.{key}' is {number!r}; expected a finite number"
                )
        if bounds.get("min", -math.inf) > bounds.get("max", math.inf):
            raise ProfileConfigError(f"{where}: constraint '{tag}' has min {bounds['min']} over "
                                     f"max {bounds['max']}; no config could meet it")  # fmt: skip
        out[tag] = {k: float(v) for k, v in bounds.items()}
    return out


_SET_PER_POINT = "the profiler sets it for each point"
# MA 1.58's other perf_analyzer_flags keys: accepted, each with what happens instead
PERF_FLAG_NOTES = {
    "sync": "requests are sent asynchronously (as with async), each concurrency slot one request "
            "at a time: the same closed loop at the load asked as sync mode's threads",
    "latency-threshold": "each point is one load level, as MA runs perf_analyzer, so there is no "
                         "perf_analyzer sweep to stop (latency_budget and early_exit_enable are "
                         "the search's)",
    "binary-search": "the search's load sweep replaces it (run_config_search_max_binary_search_"
                     "steps)",
    "concurrency-range": "the load comes from concurrency / the search",
    "request-rate-range": "the load comes from request_rate / the search",
    "request-intervals": "the load comes from concurrency or request_rate",
    "service-kind": "the worker is served over Triton's protocols (service kind triton)",
    "model-signature-name": "the worker is served over Triton's protocols (service kind triton)",
    "triton-server-directory": "the worker is served over Triton's protocols (no C API)",
    "model-repository": "the worker is served over Triton's protocols (no C API)",
    "string-data": "string inputs are random of string-length",
    "grpc-compression-algorithm": "requests are not compressed",
    "collect-metrics": "GPU and CPU metrics are sampled by the profiler (monitoring_interval)",
    "metrics-url": "GPU and CPU metrics are sampled by the profiler (monitoring_interval)",
    "metrics-interval": "GPU and CPU metrics are sampled by the profiler (monitoring_interval)",
    "bls-composing-models": "set bls_composing_models instead",
    "model-name": _SET_PER_POINT, "model-version": _SET_PER_POINT, "url": _SET_PER_POINT,
    "latency-report-file": "results go to EXPORT_PATH/results",
    "verbose": "use -v", "extra-verbose": "use -v", "verbose-csv": "use -v",
}  # fmt: skip


def perf_flags(value: Any, where: str, notes: list[str] | None = None) -> dict[str, Any]:
    """MA's perf_analyzer_flags: those the load generator honours, kept; MA's others noted in
    `notes` (what happens instead) and dropped; any other key is an error naming it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileConfigError(f"{where}: 'perf_analyzer_flags' is {value!r}; expected a mapping")
    for key in value:
        if key not in PERF_FLAGS and key not in PERF_FLAG_NOTES:
            raise ProfileConfigError(
                f"{where}: perf_analyzer_flags key '{key}' is not a perf_analyzer flag MA passes; "
                "honoured here: " + ", ".join(sorted(PERF_FLAGS))
            )
        if key in PERF_FLAG_NOTES and notes is not None:
            notes.append(f"perf_analyzer_flags '{key}' has no effect here: {PERF_FLAG_NOTES[key]}")
    return {k: v for k, v in value.items() if k in PERF_FLAGS}


def model_specs(
    raw: Any, values: dict[str, Any], where: str, notes: list[str]
) -> list[ModelSpec]:
    """`profile_models` as a name list, a comma-separated string or a mapping of name to
    per-model settings; what a model does not set comes from the run's `values`."""
    if raw is None:
        raise ProfileConfigError(f"{where}: 'profile_models' is required (which models to profile)")
    if isinstance(raw, str):
        raw = [m.strip() for m in raw.split(",") if m.strip()]
    if isinstance(raw, list):
        entries: dict[str, Any] = {}
        for item in raw:
            if isinstance(item, dict):
                entries.update(item)
            elif isinstance(item, str | int) and not isinstance(item, bool):
                entries[str(item)] = {}
            else:  # [null] was a model named 'None', [[a]] one named "['a']"
                raise ProfileConfigError(f"{where}: 'profile_models' has {item!r}; expected "
                                         "model names")  # fmt: skip
        raw = entries
    if not isinstance(raw, dict) or not raw or not all(
        isinstance(k, str | int) and not isinstance(k, bool) and str(k) for k in raw
    ):
        raise ProfileConfigError(f"{where}: 'profile_models' is {raw!r}; expected model names")
    return [_model_spec(str(name), params or {}, values, f"{where}: profile_models.{name}", notes)
            for name, params in raw.items()]  # fmt: skip


def _model_spec(
    name: str, params: Any, values: dict[str, Any], here: str, notes: list[str]
) -> ModelSpec:
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
        raise ProfileConfigError(f"{here}.model_config_parameters is {mcp!r}; expected a mapping")
    if "max_batch_size" in mcp:  # (a word there was a traceback after the default's measurement)
        sizes = mcp["max_batch_size"]
        for size in sizes if isinstance(sizes, list) else [sizes]:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ProfileConfigError(f"{here}.model_config_parameters.max_batch_size has "
                                         f"{size!r}; expected whole numbers >= 0")  # fmt: skip
    _check_model_config_parameters(mcp, here)
    others = [k for k in mcp if k not in ("max_batch_size", "instance_group", "dynamic_batching")]
    if others and values["run_config_search_mode"] in ("quick", "optuna"):
        notes.append(f"{here}.model_config_parameters: {', '.join(others)} only vary in brute "
                     "mode; quick and optuna search the max_batch_size, instance_group count "
                     "and max_queue_delay_microseconds values listed")  # fmt: skip
    weighting = params.get("weighting", 1)
    if isinstance(weighting, bool) or not isinstance(weighting, int | float) or not (
        0 < weighting < math.inf
    ):
        raise ProfileConfigError(f"{here}.weighting is {weighting!r}; expected a number > 0 (the "
                                 "model's weight when models are profiled together)")  # fmt: skip
    if "weighting" in params and not values["run_config_profile_models_concurrently_enable"]:
        notes.append(f"profile_models.{name}.weighting has no effect here: it weights models "
                     "profiled together (run_config_profile_models_concurrently_enable), and "
                     "these are profiled one after another")  # fmt: skip
    if "genai_perf_flags" in params:
        notes.append(f"profile_models.{name}.genai_perf_flags has no effect here: LLM profiling "
                     "with genai-perf is not built in")
    docker_args = params.get("triton_docker_args") or {}
    if not isinstance(docker_args, dict):
        raise ProfileConfigError(f"{here}.triton_docker_args is {docker_args!r}; expected a "
                                 "mapping of docker arguments")  # fmt: skip

    def listed(key: str) -> list[int]:
        if key in parameters:
            return as_list(key, parameters[key], int, here)
        return list(values[key] or [])

    # a model's own perf_analyzer_flags replace the run's, as MA's parser does
    pflags = (perf_flags(params["perf_analyzer_flags"], here, notes)
              if params.get("perf_analyzer_flags") is not None
              else dict(values["perf_analyzer_flags"]))  # fmt: skip
    concurrency, request_rate = listed("concurrency"), listed("request_rate")
    if concurrency and request_rate:  # one load drives a model (MA refuses both too)
        raise ProfileConfigError(f"{here}: both concurrency {concurrency} and request_rate "
                                 f"{request_rate} are given; a model's load is one of them")
    batch_sizes = listed("batch_sizes")
    if "batch_sizes" not in parameters and "batch-size" in pflags:  # perf_analyzer's -b
        batch_sizes = as_list("perf_analyzer_flags batch-size", pflags["batch-size"], int, here)
    return ModelSpec(
        name=name,
        cpu_only=convert(BY_NAME["cpu_only"], params.get("cpu_only", values["cpu_only"]), here),
        batch_sizes=batch_sizes,
        concurrency=concurrency,
        request_rate=request_rate,
        objectives=objectives(params["objectives"], here) if "objectives" in params
        else dict(values["objectives"]),
        constraints=with_budgets(constraints(params["constraints"], here), values)
        if "constraints" in params else {k: dict(v) for k, v in values["constraints"].items()},
        model_config_parameters=mcp,
        perf_analyzer_flags=pflags,
        triton_server_flags=server_flags(params.get("triton_server_flags"),
                                         f"{here}.triton_server_flags"),
        triton_server_environment=environment(params.get("triton_server_environment"),
                                              f"{here}.triton_server_environment"),
        triton_docker_args=dict(docker_args),
        weighting=float(weighting),
    )  # fmt: skip


def with_budgets(own: dict[str, dict[str, float]],
                  values: dict[str, Any]) -> dict[str, dict[str, float]]:  # fmt: skip
    """latency_budget and min_throughput as constraints in `own`: the run's, and every model's
    own too, as MA applies them."""
    if values["latency_budget"] is not None:
        own.setdefault("perf_latency_p99", {})["max"] = float(values["latency_budget"])
    if values["min_throughput"] is not None:
        own.setdefault("perf_throughput", {})["min"] = float(values["min_throughput"])
    return own


def server_flags(value: Any, where: str) -> dict[str, Any]:
    """MA's triton_server_flags: flag names to values (a list or a word was a traceback)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ProfileConfigError(f"{where} is {value!r}; expected a mapping of server flag names "
                                 "to values")  # fmt: skip
    return dict(value)


def environment(value: Any, where: str) -> dict[str, str]:
    """MA's triton_server_environment: variable names to scalar values, as strings."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProfileConfigError(f"{where} is {value!r}; expected a mapping of environment "
                                 "variable names to values")  # fmt: skip
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or "=" in key \
                or not isinstance(item, str | int | float | bool):  # fmt: skip
            raise ProfileConfigError(f"{where}: {key!r}: {item!r} is not a variable name and a "
                                     "value")  # fmt: skip
        out[key] = str(item).lower() if isinstance(item, bool) else str(item)
    return out


def _check_model_config_parameters(mcp: dict[str, Any], here: str) -> None:
    """Every choice of every field must be a valid ModelConfig field and value: a misspelt
    field or enum name made each combination fail, and the run profiled the default config
    alone and called it the best."""
    from analyzer.repository.variants import VariantError, check_parameter, close_field
    from analyzer.search.brute import expand_manual

    for key, value in mcp.items():
        for choice in expand_manual(value):
            try:
                check_parameter(key, choice)
            except VariantError as err:
                hint = close_field(key) if "is not a field of" in str(err) else ""
                raise ProfileConfigError(f"{here}.{err}{hint}") from None
