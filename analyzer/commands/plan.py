"""`model-analyzer plan`: the capacity plan of a profile run (results/plan.py) for a target load,
printed as a table, written to EXPORT_PATH/results/plan.json and added to the summary reports."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import AnalyzerError
from analyzer.terminal import make_console


def plan(
    export_path: Annotated[
        Path, typer.Option("-e", "--export-path", help="The export path of a profile run.")
    ],
    target_qps: Annotated[float, typer.Option(help="Inferences per second to serve in all.")],
    latency_budget: Annotated[
        float | None, typer.Option(help="p99 latency each replica must stay within, ms.")
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(help="The most replicas a config may use.")
    ] = None,
    headroom: Annotated[
        float, typer.Option(help="Spare capacity kept above the target, % (default 20).")
    ] = 20.0,
    cost_per_gpu_hour: Annotated[float | None, typer.Option(help="Price of one GPU-hour.")] = None,
    cost_per_cpu_hour: Annotated[
        float | None, typer.Option(help="Price of one core-hour.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Comma-separated models (default: all).")
    ] = None,
    conservative: Annotated[
        bool, typer.Option(help="Size finalists by the low end of their 95% throughput interval "
                                "and check the high end of their p99 interval.")
    ] = False,
) -> None:
    """How many replicas of each measured config serve TARGET_QPS under the latency budget, what
    they hold in all (instances, cores, GPUs, memory) and cost; configs ranked by cost."""
    from analyzer.fsutil import atomic_write_text
    from analyzer.report.html import load_results, render_reports
    from analyzer.results.plan import PlanSettings, plan_document, plan_path

    err = make_console(stderr=True)
    try:
        _check(target_qps, latency_budget, max_replicas, headroom,
               cost_per_gpu_hour, cost_per_cpu_hour)  # fmt: skip
        results = load_results(export_path)
        names = [m.strip() for m in (model or "").split(",") if m.strip()] or None
        known = [m["name"] for m in results["models"]]
        for name in names or []:
            if name not in known:
                raise AnalyzerError(f"--model '{name}' was not profiled in '{export_path}' "
                                    f"(profiled: {', '.join(known)})")  # fmt: skip
        settings = PlanSettings(target_qps, latency_budget, max_replicas, headroom,
                                cost_per_gpu_hour, cost_per_cpu_hour, conservative)  # fmt: skip
        document = plan_document(results, settings, names)
        path = plan_path(export_path)
        atomic_write_text(path, json.dumps(document, indent=2) + "\n")
        render_reports(export_path, parts=("summary",))
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    _print(document, settings)
    make_console().print(f"\nPlan: {path}", markup=False)


def _check(target: float, budget: float | None, replicas: int | None, headroom: float,
           gpu: float | None, cpu: float | None) -> None:  # fmt: skip
    for flag, number in (("--target-qps", target), ("--latency-budget", budget),
                         ("--headroom", headroom), ("--cost-per-gpu-hour", gpu),
                         ("--cost-per-cpu-hour", cpu)):  # fmt: skip
        if number is not None and not math.isfinite(number):
            raise AnalyzerError(f"{flag} {number:g} must be a finite number")
    if target <= 0:
        raise AnalyzerError(f"--target-qps {target:g} must be more than 0")
    if budget is not None and budget <= 0:
        raise AnalyzerError(f"--latency-budget {budget:g} must be more than 0 ms")
    if replicas is not None and replicas < 1:
        raise AnalyzerError(f"--max-replicas {replicas} must be at least 1")
    if headroom < 0:
        raise AnalyzerError(f"--headroom {headroom:g} must be 0 or more (percent)")
    for flag, price in (("--cost-per-gpu-hour", gpu), ("--cost-per-cpu-hour", cpu)):
        if price is not None and price < 0:
            raise AnalyzerError(f"{flag} {price:g} must be 0 or more")


def _print(document: dict, settings) -> None:
    from rich.table import Table

    from analyzer.results.plan import mix_text

    console = make_console()
    budget = (f" with p99 within {settings.latency_budget_ms:g} ms"
              if settings.latency_budget_ms is not None else "")  # fmt: skip
    sizing = ", finalists sized by their 95% intervals" if settings.conservative else ""
    console.print(f"Capacity plan: {settings.target_qps:g} infer/s{budget}, "
                  f"{settings.headroom_pct:g}% headroom{sizing}", markup=False)  # fmt: skip
    for model, rows in document["models"].items():
        table = Table(title=model, title_justify="left")
        table.add_column("config", no_wrap=True)
        table.add_column("point")
        for column in ("infer/s/replica", "p99 ms", "replicas", "inst.", "GPUs", "cores",
                       "mem GB", "$/h", "$/M inf."):
            table.add_column(column, justify="right")
        for row in rows:
            if not row["feasible"]:
                table.add_row(row["config"], row["load"] or "–",
                              f"{row['throughput']:.0f}" if row["throughput"] else "–",
                              f"{row['p99_ms']:.1f}" if row["p99_ms"] else "–",
                              "–", "–", "–", "–", "–", "–", "–")  # fmt: skip
                continue
            memory = (row["memory_mb"] + row["gpu_memory_mb"]) / 1024
            table.add_row(
                row["config"], row["load"], f"{row['throughput']:.0f}", f"{row['p99_ms']:.1f}",
                str(row["replicas"]), str(row["instances"]), str(row["gpus"]), str(row["cores"]),
                f"{memory:.1f}", _money(row["cost_per_hour"]), _money(row["cost_per_million"]),
            )  # fmt: skip
        console.print(table)
        feasible = [r for r in rows if r["feasible"]]
        if feasible:
            best = feasible[0]
            console.print(f"{model}: {best['replicas']} replica(s) of {best['config']}"
                          + (f", {_money(best['cost_per_hour'])}/hour"
                             if best["cost_per_hour"] is not None else ""), markup=False)
        elif rows:
            closest = min(rows, key=lambda r: r["shortfall_pct"])
            console.print(f"{model}: no config reaches {settings.target_qps:g} infer/s; the "
                          f"closest, {closest['config']}: {closest['note']}", markup=False)
        for row in rows:
            if row["note"]:
                console.print(f"  {row['config']}: {row['note']}", markup=False)
        if joint := mix_text(rows):
            console.print(f"{model}: {joint}", markup=False)


def _money(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.4f}" if value < 1 else f"{value:,.2f}"
