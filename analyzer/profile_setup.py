"""What the profile settings make before the loop measures anything: the checks that refuse a run
before anything is written, the output repository claimed, the CPU placement, and per model the
load generator's options, the search limits and the search strategy.

Each is a function of the settings (and of the model being profiled); the loop is profiler.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from analyzer.config.profile_config import ModelSpec, ProfileConfig, ProfileConfigError
from analyzer.fsutil import FolderError, OutputFolder, claim_output_folder, refuse_overlap
from analyzer.launch.cpus import CpuListError, Placement, plan_placement
from analyzer.loadgen.inputs import parse_shapes
from analyzer.loadgen.measure import MeasureSettings
from analyzer.loadgen.payload import Headers, parse_headers
from analyzer.loadgen.perf import PerfOptions
from analyzer.loadgen.sequences import SequenceOptions, parse_id_range
from analyzer.metrics import DIRECTIONS
from analyzer.repository.repository import ENSEMBLE, ModelSource
from analyzer.results.checkpoint import Checkpoint
from analyzer.results.outcome import ModelOutcome
from analyzer.search.base import SearchLimits, SearchStrategy
from analyzer.search.brute import BruteSearch
from analyzer.search.composed import ComposedQuickSearch, Part
from analyzer.search.ledger import redact_url
from analyzer.search.optuna import OptunaSearch, OptunaSettings
from analyzer.search.quick import QuickSearch
from analyzer.search.space import SearchSpace
from analyzer.tls import ClientTls, client_tls


def check_objectives(config: ProfileConfig) -> None:
    """Every optuna objective is a metric with a direction."""
    c = config
    for tag in c.optuna_objectives or []:
        if tag not in DIRECTIONS:
            raise ProfileConfigError(
                f"optuna_objectives has '{tag}'; known: {', '.join(DIRECTIONS)}"
            )


def _make_folder(key: str, folder: Path) -> None:
    """A folder the run writes into, made now: a file in its place or a path that cannot be
    made is one sentence before any measurement (it was a traceback once results were due)."""
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{key} '{folder}' is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FolderError(f"{key} '{folder}' cannot be made: {err.strerror}") from None


def check_folders(config: ProfileConfig) -> None:
    """The one folder a run may delete must hold nothing else of the user's or of the run:
    refused before anything is written."""
    c = config
    repo, export = Path(c.model_repository), c.export
    every = {"is", "contains", "inside"}
    mine = {"is", "contains"}  # the default layout puts it inside these (./output_models)
    refuse_overlap("output_model_repository_path", c.output_repository, {
        "root folder": (Path("/"), mine),
        "home folder": (Path.home(), mine),
        "working directory": (Path.cwd(), mine),
        "model repository": (repo, every),
        "export path": (export, mine),
        "results folder": (export / "results", every),
        "reports folder": (export / "reports", every),
        "logs folder": (export / "logs", every),
        "checkpoint folder": (c.checkpoints, every),
    })  # fmt: skip
    refuse_overlap("export_path", export, {"model repository": (repo, {"is", "inside"})})
    for key, folder in (("export_path", export), ("checkpoint_directory", c.checkpoints)):
        _make_folder(key, Path(folder))
    refuse_overlap("checkpoint_directory", c.checkpoints,
                   {"model repository": (repo, {"is", "inside"})})  # fmt: skip
    for key, what in (("triton_output_path", "the worker's output"),
                      ("perf_output_path", "the load generator's reports")):  # fmt: skip
        if not getattr(c, key):
            continue
        log = Path(getattr(c, key))
        if log.is_dir():
            raise FolderError(f"{key} '{log}' is a folder; it names the file {what} is "
                              "appended to")  # fmt: skip
        refuse_overlap(key, log, {
            "model repository": (repo, every),
            "output model repository": (c.output_repository, every),
            "checkpoint folder": (c.checkpoints, every),
        })  # fmt: skip


def prepare_output(config: ProfileConfig, checkpoint: Checkpoint) -> OutputFolder:
    """The output model repository, locked for this run (see fsutil.claim_output_folder)."""
    out = config.output_repository
    resuming = checkpoint.resumed and checkpoint.meta.get("output_repository") == str(out)
    folder = claim_output_folder(out, config.override_output_model_repository, resuming)
    if not resuming:
        checkpoint.record_meta(output_repository=str(out), started=time.time())
    return folder


def cpu_placement(config: ProfileConfig) -> Placement:
    """The worker's and the load generator's CPU sets (see launch/cpus.py)."""
    c = config
    worker = c.worker_cpus
    docker_set = str((c.triton_docker_args or {}).get("cpuset_cpus", ""))
    if c.triton_launch_mode == "docker" and docker_set and not worker:
        worker = docker_set  # the container's own cpuset is the worker's set
    try:
        return plan_placement(worker, c.client_cpus, c.triton_launch_mode != "remote")
    except CpuListError as err:
        raise ProfileConfigError(str(err)) from None


def measure_options(config: ProfileConfig, spec: ModelSpec) -> tuple[MeasureSettings, PerfOptions]:
    """The load generator's settings for one model: the run's, overridden by the model's
    perf_analyzer_flags. InputError or ValueError when its flags are wrong."""
    c, flags = config, spec.perf_analyzer_flags

    def number(key: str, default: float, kind: type = int, low: float = 1,
               high: float = math.inf) -> Any:  # fmt: skip
        return _flag_number(flags.get(key, default), key, kind, low, high)

    window = number("measurement-interval", c.measurement_interval)
    settings = MeasureSettings(
        mode=_flag_choice(flags.get("measurement-mode", c.measurement_mode), "measurement-mode",
                          ("adaptive", "time_windows", "count_windows")),
        window_ms=window,
        request_count=number("measurement-request-count", c.measurement_request_count),
        stability_pct=number("stability-percentage", c.stability_percentage, float, 1e-9, 1000),
        max_trials=number("max-trials", c.max_trials),
        percentile=number("percentile", 0, int, 1, 99) if "percentile" in flags else None,
        min_window_ms=min(1000, window),
    )
    shapes = flags.get("shape") or c.shape or []
    if not isinstance(shapes, str | list) or not all(isinstance(s, str) for s in
                                                     ([shapes] if isinstance(shapes, str)
                                                      else shapes)):  # fmt: skip
        raise ValueError(f"perf_analyzer_flags 'shape' is {shapes!r}; expected NAME:d1,d2,... "
                         "(one, or a list)")  # fmt: skip
    id_start, id_end = parse_id_range(str(flags.get("sequence-id-range", "1")))
    sequence = SequenceOptions(
        length=number("sequence-length", 20), id_start=id_start, id_end=id_end,
        count=number("num-of-sequences", 4),
    )  # fmt: skip
    sequence.check(0)
    options = PerfOptions(
        model=spec.name,
        protocol=str(flags.get("protocol", c.client_protocol)),
        distribution=_flag_choice(flags.get("request-distribution", "constant"),
                                  "request-distribution", ("constant", "poisson")),
        input_data=str(flags.get("input-data", "random")),
        shapes=parse_shapes([shapes] if isinstance(shapes, str) else list(shapes)),
        string_length=number("string-length", 128),
        settings=settings,
        seed=c.seed,
        sequence=sequence,
        streaming=_flag_bool(flags.get("streaming", False), "streaming"),
        headers=parse_headers(_as_list(flags.get("http-header")),
                              "perf_analyzer_flags http-header"),
        ssl=client_tls(flags, "perf_analyzer_flags "),
        shared_memory=str(flags.get("shared-memory", "none")),
        output_shm_size=number("output-shared-memory-size", 102400),
        max_threads=_positive(flags.get("max-threads", 0), "max-threads"),
    )
    return settings, options


def _flag_number(value: object, key: str, kind: type, low: float, high: float) -> Any:
    """A perf_analyzer_flags number, named when it is not one or out of range (it was
    "invalid literal for int()", or numpy's complaint once the run had started)."""
    try:
        number = kind(str(value).strip())
    except ValueError:
        number = None
    if isinstance(value, bool) or number is None or not low <= number <= high:
        span = f"{low:g} to {high:g}" if high < math.inf else f"{low:g} or more"
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"perf_analyzer_flags '{key}' is {value!r}; expected {what}, {span}")
    return number


