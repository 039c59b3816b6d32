"""`model-analyzer serve`: the worker's flags (tritonserver's names, `--flag=true|false`
booleans) to ServeOptions, then the worker runs until stopped."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from analyzer.commands import triton_flags
from analyzer.config.values import parse_bool
from analyzer.tls import ServerTls, TlsError
from analyzer.worker.limits import Limits, parse_size, size_text

MODEL_LOG_ENV = "MODEL_ANALYZER_MODEL_LOG"  # read by pb_utils.Logger in python model processes


def _switch(flag: str, value: str) -> bool:
    """tritonserver style `--allow-grpc=false`: booleans are values, not switches."""
    try:
        return parse_bool(value)
    except ValueError:
        raise typer.BadParameter(f"{flag} must be true or false, got '{value}'") from None


class ControlMode(StrEnum):
    none = "none"
    explicit = "explicit"
    poll = "poll"


def serve(
    model_repository: Annotated[
        list[Path], typer.Option("--model-repository",
                                 help="Triton model repository folder (repeat for several, as "
                                      "tritonserver's; a model name in two is an error).")
    ],
    host: Annotated[str, typer.Option("--host", "--http-address", help="Bind address.")] = (
        "127.0.0.1"
    ),
    http_port: Annotated[
        int, typer.Option(help="HTTP port (0 picks a free one).", min=0, max=65535)
    ] = 8000,
    grpc_port: Annotated[
        int, typer.Option(help="gRPC port (0 picks a free one).", min=0, max=65535)
    ] = 8001,
    metrics_port: Annotated[
        int, typer.Option(help="Metrics port (0 picks a free one).", min=0, max=65535)
    ] = 8002,
    model_control_mode: Annotated[ControlMode, typer.Option()] = ControlMode.none,
    repository_poll_secs: Annotated[
        float, typer.Option(help="Poll mode: seconds between looks at the repository (models "
                                 "added, removed or changed are loaded, unloaded, reloaded).")
    ] = 15.0,
    load_model: Annotated[
        list[str] | None, typer.Option(help="Model to load at start in explicit mode ('*': all).")
    ] = None,
    allow_http: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_grpc: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_metrics: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_gpu_metrics: Annotated[
        str, typer.Option(help="false: no nv_gpu_* families (Triton's).")
    ] = "true",
    allow_cpu_metrics: Annotated[
        str, typer.Option(help="false: no nv_cpu_* families (Triton's).")
    ] = "true",
    strict_readiness: Annotated[
        str, typer.Option(help="true: ready only while no model failed to load or is loading; "
                               "false: ready once the server runs (Triton's).")
    ] = "true",
    grpc_use_ssl: Annotated[
        str, typer.Option(help="true: gRPC over TLS with --grpc-server-cert/-key (Triton's).")
    ] = "false",
    grpc_use_ssl_mutual: Annotated[
        str, typer.Option(help="true: TLS, and clients must present a certificate signed by "
                               "--grpc-root-cert (Triton's).")
    ] = "false",
    grpc_server_cert: Annotated[
        str, typer.Option(help="PEM certificate (chain) of the gRPC endpoint.")
    ] = "",
    grpc_server_key: Annotated[str, typer.Option(help="PEM private key of that certificate.")] = "",
    grpc_root_cert: Annotated[
        str, typer.Option(help="PEM CA certificate that signs the clients' (mutual TLS).")
    ] = "",
    metrics_interval_ms: Annotated[
        int, typer.Option(help="Read CPU and GPU metrics at most once this often, ms (Triton's; "
                               "default 0 here: at every scrape).")
    ] = 0,
    exit_on_error: Annotated[
        str, typer.Option(help="true: exit if a model fails to load at start.")
    ] = "true",
    log_verbose: Annotated[int, typer.Option(help="1: log loads and batches.")] = 0,
    log_info: Annotated[str, typer.Option(help="false: no info lines (Triton's).")] = "true",
    log_warning: Annotated[str, typer.Option(help="false: no warnings (Triton's).")] = "true",
    log_error: Annotated[str, typer.Option(help="false: no error lines (Triton's).")] = "true",
    log_format: Annotated[str, typer.Option(help="default or ISO8601 timestamps (Triton's).")] = (
        "default"
    ),
    log_file: Annotated[
        Path | None, typer.Option(help="Append the log to this file instead of stderr (Triton's).")
    ] = None,
    disable_auto_complete_config: Annotated[
        str, typer.Option(help="true: a model's config is used as written; no backend fills "
                               "in what it lacks (Triton's).")
    ] = "false",
    strict_model_config: Annotated[
        str, typer.Option(help="true: as --disable-auto-complete-config=true (Triton's older "
                               "name).")
    ] = "false",
    exit_on_stdin_eof: Annotated[
        bool, typer.Option(help="Stop when stdin closes (the launcher's lifeline).")
    ] = False,
    allow_model_file_uploads: Annotated[
        str,
        typer.Option(
            help="true: a repository-API load request may carry 'file:' parameters (model files, "
            "python model.py code among them) that this worker writes to a private temporary "
            "folder and then LOADS AND RUNS as the user running the worker. Anyone who can reach "
            "the repository API can then run code on this machine: turn it on only with "
            "--http-restricted-api/--grpc-restricted-protocol on model-repository, or on a "
            "port only trusted users reach. Default false: such requests are refused."
        ),
    ] = "false",
    http_restricted_api: Annotated[
        list[str] | None,
        typer.Option(
            help="'<api>[,<api>...]:<header>=<value>' (Triton's): those API categories answer "
            "only requests carrying that header. APIs: health, metadata, inference, "
            "shared-memory, model-config, model-repository, statistics, trace, logging."
        ),
    ] = None,
    grpc_restricted_protocol: Annotated[
        list[str] | None,
        typer.Option(
            help="'<api>[,<api>...]:<key>=<value>' (Triton's): those gRPC categories answer only "
            "calls carrying that metadata key and value."
        ),
    ] = None,
    exit_timeout_secs: Annotated[
        float,
        typer.Option(help="Seconds from SIGTERM to exit at most: python models still busy are "
                     "killed (Triton's flag)."),
    ] = 15.0,
    model_load_timeout_secs: Annotated[
        float,
        typer.Option(help="Seconds a model's load may take at most (a python model's "
                     "initialize() and auto_complete_config(), every instance, the warm-up); "
                     "beyond, the load fails and the model's processes are stopped. 0: as long "
                     "as it takes (Triton's)."),
    ] = 0.0,
    loop_yields_to_models: Annotated[
        str,
        typer.Option(
            help="true: the thread that parses and answers requests runs as SCHED_BATCH, so on a "
            "core it shares with a model it waits for the model's time slice instead of "
            "preempting it mid-batch (more throughput at small requests on few cores, no change "
            "on an idle core). false: Linux's default policy for every thread."
        ),
    ] = "true",
    **more: Any,
) -> None:
    """Serve a model repository with Triton's HTTP/REST, gRPC and metrics protocols.
    tritonserver's other flags are accepted too, each with a note that it has no effect here.
    \f
    (Long because its parameters are the command's flags, declared once, here.)"""
    from analyzer.worker.server import ServeOptions
    from analyzer.worker.server import serve as run_worker

    for note in triton_flags.notes(more):
        print(note, file=sys.stderr)
    _logging(log_verbose, log_info, log_warning, log_error, log_format, log_file)
    options = ServeOptions(
        model_repository=[str(r) for r in model_repository],
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_control_mode=model_control_mode.value,
        load_models=list(load_model or []),
        allow_http=_switch("--allow-http", allow_http),
        allow_grpc=_switch("--allow-grpc", allow_grpc),
        allow_metrics=_switch("--allow-metrics", allow_metrics),
        cpu_metrics=_switch("--allow-cpu-metrics", allow_cpu_metrics),
        gpu_metrics=_switch("--allow-gpu-metrics", allow_gpu_metrics),
        metrics_interval_ms=_not_negative("--metrics-interval-ms", metrics_interval_ms),
        strict_readiness=_switch("--strict-readiness", strict_readiness),
        grpc_tls=_grpc_tls(grpc_use_ssl, grpc_use_ssl_mutual, grpc_server_cert, grpc_server_key,
                           grpc_root_cert),
        exit_on_error=_switch("--exit-on-error", exit_on_error),
        exit_on_stdin_eof=exit_on_stdin_eof,
        limits=_limits(more),
        allow_model_file_uploads=_switch("--allow-model-file-uploads", allow_model_file_uploads),
        http_restricted_api=list(http_restricted_api or []),
        grpc_restricted_protocol=list(grpc_restricted_protocol or []),
        exit_timeout_s=_seconds_or_zero("--exit-timeout-secs", exit_timeout_secs),
        load_timeout_s=_seconds_or_zero("--model-load-timeout-secs", model_load_timeout_secs),
        loop_yields=_switch("--loop-yields-to-models", loop_yields_to_models),
        repository_poll_secs=_positive("--repository-poll-secs", repository_poll_secs),
        auto_complete=not (_switch("--disable-auto-complete-config", disable_auto_complete_config)
                           or _switch("--strict-model-config", strict_model_config)),
    )
    raise typer.Exit(run_worker(options))


def _logging(verbose: int, info: str, warning: str, error: str, form: str,
             file: Path | None) -> None:  # fmt: skip
    """Triton's log flags on Python's logging: the level is the lowest kind still on (info
    lines only with --log-verbose, as before), the format's timestamps, the file."""
    if form.lower() not in ("default", "iso8601"):
        raise typer.BadParameter(f"--log-format must be default or ISO8601, got '{form}'")
    on = [level for level, flag, value in (
        (logging.INFO, "--log-info", info), (logging.WARNING, "--log-warning", warning),
        (logging.ERROR, "--log-error", error)) if _switch(flag, value)]  # fmt: skip
    level = logging.INFO if verbose and logging.INFO in on else \
        min([lv for lv in on if lv > logging.INFO], default=logging.CRITICAL + 1)  # fmt: skip
    datefmt = "%Y-%m-%dT%H:%M:%SZ" if form.lower() == "iso8601" else None
    if datefmt:
        logging.Formatter.converter = time.gmtime
    target = {"filename": str(file)} if file is not None else {}
    if file is not None:
        try:
            with open(file, "a"):
                pass
        except OSError as err:
            raise typer.BadParameter(f"--log-file '{file}' cannot be written: {err.strerror}"
                                     ) from None  # fmt: skip
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt=datefmt, **target)  # fmt: skip
    # python models' pb_utils.Logger follows the same flags, as Triton's does (their info lines
    # show unless --log-info false; verbose ones only with --log-verbose), into the same file
    os.environ[MODEL_LOG_ENV] = json.dumps({
        "info": logging.INFO in on, "warning": logging.WARNING in on,
        "error": logging.ERROR in on, "verbose": verbose, "iso8601": datefmt is not None,
        "file": str(file) if file is not None else None})  # fmt: skip


