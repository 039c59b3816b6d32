"""The `model-analyzer` command line: each command parses its flags and calls one function."""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Find the best serving configuration for a model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _as_bool(flag: str, value: str) -> bool:
    """tritonserver style `--allow-grpc=false`: booleans are values, not switches."""
    low = value.strip().lower()
    if low in _TRUE | _FALSE:
        return low in _TRUE
    raise typer.BadParameter(f"{flag} must be true or false, got '{value}'")


class ControlMode(StrEnum):
    none = "none"
    explicit = "explicit"


@app.callback()
def main() -> None:
    """Find the best serving configuration for a model (Triton-compatible)."""


@app.command()
def serve(
    model_repository: Annotated[
        Path, typer.Option("--model-repository", help="Triton model repository folder.")
    ],
    host: Annotated[str, typer.Option("--host", "--http-address", help="Bind address.")] = (
        "127.0.0.1"
    ),
    http_port: Annotated[int, typer.Option(help="HTTP port (0 picks a free one).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port (0 picks a free one).")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Metrics port (0 picks a free one).")] = 8002,
    model_control_mode: Annotated[ControlMode, typer.Option()] = ControlMode.none,
    load_model: Annotated[
        list[str] | None, typer.Option(help="Model to load at start in explicit mode ('*': all).")
    ] = None,
    allow_http: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_grpc: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_metrics: Annotated[str, typer.Option(help="true or false.")] = "true",
    exit_on_error: Annotated[
        str, typer.Option(help="true: exit if a model fails to load at start.")
    ] = "true",
    log_verbose: Annotated[int, typer.Option(help="1: log loads and batches.")] = 0,
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
    http_max_input_size: Annotated[
        str, typer.Option(help="Largest request body, also once inflated (413 beyond).")
    ] = "64MB",
    http_max_buffered_size: Annotated[
        str, typer.Option(help="Request bodies still arriving, all connections together "
                          "(503 beyond).")
    ] = "1GB",
    http_max_header_size: Annotated[
        str, typer.Option(help="Largest request line plus headers (431 beyond).")
    ] = "64KB",
    http_header_timeout: Annotated[
        float, typer.Option(help="Seconds a request may take to arrive whole.")
    ] = 30.0,
    http_idle_timeout: Annotated[
        float, typer.Option(help="Seconds an idle keep-alive connection is kept.")
    ] = 300.0,
    http_max_connections: Annotated[
        int, typer.Option(help="Open HTTP connections at most (503 beyond, stalled ones first).")
    ] = 4096,
    http_max_pending: Annotated[
        int, typer.Option(help="Replies one connection may have outstanding before reading pauses.")
    ] = 64,
    grpc_max_message_size: Annotated[
        str, typer.Option(help="Largest gRPC message either way, after decompression.")
    ] = "64MB",
    grpc_max_concurrent_rpcs: Annotated[
        int, typer.Option(help="gRPC calls served at once over all connections (RESOURCE_EXHAUSTED "
                         "beyond); also each connection's HTTP/2 stream limit, so one client's "
                         "extra calls wait in that client.")
    ] = 4096,
    grpc_max_stream_pending: Annotated[
        int, typer.Option(help="Unanswered requests of one gRPC stream before reading it pauses.")
    ] = 1024,
    max_instance_count: Annotated[
        int, typer.Option(help="Model instances one model version may have at most.")
    ] = 64,
    exit_timeout_secs: Annotated[
        float,
        typer.Option(help="Seconds from SIGTERM to exit at most: python models still busy are "
                     "killed (Triton's flag)."),
    ] = 15.0,
    loop_yields_to_models: Annotated[
        str,
        typer.Option(
            help="true: the thread that parses and answers requests runs as SCHED_BATCH, so on a "
            "core it shares with a model it waits for the model's time slice instead of "
            "preempting it mid-batch (more throughput at small requests on few cores, no change "
            "on an idle core). false: Linux's default policy for every thread."
        ),
    ] = "true",
) -> None:
    """Serve a model repository with Triton's HTTP/REST, gRPC and metrics protocols."""
    from analyzer.worker.server import ServeOptions
    from analyzer.worker.server import serve as run_worker

    logging.basicConfig(
        level=logging.INFO if log_verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = ServeOptions(
        model_repository=str(model_repository),
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_control_mode=model_control_mode.value,
        load_models=list(load_model or []),
        allow_http=_as_bool("--allow-http", allow_http),
        allow_grpc=_as_bool("--allow-grpc", allow_grpc),
        allow_metrics=_as_bool("--allow-metrics", allow_metrics),
        exit_on_error=_as_bool("--exit-on-error", exit_on_error),
        exit_on_stdin_eof=exit_on_stdin_eof,
        limits=_limits(
            http_max_input_size, http_max_buffered_size, http_max_header_size,
            http_header_timeout, http_idle_timeout,
            http_max_connections, http_max_pending, grpc_max_message_size,
            grpc_max_concurrent_rpcs, grpc_max_stream_pending, max_instance_count,
        ),
        allow_model_file_uploads=_as_bool("--allow-model-file-uploads", allow_model_file_uploads),
        http_restricted_api=list(http_restricted_api or []),
        grpc_restricted_protocol=list(grpc_restricted_protocol or []),
        exit_timeout_s=exit_timeout_secs,
        loop_yields=_as_bool("--loop-yields-to-models", loop_yields_to_models),
    )
    raise typer.Exit(run_worker(options))


def _limits(
    max_input: str, max_buffered: str, max_header: str, header_timeout: float,
    idle_timeout: float,
    max_connections: int, max_pending: int, grpc_max_message: str, grpc_max_rpcs: int,
    grpc_stream_pending: int, max_instances: int,
):  # fmt: skip
    from analyzer.worker.limits import Limits, parse_size

    def size(flag: str, text: str) -> int:
        try:
            return parse_size(text)
        except ValueError as err:
            raise typer.BadParameter(f"{flag}: {err}") from None

    def positive(flag: str, value: float) -> float:
        if value <= 0:
            raise typer.BadParameter(f"{flag} must be positive, got {value}")
        return value

    return Limits(
        max_input_bytes=size("--http-max-input-size", max_input),
        max_buffered_bytes=size("--http-max-buffered-size", max_buffered),
        max_header_bytes=size("--http-max-header-size", max_header),
        header_timeout_s=positive("--http-header-timeout", header_timeout),
        idle_timeout_s=positive("--http-idle-timeout", idle_timeout),
        max_connections=int(positive("--http-max-connections", max_connections)),
        max_pending_per_connection=int(positive("--http-max-pending", max_pending)),
        grpc_max_message_bytes=size("--grpc-max-message-size", grpc_max_message),
        grpc_max_concurrent_rpcs=int(positive("--grpc-max-concurrent-rpcs", grpc_max_rpcs)),
        grpc_max_stream_pending=int(
            positive("--grpc-max-stream-pending", grpc_stream_pending)
        ),
        max_instance_count=int(positive("--max-instance-count", max_instances)),
    )


class Protocol(StrEnum):
    http = "http"
    grpc = "grpc"


class Distribution(StrEnum):
    constant = "constant"
    poisson = "poisson"


class MeasurementMode(StrEnum):
    adaptive = "adaptive"
    time_windows = "time_windows"
    count_windows = "count_windows"


@app.command(no_args_is_help=True)
def perf(
    model: Annotated[str, typer.Option("-m", "--model-name", help="Model to load.")],
    url: Annotated[str, typer.Option("-u", "--url", help="Server HOST:PORT.")] = "",
    protocol: Annotated[Protocol, typer.Option("-i", "--protocol")] = Protocol.http,
    model_version: Annotated[str, typer.Option("-x", "--model-version")] = "",
    concurrency_range: Annotated[
        str | None, typer.Option(help="start[:end[:step]] outstanding requests (default 1).")
    ] = None,
    request_rate_range: Annotated[
        str | None, typer.Option(help="start[:end[:step]] requests per second.")
    ] = None,
    request_distribution: Annotated[Distribution, typer.Option()] = Distribution.constant,
    batch_size: Annotated[int, typer.Option("-b", "--batch-size", help="Samples per request.")] = 1,
    measurement_interval: Annotated[
        int, typer.Option("-p", "--measurement-interval", help="Window length, ms.")
    ] = 5000,
    stability_percentage: Annotated[
        float, typer.Option("-s", "--stability-percentage", help="Allowed spread, %.")
    ] = 10.0,
    max_trials: Annotated[
        int, typer.Option("-r", "--max-trials", help="Windows before giving up on stability.")
    ] = 10,
    measurement_mode: Annotated[
        MeasurementMode,
        typer.Option(help="adaptive: stop once the 95% CI fits the band (ours, default)."),
    ] = MeasurementMode.adaptive,
    measurement_request_count: Annotated[
        int, typer.Option(help="Requests per window in count_windows mode.")
    ] = 50,
    percentile: Annotated[
        int | None, typer.Option(help="Stabilise and report on this latency percentile.")
    ] = None,
    latency_threshold: Annotated[
        float, typer.Option("-l", "--latency-threshold", help="Stop the sweep above this, ms.")
    ] = 0.0,
    input_data: Annotated[
        str, typer.Option(help="random, zero, or a JSON file in perf_analyzer's format.")
    ] = "random",
    shape: Annotated[
        list[str] | None, typer.Option(help="NAME:d1,d2 for inputs with dynamic dims.")
    ] = None,
    string_length: Annotated[int, typer.Option(help="Length of random BYTES elements.")] = 128,
    latency_report_file: Annotated[
        Path | None, typer.Option("-f", "--latency-report-file", help="CSV output.")
    ] = None,
    verbose_csv: Annotated[bool, typer.Option("--verbose-csv", help="More CSV columns.")] = False,
    client_processes: Annotated[
        int, typer.Option(help="Load-generator processes (0: one, more when it saturates).")
    ] = 0,
    warmup_ms: Annotated[int, typer.Option(help="Adaptive mode warm-up, ms.")] = 250,
    min_window_ms: Annotated[int, typer.Option(help="Adaptive mode shortest window, ms.")] = 1000,
    server_pid: Annotated[
        int | None, typer.Option(help="Sample this server process tree's CPU and memory.")
    ] = None,
    gpus: Annotated[
        list[str] | None, typer.Option(help="GPU index or UUID to sample (default: all).")
    ] = None,
    monitor_interval_ms: Annotated[int, typer.Option(help="Sampler interval, ms.")] = 100,
    seed: Annotated[int, typer.Option(help="Seed for random data and poisson schedules.")] = 0,
) -> None:
    """Measure throughput and latency of a model on a running server (perf_analyzer's flags)."""
    flags = dict(locals())
    from analyzer.loadgen.main import perf_command

    raise typer.Exit(perf_command(**flags))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                      "help_option_names": []},
    add_help_option=False,
)  # fmt: skip
def profile(ctx: typer.Context) -> None:
    """Search, measure and rank serving configs of models (NVIDIA Model Analyzer's flags;
    `model-analyzer profile --help` lists them)."""
    from analyzer.profile_main import profile_command

    raise typer.Exit(profile_command(list(ctx.args)))


@app.command()
def report(
    export_path: Annotated[
        Path, typer.Option("-e", "--export-path", help="The export path of a profile run.")
    ] = Path("."),
    report_format: Annotated[
        str, typer.Option(help="html, or pdf (the summary also as PDF, beside the HTML).")
    ] = "html",
    storage: Annotated[
        str | None,
        typer.Option(help="The shared study's storage URL, when it has a password (the results "
                          "file names it without); default: environment variable "
                          "MODEL_ANALYZER_STORAGE, which keeps the password out of the process "
                          "list."),
    ] = None,
) -> None:
    """Rebuild the summary and detailed reports from a profile run's stored results (merged first
    with the points other processes added to the run's shared Optuna study, if it used one)."""
    from analyzer.errors import AnalyzerError
    from analyzer.report.html import load_results, render_reports
    from analyzer.report.refresh import refresh_from_studies

    if report_format not in ("html", "pdf"):
        typer.echo(f"error: --report-format is '{report_format}'; expected html or pdf", err=True)
        raise typer.Exit(2)
    export = export_path.resolve()
    try:
        for note in refresh_from_studies(export, load_results(export), storage):
            typer.echo(f"note: {note}")
        written = render_reports(export, ("html", report_format))
    except AnalyzerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(str(path))
