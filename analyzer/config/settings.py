"""The settings of `model-analyzer profile`, typed: one frozen dataclass whose fields carry their
kind, help text, extra flags, choices and whether the command line has them as metadata. The flag
(`--kebab-case`), the YAML key (snake_case) and MA's name are the field's name; the loader in
profile_config.py builds the command line and reads the YAML from `dataclasses.fields(Settings)`,
so a setting is declared once, here.

Kinds: str, path (resolved against the working directory), int, float, bool, ints, strs
(comma-separated or YAML lists), choice, mapping (k=v,... or a JSON object), multi (a repeated
flag), object (YAML only: objectives, constraints, perf_analyzer_flags, ...).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


def setting(kind: str, default: Any = None, help: str = "", flags: tuple[str, ...] = (),
            choices: tuple[str, ...] = (), cli: bool = True) -> Any:  # fmt: skip
    """A Settings field: its default and, as metadata, what the loader needs to know of it."""
    meta = {"kind": kind, "help": help, "flags": flags, "choices": choices, "cli": cli}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Every profile setting, with MA's names and defaults (ours where MA has none)."""

    quiet: bool = setting("bool", False, "Suppress all output except error messages (MA's).",
                          flags=("-q",))
    verbose: bool = setting("bool", False,
        "Show detailed messages: every point's server-side times, batch, CI and client CPU "
        "(MA's).", flags=("-v",))
    config_file: str | None = setting("path", None,
        "YAML file with these settings in snake_case.", flags=("-f",))
    model_repository: str | None = setting("path", None,
        "Triton model repository to profile.", flags=("-m",))
    profile_models: Any = setting("object", None,
        "Models to profile: a comma-separated list (YAML: a list, or a mapping with per-model "
        "parameters, model_config_parameters, constraints, objectives, perf_analyzer_flags).")
    triton_launch_mode: str = setting("choice", "local",
        "How the serving worker runs.", choices=("local", "docker", "remote"))
    output_model_repository_path: str = setting("path", "./output_models",
        "Where every measured config is written as a ready-to-serve model folder.")
    override_output_model_repository: bool = setting("bool", False,
        "Replace an existing output model repository instead of refusing to.")
    export_path: str = setting("path", ".",
        "Folder for results/, checkpoints/ and logs/.", flags=("-e",))
    checkpoint_directory: str | None = setting("path", None,
        "Checkpoint folder (default EXPORT_PATH/checkpoints); rerunning resumes from it.",
        flags=("-s",))
    skip_summary_reports: bool = setting("bool", False,
        "Write no summary report (MA's); `model-analyzer report` can still make it.")
    skip_detailed_reports: bool = setting("bool", False,
        "Write no detailed reports (MA's); `model-analyzer report` can still make them.")
    perf_output: bool = setting("bool", False,
        "Write the load generator's report of every point, in perf_analyzer's words, to "
        "perf_output_path, or to stdout without one (MA's).")
    perf_output_path: str | None = setting("path", None,
        "File that perf_output appends to (MA's).")
    duration_seconds: float | None = setting("float", None,
        "Seconds of the idle server's GPU metrics (MA's server-only metrics) at each worker "
        "start when a GPU is sampled (default 0.5 s, or 3 monitoring intervals).", flags=("-d",))
    triton_output_path: str | None = setting("path", None,
        "File the local or docker worker's output is appended to (MA's; default "
        "EXPORT_PATH/logs/worker.log).")
    filename_model_inference: str = setting("str", "metrics-model-inference.csv", "CSV file name.")
    filename_model_gpu: str = setting("str", "metrics-model-gpu.csv", "CSV file name.")
    filename_server_only: str = setting("str", "metrics-server-only.csv", "CSV file name.")
    inference_output_fields: list[str] | None = setting("strs", None,
        "Columns of the model inference CSV.")
    gpu_output_fields: list[str] | None = setting("strs", None, "Columns of the model GPU CSV.")
    server_output_fields: list[str] | None = setting("strs", None,
        "Columns of the server-only CSV.")
    run_config_search_mode: str = setting("choice", "brute",
        "Search strategy.", choices=("brute", "quick", "optuna"))
    run_config_search_disable: bool = setting("bool", False,
        "Measure only the model's own config (and model_config_parameters, if given); with no "
        "concurrency or request_rate given, at load 1 only, as MA does.")
    run_config_profile_models_concurrently_enable: bool = setting("bool", False,
        "Profile all models together on one worker, each driven by its own load at the same "
        "time: one quick search over every model's knobs, ranked by each model's objectives "
        "weighted by its weighting (MA's multi-model search).")
    run_config_search_min_concurrency: int = setting("int", 1, "Lowest concurrency swept.")
    run_config_search_max_concurrency: int = setting("int", 1024, "Highest concurrency swept.")
    run_config_search_min_request_rate: int = setting("int", 16, "Lowest request rate swept.")
    run_config_search_max_request_rate: int = setting("int", 8192, "Highest request rate swept.")
    run_config_search_min_model_batch_size: int = setting("int", 1, "Smallest max_batch_size.")
    run_config_search_max_model_batch_size: int = setting("int", 128, "Largest max_batch_size.")
    run_config_search_min_instance_count: int = setting("int", 1, "Fewest instances tried.")
    run_config_search_max_instance_count: int = setting("int", 5, "Most instances tried.")
    search_space: str | None = setting("path", None,
        "Search space YAML (default: search_spaces/default.yaml).")
    optuna_min_trials: int | None = setting("int", None,
        "Fewest Optuna trials (points) per model. Default: scaled to the space, a tenth of it "
        "within 10..20 (MA's fixed 20 is most of a small space's budget).")
    optuna_max_trials: int = setting("int", 200, "Most Optuna trials (points) per model.")
    optuna_early_exit_threshold: int = setting("int", 10,
        "Stop once the best has not improved for this many trials.")
    min_percentage_of_search_space: float = setting("float", 5.0,
        "Fewest trials as a percentage of the space.")
    max_percentage_of_search_space: float = setting("float", 10.0,
        "Most trials as a percentage of the space.")
    optuna_sampler: str = setting("choice", "tpe",
        "Optuna sampler.", choices=("tpe", "gp", "nsga2", "random"))
    optuna_objectives: list[str] | None = setting("strs", None,
        "Multi-objective study over these tags (e.g. perf_throughput,perf_latency_p99); default: "
        "one weighted objective.")
    storage: str | None = setting("str", None,
        "Optuna storage URL (default: sqlite in the checkpoint folder; postgresql://... to share "
        "one study between processes and hosts). Without this flag the URL is read from the "
        "environment variable MODEL_ANALYZER_STORAGE, if set: a password given that way does not "
        "appear in the process list. The URL is shown and stored without its password.")
    study_name: str | None = setting("str", None,
        "Optuna study name (default: model-analyzer-<model>).")
    concurrency: list[int] | None = setting("ints", None,
        "Concurrency values to measure (no sweep).", flags=("-c",))
    batch_sizes: list[int] = setting("ints", [1], "Client batch sizes (default 1).", flags=("-b",))
    request_rate: list[int] | None = setting("ints", None, "Request rates to measure (no sweep).")
    request_rate_search_enable: bool = setting("bool", False,
        "Sweep request rates, not concurrency.")
    early_exit_enable: bool = setting("bool", False,
        "Brute, as MA: fixed concurrency/request-rate values and client batch sizes stop once "
        "throughput plateaus, and model_config_parameters' larger max_batch_size values are "
        "skipped once one does not beat the smaller ones; also a sweep stops at the first point "
        "that breaks a latency constraint.")
    concurrency_sweep_disable: bool = setting("bool", False,
        "Quick and optuna: no full load sweep of the top configs after the search (MA's); the "
        "final comparison still re-measures them at their best point.")
    use_concurrency_formula: bool = setting("bool", False,
        "Optuna: each config at MA's concurrency formula (2 x max_batch_size x instances) instead"
        " of concurrency being a dimension of the study (MA's).")
    run_config_search_max_binary_search_steps: int = setting("int", 5,
        "Brute: after the search, the load of each top config (and the default) is bisected "
        "between its last point that meets the constraints and the first that does not, in at "
        "most this many points (MA's; 0: none). Not with fixed concurrency/request_rate.")
    objectives: dict[str, float] = setting("object", {},
        "Objectives with weights, e.g. {perf_throughput: 10, perf_latency_p99: 5}.", cli=False)
    constraints: dict[str, dict[str, float]] = setting("object", {},
        "Limits, e.g. {perf_latency_p99: {max: 50}, perf_throughput: {min: 100}}.", cli=False)
    latency_budget: float | None = setting("float", None, "p99 latency limit in ms (a constraint).")
    min_throughput: float | None = setting("float", None,
        "Throughput floor in infer/s (a constraint).")
    num_configs_per_model: int = setting("int", 3, "Top configs per model kept in the ranking.")
    num_top_model_configs: int = setting("int", 0, "Top configs across all models (0: per model).")
    final_rounds: int | None = setting("int", None,
        "Rounds of the final comparison: after the search the top configs and the default are "
        "measured again side by side, in this many interleaved rounds, and the ranking, the "
        "intervals and the ties come from them (0: rank on the search's points). Default: 3-10, "
        "set by an A/A calibration of the default config at the start, within a quarter of the "
        "search's time.")
    client_protocol: str = setting("choice", "grpc",
        "Protocol of the load generator.", choices=("grpc", "http"))
    gpus: list[str] = setting("strs", ["all"], "GPUs to use and monitor: 'all' or UUIDs/indices.")
    cpu_only: bool = setting("bool", False,
        "Profile every model on CPU (KIND_CPU) even with a GPU.")
    bls_composing_models: list[str] | None = setting("strs", None,
        "The models a BLS model calls: searched together with it, and served under their own "
        "names while it is measured.")
    cpu_only_composing_models: list[str] | None = setting("strs", None,
        "Composing models (of an ensemble or a BLS model) given CPU instances only.")
    monitoring_interval: float = setting("float", 0.1,
        "Seconds between GPU/CPU samples (MA's default is 1.0; our windows are "
        "shorter).", flags=("-i",))
    perf_analyzer_flags: dict[str, Any] = setting("object", {},
        "Load-generator flags for every model: all 55 of MA's perf_analyzer keys are accepted; "
        "shape, input-data, measurement-mode, measurement-interval, measurement-request-count, "
        "stability-percentage, max-trials, percentile, request-distribution, string-length, "
        "protocol and batch-size are honoured, the others noted with what happens instead.",
        cli=False)
    triton_server_flags: dict[str, Any] = setting("object", {},
        "Extra flags for the worker.", cli=False)
    triton_server_environment: dict[str, str] = setting("object", {},
        "Environment variables of the local or docker worker, e.g. {OMP_NUM_THREADS: 4}; a "
        "value's $VARs are expanded from the analyzer's environment (MA's).", cli=False)
    triton_http_endpoint: str = setting("str", "localhost:8000",
        "Server HTTP endpoint (remote mode).")
    triton_grpc_endpoint: str = setting("str", "localhost:8001",
        "Server gRPC endpoint (remote mode).")
    triton_metrics_url: str = setting("str", "http://localhost:8002/metrics",
        "Server metrics URL (remote mode).")
    triton_docker_image: str = setting("str", "model-analyzer-worker:latest",
        "Image of the worker (docker mode; `make docker-image` builds it).")
    triton_docker_mounts: list[str] | None = setting("strs", None,
        "Extra mounts for the worker container: host_path:container_path[:ro|rw], comma-separated"
        " (docker mode).")
    triton_docker_shm_size: str | None = setting("str", None,
        "/dev/shm size of the worker container, e.g. 2g (docker mode; default 1g).")
    triton_docker_labels: dict[str, Any] | None = setting("mapping", None,
        "Labels of the worker container: k=v,k2=v2 or a JSON object (docker mode).")
    triton_docker_args: dict[str, Any] | None = setting("mapping", None,
        "More docker SDK host-config arguments for the worker container, as a JSON object (e.g. "
        "{\"network_mode\": \"bridge\", \"cpuset_cpus\": \"1\"}; docker mode).")
    measurement_mode: str = setting("choice", "adaptive",
        "Load generator stopping rule (adaptive: confidence interval; perf_analyzer's "
        "time_windows / count_windows).", choices=("adaptive", "time_windows", "count_windows"))
    measurement_interval: int = setting("int", 1000,
        "Window in ms (time_windows; adaptive uses it as the minimum window).")
    measurement_request_count: int = setting("int", 50, "Requests per window (count_windows).")
    stability_percentage: float = setting("float", 10.0, "Stability band in percent.")
    max_trials: int = setting("int", 5,
        "Most windows per point (a point that is not stable by then is kept, marked unstable).")
    client_processes: int = setting("int", 0, "Load-generator processes (0: grow when saturated).")
    server_startup_timeout: float = setting("float", 120.0,
        "Seconds to wait for the worker to start.")
    model_load_timeout: float = setting("float", 600.0,
        "Seconds a config's load may take (a python model's initialize(), every instance, the "
        "warm-up): a longer one fails that config, and the worker stops the model's processes.")
    client_max_retries: int | None = setting("int", None,
        "Readiness checks of a starting worker, one a second (MA's): the worker's startup wait "
        "in seconds, instead of server_startup_timeout. Requests are never retried.",
        flags=("-r",))
    worker_cpus: str = setting("str", "",
        "CPUs of the local or docker worker (taskset -c syntax, e.g. 1 or 2-7; all: not pinned). "
        "Default on >= 2 cores: three quarters of the physical cores, the load generator on the "
        "rest, so neither measures the other's CPU use.")
    client_cpus: str = setting("str", "",
        "CPUs of the load generator (taskset -c syntax; all: not pinned). Default: the CPUs the "
        "worker does not have; in remote mode, not pinned.")
    seed: int = setting("int", 0, "Seed for random input tensors.")
    shape: list[str] | None = setting("multi", None,
        "NAME:d1,d2 for an input with dynamic dims, every model (repeat the flag per input; per "
        "model: perf_analyzer_flags: {shape: [...]}).")