def _flag_choice(value: object, key: str, choices: tuple[str, ...]) -> str:
    if str(value) not in choices:
        raise ValueError(f"perf_analyzer_flags '{key}' is {value!r}; expected one of "
                         f"{', '.join(choices)}")  # fmt: skip
    return str(value)


def _positive(value: object, key: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"perf_analyzer_flags '{key}' is {value!r}; expected a whole number")
    return number


def control_tls(config: ProfileConfig) -> tuple[ClientTls | None, Headers]:
    """The TLS and headers of the run's own perf_analyzer_flags, for the calls that control a
    remote server: MA's client takes its ssl-* options from there too."""
    flags = dict(config.perf_analyzer_flags or {})
    return (client_tls(flags, "perf_analyzer_flags "),
            parse_headers(_as_list(flags.get("http-header")), "perf_analyzer_flags http-header"))


def _as_list(value: object) -> list[str]:
    """A flag MA repeats: one value or a list of them."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _flag_bool(value: object, key: str) -> bool:
    """A perf_analyzer flag without a value (MA writes `streaming: true`, or an empty value)."""
    if value is None or isinstance(value, bool):
        return value is None or value
    text = str(value).strip().lower()
    if text in ("", "true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"perf_analyzer_flags '{key}' is {value!r}; expected true or false")


def search_limits(config: ProfileConfig, spec: ModelSpec, source: ModelSource) -> SearchLimits:
    c = config
    return SearchLimits(
        own_max_batch_size=source.config.max_batch_size,
        min_model_batch_size=c.run_config_search_min_model_batch_size,
        max_model_batch_size=c.run_config_search_max_model_batch_size,
        min_instance_count=c.run_config_search_min_instance_count,
        max_instance_count=c.run_config_search_max_instance_count,
        min_concurrency=c.run_config_search_min_concurrency,
        max_concurrency=c.run_config_search_max_concurrency,
        min_request_rate=c.run_config_search_min_request_rate,
        max_request_rate=c.run_config_search_max_request_rate,
        batch_sizes=spec.batch_sizes,
        concurrency=spec.concurrency,
        request_rate=spec.request_rate,
        request_rate_search=c.request_rate_search_enable,
        search_disable=c.run_config_search_disable,
        early_exit=c.early_exit_enable,
        manual=spec.model_config_parameters,
        sweep_disable=c.concurrency_sweep_disable,
        concurrency_formula=c.use_concurrency_formula,
        binary_search_steps=c.run_config_search_max_binary_search_steps,
    )


def search_strategy(
    config: ProfileConfig, spec: ModelSpec, source: ModelSource, space: SearchSpace,
    fingerprint: str, model: ModelOutcome, parts: dict[str, ModelSource] | None = None,
) -> SearchStrategy:  # fmt: skip
    """The model's search, by run_config_search_mode; an optuna study also names itself and its
    Pareto objectives in `model`. An ensemble (`parts`: its composing models) gets the quick
    search over its composing models whatever the mode, as MA does."""
    c = config
    limits = search_limits(c, spec, source)
    mode = c.run_config_search_mode
    if source.config.HasField("sequence_batching"):  # no dynamic batcher beside it (as MA)
        space = dataclasses.replace(space, queue_delays_us=space.queue_delays_us[:1])
    if parts is not None and not limits.search_disable:
        # an ensemble's own max_batch_size follows its composing variants' (composed_variant);
        # a BLS model has knobs of its own too
        own = [] if source.backend == ENSEMBLE else [(source.name, source)]
        axes = [Part(n, s.config.max_batch_size) for n, s in [*own, *parts.items()]]
        return ComposedQuickSearch(space, limits, axes, top_configs=c.num_configs_per_model)
    if mode == "brute" or limits.search_disable:
        return BruteSearch(space, limits, top_configs=c.num_configs_per_model)
    if mode == "quick":
        return QuickSearch(space, limits, top_configs=c.num_configs_per_model)
    tags = tuple(c.optuna_objectives or ())
    study_name = c.study_name or f"model-analyzer-{spec.name}"
    if c.study_name and len(c.models) > 1:
        study_name = f"{c.study_name}-{spec.name}"  # one study per model
    storage = c.storage or f"sqlite:///{c.checkpoints / 'optuna.db'}"
    c.checkpoints.mkdir(parents=True, exist_ok=True)
    settings = OptunaSettings(
        storage=storage, study_name=study_name,
        sampler=c.optuna_sampler, seed=c.seed, min_trials=c.optuna_min_trials,
        max_trials=c.optuna_max_trials, early_exit_threshold=c.optuna_early_exit_threshold,
        min_percentage=c.min_percentage_of_search_space,
        max_percentage=c.max_percentage_of_search_space, objectives=tags,
        fingerprint=fingerprint,
    )  # fmt: skip
    # the results file names the study; a password in the URL is not written down
    model.study = {"storage": redact_url(storage), "study_name": settings.study_name}
    model.pareto = list(tags) if len(tags) > 1 else []
    directions = [
        "maximize" if DIRECTIONS[t] else "minimize" for t in tags
    ] or ["maximize"]
    return OptunaSearch(space, limits, settings, c.num_configs_per_model, directions)
