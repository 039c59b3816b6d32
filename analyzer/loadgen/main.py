"""`model-analyzer perf`: flags in, perf_analyzer-style report out, errors as one sentence."""

from __future__ import annotations

from pathlib import Path

from analyzer.loadgen.control import ServerError
from analyzer.loadgen.inputs import InputError, parse_shapes
from analyzer.loadgen.measure import MeasurementError, MeasureSettings
from analyzer.loadgen.output import point_text, print_summary, settings_text, write_csv
from analyzer.loadgen.perf import PerfOptions, parse_range, run_perf
from analyzer.terminal import make_console


def build_options(
    model: str,
    url: str,
    protocol: str,
    model_version: str,
    concurrency_range: str | None,
    request_rate_range: str | None,
    request_distribution: str,
    batch_size: int,
    measurement_interval: int,
    stability_percentage: float,
    max_trials: int,
    measurement_mode: str,
    measurement_request_count: int,
    percentile: int | None,
    latency_threshold: float,
    input_data: str,
    shape: list[str] | None,
    string_length: int,
    client_processes: int,
    warmup_ms: int,
    min_window_ms: int,
    server_pid: int | None,
    gpus: list[str] | None,
    monitor_interval_ms: int,
    seed: int,
) -> PerfOptions:
    """Validate perf flags; raises ValueError naming the flag and value."""
    if concurrency_range and request_rate_range:
        raise ValueError("give --concurrency-range or --request-rate-range, not both")
    if percentile is not None and not 1 <= percentile <= 99:
        raise ValueError(f"--percentile {percentile} must be between 1 and 99")
    checks = {
        "-p/--measurement-interval": measurement_interval,
        "-r/--max-trials": max_trials,
        "--measurement-request-count": measurement_request_count,
        "--monitor-interval-ms": monitor_interval_ms,
    }
    for flag, value in checks.items():
        if value <= 0:
            raise ValueError(f"{flag} {value} must be positive")
    if stability_percentage <= 0:
        raise ValueError(f"-s {stability_percentage:g} must be a positive percentage")
    settings = MeasureSettings(
        mode=str(measurement_mode),
        window_ms=measurement_interval,
        request_count=measurement_request_count,
        stability_pct=stability_percentage,
        max_trials=max_trials,
        percentile=percentile,
        warmup_ms=max(0, warmup_ms),
        min_window_ms=max(100, min_window_ms),
    )
    protocol = str(protocol)
    return PerfOptions(
        model=model,
        url=url or ("localhost:8001" if protocol == "grpc" else "localhost:8000"),
        protocol=protocol,
        version=model_version,
        concurrency=parse_range("--concurrency-range", concurrency_range, True)
        if concurrency_range or not request_rate_range
        else [],
        request_rates=parse_range("--request-rate-range", request_rate_range, False)
        if request_rate_range
        else [],
        distribution=str(request_distribution),
        batch_size=batch_size,
        input_data=input_data,
        shapes=parse_shapes(shape or []),
        string_length=string_length,
        settings=settings,
        latency_threshold_ms=latency_threshold,
        client_processes=client_processes,
        server_pid=server_pid,
        gpus=list(gpus or []),
        monitor_interval_s=monitor_interval_ms / 1000.0,
        seed=seed,
    )


def perf_command(
    latency_report_file: Path | None = None, verbose_csv: bool = False, **flags
) -> int:
    console = make_console()
    err = make_console(stderr=True)
    if flags.get("concurrency_range") is None and not flags.get("request_rate_range"):
        flags["concurrency_range"] = "1"
    try:
        options = build_options(**flags)
    except ValueError as exc:  # AnalyzerError (InputError) and the flag parsers' ValueError
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 2
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
    if latency_report_file is not None and points:
        try:
            write_csv(latency_report_file, points, verbose_csv)
        except OSError as exc:
            err.print(f"error: cannot write -f {latency_report_file}: {exc.strerror}", markup=False)
            return 1
    return 0
