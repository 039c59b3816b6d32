"""`model-analyzer perf`: perf_analyzer's flags, declared once as this command's parameters, to
PerfOptions; a perf_analyzer-style report out; a bad flag is one sentence."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from analyzer.errors import AnalyzerError
from analyzer.terminal import make_console

if TYPE_CHECKING:
    from analyzer.loadgen.perf import PerfOptions


class Protocol(StrEnum):
    http = "http"
    grpc = "grpc"


_DEFAULT_URL = {Protocol.http: "localhost:8000", Protocol.grpc: "localhost:8001"}


class Distribution(StrEnum):
    constant = "constant"
    poisson = "poisson"


class MeasurementMode(StrEnum):
    adaptive = "adaptive"
    time_windows = "time_windows"
    count_windows = "count_windows"


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
    max_threads: Annotated[
        int, typer.Option("--max-threads", min=0,
                          help="perf_analyzer's: the most load-generator processes (each sends "
                               "many requests at once); 0: up to the cores.")
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
    sequence_length: Annotated[
        int, typer.Option(help="Requests per sequence (sequence_batching models).")
    ] = 20,
    sequence_length_variation: Annotated[
        float, typer.Option(help="Each sequence's length varies by up to this %.")
    ] = 20.0,
    sequence_id_range: Annotated[
        str, typer.Option(help="start[:end] correlation ids (end excluded; none: no end).")
    ] = "1",
    num_of_sequences: Annotated[
        int, typer.Option(help="Live sequences in request-rate mode.")
    ] = 4,
    serial_sequences: Annotated[
        bool, typer.Option(help="At most one request in flight per sequence (request rate).")
    ] = False,
    streaming: Annotated[
        bool, typer.Option(help="gRPC ModelStreamInfer streams (decoupled models always).")
    ] = False,
    shared_memory: Annotated[
        str, typer.Option(help="none, or system: tensors in shared memory the server maps.")
    ] = "none",
    output_shared_memory_size: Annotated[
        int, typer.Option(help="Bytes of shared memory per output (with --shared-memory).")
    ] = 102400,
    ssl_grpc_use_ssl: Annotated[bool, typer.Option(help="gRPC over TLS.")] = False,
    ssl_grpc_root_certifications_file: Annotated[
        str, typer.Option(help="PEM CA certificate(s) to verify the gRPC server with.")
    ] = "",
    ssl_grpc_private_key_file: Annotated[
        str, typer.Option(help="PEM private key of the client certificate (mutual TLS).")
    ] = "",
    ssl_grpc_certificate_chain_file: Annotated[
        str, typer.Option(help="PEM client certificate chain (mutual TLS).")
    ] = "",
    ssl_https_verify_peer: Annotated[
        int, typer.Option(help="1: verify the HTTPS server's certificate; 0: do not.")
    ] = 1,
    ssl_https_verify_host: Annotated[
        int, typer.Option(help="2 or 1: check the certificate names the host; 0: do not.")
    ] = 2,
    ssl_https_ca_certificates_file: Annotated[
        str, typer.Option(help="PEM CA certificate(s) to verify the HTTPS server with.")
    ] = "",
    ssl_https_client_certificate_type: Annotated[str, typer.Option(help="PEM only.")] = "PEM",
    ssl_https_client_certificate_file: Annotated[
        str, typer.Option(help="PEM client certificate (mutual TLS).")
    ] = "",
    ssl_https_private_key_type: Annotated[str, typer.Option(help="PEM only.")] = "PEM",
    ssl_https_private_key_file: Annotated[
        str, typer.Option(help="PEM private key of the client certificate.")
    ] = "",
    http_header: Annotated[
        list[str] | None,
        typer.Option("-H", "--http-header", help="NAME:VALUE header (gRPC metadata); repeatable."),
    ] = None,
) -> None:
    """Measure throughput and latency of a model on a running server (perf_analyzer's flags).
    \f
    (Long because its parameters are the command's flags, declared once, here.)"""
    from analyzer.loadgen.inputs import parse_shapes
    from analyzer.loadgen.measure import MeasureSettings
    from analyzer.loadgen.payload import parse_headers
    from analyzer.loadgen.perf import PerfOptions, parse_range
    from analyzer.loadgen.sequences import SequenceOptions, parse_id_range
    from analyzer.tls import client_tls

    err = make_console(stderr=True)
    rates = bool(request_rate_range)
    try:
        _check(concurrency_range, request_rate_range, percentile, stability_percentage, {
            "-p/--measurement-interval": measurement_interval, "-r/--max-trials": max_trials,
            "--measurement-request-count": measurement_request_count,
            "--monitor-interval-ms": monitor_interval_ms,
        })  # fmt: skip
        settings = MeasureSettings(
            mode=measurement_mode.value, window_ms=measurement_interval,
            request_count=measurement_request_count, stability_pct=stability_percentage,
            max_trials=max_trials, percentile=percentile, warmup_ms=max(0, warmup_ms),
            min_window_ms=max(100, min_window_ms),
        )  # fmt: skip
        id_start, id_end = parse_id_range(sequence_id_range)
        sequence = SequenceOptions(sequence_length, sequence_length_variation, id_start, id_end,
                                   num_of_sequences, serial_sequences)  # fmt: skip
        sequence.check(0)
        options = PerfOptions(
            model=model, url=url or _DEFAULT_URL[protocol], protocol=protocol.value,
            version=model_version,
            concurrency=[] if rates else parse_range("--concurrency-range",
                                                     concurrency_range or "1", True),
            request_rates=parse_range("--request-rate-range", request_rate_range, False)
            if rates else [],
            distribution=request_distribution.value, batch_size=batch_size,
            input_data=input_data, shapes=parse_shapes(shape or []), string_length=string_length,
            settings=settings, latency_threshold_ms=latency_threshold,
            client_processes=client_processes, max_threads=max_threads, server_pid=server_pid,
            gpus=list(gpus or []),
            monitor_interval_s=monitor_interval_ms / 1000.0, seed=seed, sequence=sequence,
            streaming=streaming, headers=parse_headers(http_header or []),
            shared_memory=shared_memory, output_shm_size=output_shared_memory_size,
            ssl=client_tls({
                "ssl-grpc-use-ssl": ssl_grpc_use_ssl or "",
                "ssl-grpc-root-certifications-file": ssl_grpc_root_certifications_file,
                "ssl-grpc-private-key-file": ssl_grpc_private_key_file,
                "ssl-grpc-certificate-chain-file": ssl_grpc_certificate_chain_file,
                "ssl-https-verify-peer": ssl_https_verify_peer,
                "ssl-https-verify-host": ssl_https_verify_host,
                "ssl-https-ca-certificates-file": ssl_https_ca_certificates_file,
                "ssl-https-client-certificate-type": ssl_https_client_certificate_type,
                "ssl-https-client-certificate-file": ssl_https_client_certificate_file,
                "ssl-https-private-key-type": ssl_https_private_key_type,
                "ssl-https-private-key-file": ssl_https_private_key_file,
            }, "--"),
        )  # fmt: skip
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    raise typer.Exit(_run(options, latency_report_file, verbose_csv))


def _check(concurrency_range: str | None, request_rate_range: str | None, percentile: int | None,
           stability_percentage: float, positives: dict[str, int]) -> None:  # fmt: skip
    """The checks no single flag's type makes; one sentence naming the flag and value."""
    if concurrency_range and request_rate_range:
        raise AnalyzerError("give --concurrency-range or --request-rate-range, not both")
    if percentile is not None and not 1 <= percentile <= 99:
        raise AnalyzerError(f"--percentile {percentile} must be between 1 and 99")
    for flag, value in positives.items():
        if value <= 0:
            raise AnalyzerError(f"{flag} {value} must be positive")
    if stability_percentage <= 0:
        raise AnalyzerError(f"-s {stability_percentage:g} must be a positive percentage")


def _run(options: PerfOptions, report_file: Path | None, verbose_csv: bool) -> int:
    """The sweep, printed point by point as perf_analyzer does, then its summary and CSV."""
    from analyzer.loadgen.control import ServerError
    from analyzer.loadgen.inputs import InputError
    from analyzer.loadgen.measure import MeasurementError
    from analyzer.loadgen.output import point_text, print_summary, settings_text, write_csv
    from analyzer.loadgen.perf import run_perf

    console = make_console()
    err = make_console(stderr=True)
    console.print(
        settings_text(options.settings, options.batch_size, options.mode, options.distribution),
        markup=False,
        soft_wrap=True,
    )
    points = []
    try:
        for point in run_perf(options):
            points.append(point)
            console.print("\n" + point_text(point), markup=False, soft_wrap=True)
    except (ServerError, InputError, MeasurementError) as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted: writing the points measured so far", markup=False)
    console.print()
    print_summary(console, points)
    if report_file is not None and points:
        try:
            write_csv(report_file, points, verbose_csv)
        except OSError as exc:
            err.print(f"error: cannot write -f {report_file}: {exc.strerror}", markup=False)
            return 1
    return 0