def _grpc_tls(use: str, mutual: str, cert: str, key: str, root: str) -> ServerTls | None:
    """tritonserver's gRPC TLS flags, checked here so that a bad file is one sentence at start."""
    mutual_on = _switch("--grpc-use-ssl-mutual", mutual)
    if not (_switch("--grpc-use-ssl", use) or mutual_on):
        return None
    if not cert or not key:
        raise typer.BadParameter("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    tls = ServerTls(cert, key, root, mutual_on)
    try:
        tls.context()
    except TlsError as err:
        raise typer.BadParameter(str(err)) from None
    return tls


def _not_negative(flag: str, value: int) -> int:
    if value < 0:
        raise typer.BadParameter(f"{flag} must be 0 or more, got {value}")
    return value


def _positive(flag: str, value: float) -> float:
    if not value > 0 or math.isinf(value):  # nan and inf too
        raise typer.BadParameter(f"{flag} must be a positive number of seconds, got {value:g}")
    return value


def _seconds_or_zero(flag: str, value: float) -> float:
    """Seconds, or 0 (no limit; for --exit-timeout-secs, at once)."""
    return 0.0 if value == 0 else _positive(flag, value)


def _limits(flags: dict[str, Any]) -> Limits:
    """The caps' flags, checked: a size as 64MB or 1g, every cap positive."""
    values: dict[str, Any] = {}
    for cap in dataclasses.fields(Limits):
        if "flag" not in cap.metadata:
            continue
        flag, value = cap.metadata["flag"], flags[cap.name]
        if cap.metadata["unit"] == "bytes":
            try:
                value = parse_size(value)
            except ValueError as err:
                raise typer.BadParameter(f"{flag}: {err}") from None
        elif value <= 0:
            raise typer.BadParameter(f"{flag} must be positive, got {value}")
        values[cap.name] = value
    return Limits(**values)


def _cap_parameters() -> list[inspect.Parameter]:
    """A flag per cap of Limits (worker/limits.py), where each is declared with its help."""
    kinds = {"bytes": str, "seconds": float, "count": int}
    parameters = []
    for cap in dataclasses.fields(Limits):
        if "flag" not in cap.metadata:
            continue
        meta = cap.metadata
        default = size_text(cap.default) if meta["unit"] == "bytes" else cap.default
        kind, option = kinds[meta["unit"]], typer.Option(meta["flag"], help=meta["help"])
        parameters.append(inspect.Parameter(cap.name, inspect.Parameter.KEYWORD_ONLY,
                                            default=default, annotation=Annotated[kind, option]))
    return parameters


_own = [p for p in inspect.signature(serve, eval_str=True).parameters.values()
        if p.kind != p.VAR_KEYWORD]
serve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [*_own, *_cap_parameters(), *triton_flags.parameters()]
)
