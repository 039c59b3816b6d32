"""What `model-analyzer perf` prints and writes, in perf_analyzer's words and column names."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analyzer.loadgen.measure import MeasureSettings, PerfPoint
from analyzer.terminal import print_whole

CSV_LATENCY_COLUMNS = (
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
)
CSV_VERBOSE_COLUMNS = ("Avg latency", "request/response", "response wait")
CSV_GPU_COLUMNS = (
    "Avg GPU Utilization",
    "Avg GPU Power Usage",
    "Max GPU Memory Usage",
    "Total GPU Memory",
)
# ours, after perf_analyzer's (consumers read perf_analyzer's CSV by column name)
CSV_EXTRA_COLUMNS = (
    "Achieved Request Rate",
    "Client CPU Utilization",
    "Client Saturated",
    "Effective Concurrency",
    "Client CPU Wait",
    "Client Turnaround",
    "Client Bound",
    "Stable",
    "Measurement Time",
)


def first_column(mode: str) -> str:
    return "Request Rate" if mode == "request_rate" else "Concurrency"


def _us(value: float) -> int:
    return int(value)


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def csv_row(point: PerfPoint, verbose: bool) -> list[str]:
    s = point.server
    row = [
        _fmt(point.value),
        _fmt(point.throughput),
        str(_us(point.client_send_us)),
        str(_us(point.network_us)),
        str(_us(s.queue_us if s else 0)),
        str(_us(s.compute_input_us if s else 0)),
        str(_us(s.compute_infer_us if s else 0)),
        str(_us(s.compute_output_us if s else 0)),
        str(_us(point.client_recv_us)),
        str(_us(point.p50_us)),
        str(_us(point.p90_us)),
        str(_us(point.p95_us)),
        str(_us(point.p99_us)),
    ]
    if verbose:
        overhead = point.client_send_us + point.client_recv_us
        row += [
            str(_us(point.latency_avg_us)),
            str(_us(overhead)),
            str(_us(point.latency_avg_us - overhead)),
        ]
        gpu = point.monitors.get("gpu")
        if gpu is not None and gpu.available:
            # perf_analyzer's units: utilisation 0-1 fraction, W, bytes
            row += [
                _fmt(gpu.utilization_pct / 100.0),
                _fmt(gpu.power_w),
                str(int(gpu.memory_used_mb * 1e6)),
                str(int(sum(g.memory_total_mb for g in gpu.gpus) * 1e6)),
            ]
        row += [
            _fmt(point.sent_rate),
            _fmt(point.client_cpu_pct),
            str(point.client_saturated).lower(),
            _fmt(point.effective_concurrency),
            _fmt(point.client_wait_pct),
            str(_us(point.client_turnaround_us)) if point.client_turnaround_us is not None else "",
            str(point.client_bound).lower(),
            str(point.stable).lower(),
            _fmt(point.wall_s),
        ]
    return row


def write_csv(path: Path, points: Sequence[PerfPoint], verbose: bool = False) -> None:
    """perf_analyzer's -f file: one row per point, ordered by throughput as perf_analyzer does."""
    if not points:
        return
    header = [first_column(points[0].mode), "Inferences/Second", *CSV_LATENCY_COLUMNS]
    if verbose:
        header += CSV_VERBOSE_COLUMNS
        if any(p.monitors.get("gpu") is not None and p.monitors["gpu"].available for p in points):
            header += CSV_GPU_COLUMNS
        header += CSV_EXTRA_COLUMNS
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for point in sorted(points, key=lambda p: p.throughput):
            writer.writerow(csv_row(point, verbose))


def settings_text(settings: MeasureSettings, batch_size: int, mode: str, distribution: str) -> str:
    lines = ["*** Measurement Settings ***", f"  Batch size: {batch_size}"]
    if settings.mode == "adaptive":
        lines.append(
            "  Using \"adaptive\" mode: stop when the 95% confidence interval of throughput and "
            f"latency is within +-{settings.stability_pct / 2:g}% "
            f"(warm-up {settings.warmup_ms} ms, window >= {settings.min_window_ms} ms, "
            f"at most {settings.max_time_ms} ms)"
        )
    else:
        lines.append(f"  Using \"{settings.mode}\" mode for stabilization")
        if settings.mode == "count_windows":
            lines.append(f"  Minimum number of samples in each window: {settings.request_count}")
        else:
            lines.append(f"  Measurement window: {settings.window_ms} msec")
    if mode == "request_rate":
        lines.append(f"  Using {'poisson' if distribution == 'poisson' else 'uniform'} "
                     "distribution on request generation")
    lines.append(
        "  Stabilizing using "
        + (f"p{settings.percentile} latency" if settings.percentile else "average latency")
    )
    return "\n".join(lines)


def point_text(point: PerfPoint) -> str:
    """The per-point block perf_analyzer prints."""
    head = (
        f"Request concurrency: {point.value:g}"
        if point.mode == "concurrency"
        else f"Request Rate: {point.value:g} inference requests per seconds"
    )
    lines = [
        head,
        "  Client: ",
        f"    Request count: {point.request_count}",
        f"    Throughput: {_fmt(point.throughput)} infer/sec",
    ]
    if point.mode == "request_rate":
        lines.append(f"    Achieved request rate: {_fmt(point.sent_rate)} requests/sec")
    if point.percentile:
        lines.append(f"    p{point.percentile} latency: {_us(point.percentile_us or 0)} usec")
    lines += [
        f"    Avg latency: {_us(point.latency_avg_us)} usec "
        f"(standard deviation {_us(point.latency_std_us)} usec)",
        f"    p50 latency: {_us(point.p50_us)} usec",
        f"    p90 latency: {_us(point.p90_us)} usec",
        f"    p95 latency: {_us(point.p95_us)} usec",
        f"    p99 latency: {_us(point.p99_us)} usec",
        f"    Load generator: {point.client_processes} process(es), busiest at "
        f"{point.client_cpu_pct:.0f}% of a core (waited {point.client_wait_pct:.0f}% for one); "
        f"{point.effective_concurrency:.2f} requests in flight on average"
        + (
            f", {_us(point.client_turnaround_us)} usec from a response to the next request"
            if point.client_turnaround_us is not None
            else ""
        )
        + f"; measured {point.duration_s:.2f} s ({point.wall_s:.2f} s in all)"
        + ("; CLIENT-BOUND" if point.client_bound else ""),
    ]
    if point.server is not None:
        lines += ["  Server: ", *_server_lines(point.server, "    ")]
        if point.server.composing:
            lines.append("  Composing models: ")
            for name, part in point.server.composing.items():
                lines += [f"  {name}, version: {part.version}", *_server_lines(part, "      ")]
    for name, summary in point.monitors.items():
        lines.append(f"  {name.upper()}: {monitor_text(summary)}")
    for warning in point.warnings:
        lines.append(f"  WARNING: {warning}")
    return "\n".join(lines)


def _server_lines(s, indent: str) -> list[str]:
    """perf_analyzer's server block: counts and the average request's parts."""
    return [
        f"{indent}Inference count: {s.inference_count}",
        f"{indent}Execution count: {s.execution_count}",
        f"{indent}Successful request count: {s.success_count}",
        f"{indent}Avg request latency: {_us(s.request_us)} usec (overhead {_us(s.overhead_us)} "
        f"usec + queue {_us(s.queue_us)} usec + compute input {_us(s.compute_input_us)} usec "
        f"+ compute infer {_us(s.compute_infer_us)} usec + compute output "
        f"{_us(s.compute_output_us)} usec)",
    ]


def monitor_text(summary) -> str:
    if not summary.available:
        return summary.reason
    if hasattr(summary, "gpus"):
        return "; ".join(
            f"{g.name} {g.uuid}: {g.utilization_pct:.0f}% busy, {g.memory_used_max_mb:.0f}/"
            f"{g.memory_total_mb:.0f} MB" + (f", {g.power_w:.0f} W" if g.power_w else "")
            for g in summary.gpus
        )
    return (
        f"server process tree {summary.cpu_pct:.0f}% CPU, {summary.rss_max_mb:.0f} MB RSS "
        f"({summary.processes} processes)"
    )


def summary_text(points: Sequence[PerfPoint]) -> str:
    if not points:
        return ""
    label = "Concurrency" if points[0].mode == "concurrency" else "Request Rate"
    stat = points[0].percentile
    lines = [
        f"Inferences/Second vs. Client {'p' + str(stat) if stat else 'Average'} Batch Latency"
    ]
    for p in points:
        latency = p.percentile_us if stat else p.latency_avg_us
        lines.append(
            f"{label}: {p.value:g}, throughput: {_fmt(p.throughput)} infer/sec, "
            f"latency {_us(latency or 0)} usec"
        )
    return "\n".join(lines)


def summary_table(points: Sequence[PerfPoint]) -> Table:
    label = "conc." if points and points[0].mode == "concurrency" else "req/s"
    table = Table(title="latencies in ms", title_justify="left")
    for name in (label, "infer/s", "p50", "p90", "p99", "avg", "queue", "compute", "client",
                 "trust"):
        # the verdict is never cut short, however narrow the terminal
        table.add_column(name, justify="right", no_wrap=True,
                         min_width=len("client-bound") if name == "trust" else None)
    for p in points:
        s = p.server
        compute = (s.compute_input_us + s.compute_infer_us + s.compute_output_us) if s else 0
        trust = "client-bound" if p.client_bound else ("ok" if p.stable else "unstable")
        table.add_row(
            f"{p.value:g}", f"{p.throughput:.1f}", f"{p.p50_us / 1000:.2f}",
            f"{p.p90_us / 1000:.2f}", f"{p.p99_us / 1000:.2f}", f"{p.latency_avg_us / 1000:.2f}",
            f"{(s.queue_us if s else 0) / 1000:.2f}", f"{compute / 1000:.2f}",
            f"{p.client_cpu_pct:.0f}%", trust,
        )
    return table


def print_summary(console: Console, points: Sequence[PerfPoint]) -> None:
    console.print(summary_text(points), highlight=False, markup=False, soft_wrap=True)
    if points:
        print_whole(console, summary_table(points))
