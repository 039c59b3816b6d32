"""What `model-analyzer profile` prints: live progress while it runs, the ranked summary after."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from analyzer.results.finals import Comparison
from analyzer.results.measurement import Measurement
from analyzer.results.outcome import ModelOutcome
from analyzer.results.ranking import ConfigResult, top_across_models
from analyzer.results.together import per_model
from analyzer.terminal import print_whole


def headline(error: str) -> str:
    """One line for an error that may run to many: its first, and its last when that says more
    (TorchScript's first line is only "The following operation failed in the TorchScript
    interpreter."; its cause, e.g. "RuntimeError: Input type (int) and bias type (float) should
    be the same", is its last)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return error
    if len(lines) > 1 and lines[-1] != lines[0]:
        return f"{lines[0]} ... {lines[-1]}"
    return lines[0]


def _load_label(load: str, value: int) -> str:
    return f"c={value}" if load == "concurrency" else f"{value} req/s"


def _setting(r: ConfigResult) -> str:
    d = r.description
    if d.get("composing_configs"):  # an ensemble: its composing models' values, in step order
        return (f"{d['instance_group']}; max_batch_size {d['max_batch_size_text']}; "
                f"queue delay us {d['max_queue_delay_text']}")  # fmt: skip
    parts = [d["instance_group"], f"max_batch_size {d['max_batch_size']}"]
    if d.get("dynamic_batching"):
        parts.append(f"queue delay {d['max_queue_delay_us']} us")
    elif d["max_batch_size"] > 0:
        parts.append("no dynamic batching")
    return ", ".join(parts)


class ProgressDisplay:
    """A rich progress bar over configs and load points, with the best result so far."""

    def __init__(self, console: Console, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose  # every point's server-side times, CI and windows too
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[model]}[/]"),
            BarColumn(bar_width=None),
            TextColumn("{task.fields[configs]} configs, {task.fields[points]} points"),
            TextColumn("[green]{task.fields[best]}[/]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}
        self.best: dict[str, tuple[float, str]] = {}
        self.fields: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> ProgressDisplay:
        return self  # the bar starts with its first model: a run that fails first draws none

    def __exit__(self, *exc) -> None:
        if self.tasks:
            self.progress.stop()

    def _task(self, model: str):
        if model not in self.tasks:
            if not self.tasks:
                self.progress.start()
            self.tasks[model] = self.progress.add_task(
                "", total=None, model=model, configs=0, points=0, best="")
        return self.tasks[model]

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event in ("worker_start", "placement", "model_done", "model_failed", "final_start",
                     "repository_note"):
            self._run_event(event, data)
            return
        result: ConfigResult = data["result"]
        task = self._task(result.model)
        fields = self.fields.setdefault(result.model, {"configs": 0, "points": 0, "best": ""})
        if event == "variant":
            fields["configs"] += 1
            self.progress.update(task, configs=fields["configs"],
                                 description=f"{result.name}: {_setting(result)}")  # fmt: skip
        elif event == "load":
            self.progress.update(task, description=f"loading {result.name}")
        elif event == "measure":
            trial = data["trial"]
            label = _load_label(trial.load, trial.value)
            self.progress.update(task, description=f"{result.name} {label}")
        elif event == "point":
            self._point(result, data, task, fields)
        elif event == "final_point":
            m = data["measurement"]
            label = data.get("label") or f"round {data['round']}/{data['rounds']}"
            self.console.print(
                f"  {label} {result.name:<28} "
                f"{_load_label(m.load, m.value):>12} b={m.batch_size:<3} "
                f"{m.metrics['perf_throughput']:9.1f} infer/s  p99 "
                f"{m.metrics['perf_latency_p99']:8.3f} ms"
            )
        elif event == "config_failed":
            self.console.print(f"  [red]{result.name} failed: {escape(headline(result.error))}[/]")

    def _run_event(self, event: str, data: dict[str, Any]) -> None:
        """The events of the run and of a model as a whole (no config of theirs)."""
        if event == "worker_start":
            self.console.print("[dim]starting the worker ...[/]")
        elif event == "placement":
            self.console.print(f"[dim]{data['how']}[/]", highlight=False)
        elif event == "model_done":
            if data["model"] in self.tasks:
                self.progress.update(self.tasks[data["model"]], total=1, completed=1,
                                     description="done")  # fmt: skip
        elif event == "model_failed":
            self.console.print(f"[red]{escape(data['model'])}: {escape(data['error'])}[/]",
                               highlight=False)
        elif event == "repository_note":
            self.console.print(data["line"], markup=False, highlight=False)
        elif event == "final_start":
            c = data["comparison"]
            self.console.print(f"  [bold]final comparison of {data['model']}[/]: "
                               f"{', '.join(c.finalists)}, {c.rounds} rounds")  # fmt: skip

    def _point(self, result: ConfigResult, data: dict[str, Any], task: Any,
               fields: dict[str, Any]) -> None:  # fmt: skip
        """A measured point: its line, and the model's best so far in the bar."""
        m = data["measurement"]
        throughput = m.metrics["perf_throughput"]
        ok = not data["violations"]
        best = self.best.get(result.model)
        if ok and (best is None or throughput > best[0]):
            self.best[result.model] = (throughput, result.name)
            best_text = f"best {throughput:.0f} infer/s ({result.name})"
            fields["best"] = best_text
        fields["points"] += 1
        self.progress.update(task, points=fields["points"], best=fields["best"])
        mark = "" if ok else f" [yellow]breaks {'; '.join(data['violations'])}[/]"
        if m.client_bound:
            got = m.metrics.get
            mark += (f" [yellow]client-bound ({got('effective_concurrency', 0):.1f} in flight, "
                     f"client CPU {got('client_cpu_pct', 0):.0f}%, waited "
                     f"{got('client_cpu_wait_pct', 0):.0f}% for one)[/]")
        self.console.print(
            f"  {result.name:<28} {_load_label(m.load, m.value):>12} b={m.batch_size:<3} "
            f"{throughput:9.1f} infer/s  p99 {m.metrics['perf_latency_p99']:8.3f} ms{mark}"
        )
        if self.verbose:
            self.console.print(f"[dim]{_details(m)}[/]", highlight=False)


def _details(m: Any) -> str:
    """A point's figures behind its line: where the time went, how sure, how it was measured."""
    got = m.metrics.get
    parts = [f"    server queue {got('perf_server_queue', 0):.3f} ms",
             f"compute {got('perf_server_compute_infer', 0):.3f} ms",
             f"avg batch {got('server_avg_batch', 0):.2f}"]  # fmt: skip
    if "perf_throughput_ci_pct" in m.metrics:
        parts.append(f"throughput ±{m.metrics['perf_throughput_ci_pct']:.1f}%")
    parts.append(f"client CPU {got('client_cpu_pct', 0):.0f}%")
    return ", ".join(parts)


def print_summary(outcome, console: Console, paths: dict[str, Any]) -> None:
    c = outcome.config
    for model in outcome.models:
        console.rule(f"[bold]{model.spec.name}")
        if model.error:
            console.print(f"[red]not profiled: {model.error}[/]")
            continue
        measured = [r for r in model.results if r.measurements]
        if not measured:
            console.print("[red]no config could be measured[/]")
        default = model.default
        top = measured[: max(c.num_configs_per_model, 1)]
        if default is not None and default.measurements and default not in top:
            top.append(default)
        print_whole(console, _top_table(model, top, default))
        _print_notes(console, model, measured, top)
        _print_verdict(console, model, measured, top)
    if c.num_top_model_configs > 0:
        _print_across_models(outcome, console)
    console.print(
        f"\n{outcome.measured} points measured, {outcome.reused} taken from the checkpoint, "
        + (f"{outcome.shared} from other processes sharing the study, " if outcome.shared else "")
        + f"{outcome.worker_starts} worker start(s), {outcome.wall_s:.0f} s."
    )
    console.print(f"Configs: {c.output_model_repository_path}")
    for label, path in paths.items():
        console.print(f"{label}: {path}")


def _top_table(model: ModelOutcome, top: list[ConfigResult],
               default: ConfigResult | None) -> Table:  # fmt: skip
    """A model's top configs (and its default), with the final rounds' intervals if they ran."""
    table = Table(box=box.SIMPLE_HEAD, title=f"Top configs of {model.spec.name} (objectives: "
                  + ", ".join(f"{t} x{w:g}" for t, w in model.spec.objectives.items())
                  + ")")  # fmt: skip
    finals = model.comparison is not None and any(r.final for r in top)
    columns = ["rank", "config", "instances", "max batch", "delay us", "load", "infer/s"]
    columns += ["95% CI infer/s"] if finals else []
    columns += ["p99 ms"] + (["95% CI p99 ms"] if finals else [])
    columns += ["vs default", "meets constraints"]
    for col in columns:
        if col == "config":
            table.add_column(col, no_wrap=True)
        else:
            table.add_column(col, justify="right")
    base = _throughput(default)
    for r in top:
        table.add_row(*_top_row(r, base, finals))
    return table


def _top_row(r: ConfigResult, base: float, finals: bool) -> list[str]:
    """One config's row of the top table (`base`: the default's throughput, 0 if none)."""
    m = r.best
    assert m is not None
    ratio = f"{m.metrics['perf_throughput'] / base:.2f}x" if base else "-"
    d = r.description
    delay = d.get("max_queue_delay_text", "-" if d["max_queue_delay_us"] is None
                  else str(d["max_queue_delay_us"]))  # fmt: skip
    row = [
        str(r.rank) + ("=" if r.final is not None and r.final.tied else ""),
        r.name + (" *" if r.pareto else ""), d["instance_group"],
        str(d.get("max_batch_size_text", d["max_batch_size"])), delay,
        f"{_load_label(m.load, m.value)} b={m.batch_size}",
        f"{m.metrics['perf_throughput']:.1f}{_each(m, 'perf_throughput', '.1f')}",
    ]  # fmt: skip
    if finals:
        f = r.final
        row.append(f"{f.throughput.low:.1f}-{f.throughput.high:.1f}" if f else "-")
    row.append(f"{m.metrics['perf_latency_p99']:.3f}{_each(m, 'perf_latency_p99', '.3f')}")
    if finals:
        row.append(f"{f.p99.low:.3f}-{f.p99.high:.3f}" if f else "-")
    row += [ratio, "yes" if r.satisfies else "[yellow]no[/]"]
    return row


def _print_notes(console: Console, model: ModelOutcome, measured: list[ConfigResult],
                 top: list[ConfigResult]) -> None:  # fmt: skip
    """Under the table: the Pareto front, and per top config what to distrust in its numbers."""
    if model.pareto:
        front = [r.name for r in measured if r.pareto]
        # first unless the final comparison recommended a config one search point dominates
        first = all(r.pareto for r in measured[: len(front)])
        where = "ranked first" if first else "ranked after the recommendation"
        console.print(f"  * on the Pareto front of {', '.join(model.pareto)}: "
                      f"{len(front)} config(s), {where}: {', '.join(front)}")  # fmt: skip
    for r in top:
        if r.violations:
            console.print(f"  [yellow]{r.name} breaks {'; '.join(r.violations)}[/]")
        if r.best is not None and not r.best.stable and r.final is None:
            ci = r.best.metrics.get("perf_throughput_ci_pct")
            spread = f" (95% CI ±{ci:.0f}%)" if ci is not None else ""
            console.print(f"  [yellow]{r.name}: its best point never settled within the "
                          f"stability band{spread}: its numbers are noisy[/]")  # fmt: skip
        if r.best is not None and r.best.client_bound:
            console.print(f"  [yellow]{r.name}: its best point was client-bound: the load "
                          "generator, not the server, limited it[/]")  # fmt: skip


def _print_verdict(console: Console, model: ModelOutcome, measured: list[ConfigResult],
                   top: list[ConfigResult]) -> None:  # fmt: skip
    """The recommendation and how sure it is, then the configs that failed or were skipped."""
    if len(measured) > len(top):
        console.print(f"  ... and {len(measured) - len(top)} more configs in the CSV")
    winner = measured[0] if measured else None
    if winner is not None:
        console.print(recommendation(winner, model.default))
    if model.comparison is not None:
        console.print(how_sure(model.comparison))
    for r in model.results:
        if r.error:
            console.print(f"  [red]failed[/] {r.name} ({_setting(r)}): "
                          f"{escape(headline(r.error))}")  # fmt: skip
    if model.skipped:
        console.print(f"  [dim]skipped {len(model.skipped)} combinations that cannot work "
                      f"(e.g. {model.skipped[0]})[/]")  # fmt: skip


def _each(m: Measurement, tag: str, spec: str) -> str:
    """Models profiled together: each model's value in parentheses after the whole server's
    (throughput summed, latency the worst), as MA's summary shows them; "" for one model."""
    values = per_model(m, tag)
    if not values:
        return ""
    return " (" + ", ".join(f"{name} {value:{spec}}" for name, value in values.items()) + ")"


def _throughput(result: ConfigResult | None) -> float:
    if result is None or result.best is None:
        return 0.0
    return result.best.metrics["perf_throughput"]


def recommendation(winner: ConfigResult, default: ConfigResult | None) -> str:
    m = winner.best
    assert m is not None
    text = (
        f"[bold green]Best config for {winner.model}: {winner.name}[/] ({_setting(winner)}): "
        f"{m.metrics['perf_throughput']:.1f}{_each(m, 'perf_throughput', '.1f')} infer/s at "
        f"{_load_label(m.load, m.value)}, p99 latency "
        f"{m.metrics['perf_latency_p99']:.3f}{_each(m, 'perf_latency_p99', '.3f')} ms"
    )
    base = _throughput(default)
    if default is not None and base:
        text += (f", {m.metrics['perf_throughput'] / base:.2f}x the default config's "
                 f"{base:.1f} infer/s")  # fmt: skip
        if winner is default:
            text += " (the default config is the best)"
    if not winner.satisfies:
        text += f" [yellow](no config satisfies the constraints: {'; '.join(winner.violations)})[/]"
    return text + "."


def how_sure(comparison: Comparison) -> str:
    """The "how sure" line: what the final rounds say of the recommendation."""
    c = comparison
    text = (f"How sure: {len(c.finalists)} configs were measured again side by side in "
            f"up to {c.rounds} interleaved rounds ({c.points} points, {c.seconds:.0f} s of "
            f"measuring; the search took {c.search_points} points, {c.search_seconds:.0f} s); "
            "intervals are 95% Student t over the rounds, differences paired by round."
            )  # fmt: skip
    if c.pool_note:
        text += f" {c.pool_note}."
    if c.rounds_note:
        text += f" Rounds {c.rounds_note}."
    if c.eliminated:
        text += " Left the race: " + "; ".join(f"{n} ({why})" for n, why in c.eliminated.items())
        text += "."
    if c.load_checks:
        text += (f" Each finalist was also measured one load level up in the first round; "
                 f"{_moved(c)}.")
    if c.dropped:
        text += f" Left out after failing in the rounds: {', '.join(c.dropped)}."
    others = [n for n in c.tied if n not in (c.recommended, c.leader)]
    if c.why:
        text += f" {c.why}."
        if others:
            text += f" Also tied within noise: {', '.join(others)}."
    elif others:
        text += f" Tied with {c.recommended} within noise: {', '.join(others)}."
    elif c.recommended:
        text += f" {c.recommended} is ahead of every other finalist beyond noise"
        text += f", {c.close_lead}." if c.close_lead else "."
    if c.vs_default is not None:
        v = c.vs_default
        text += (f" Its throughput is {v.estimate:.2f}x the default config's "
                 f"(95% CI {v.low:.2f}-{v.high:.2f}).")  # fmt: skip
    return text


def _moved(c: Comparison) -> str:
    """Which finalists the load checks moved up, with what the check measured."""
    if not c.moved:
        return "none gained enough to move"
    return "moved up: " + "; ".join(f"{n} ({c.load_checks[n].removesuffix('; moved up')})"
                                    for n in c.moved)


def _print_across_models(outcome, console: Console) -> None:
    table = Table(box=box.SIMPLE_HEAD,
                  title=f"Top {outcome.config.num_top_model_configs} configs across models")
    for col in ("config", "setting", "load", "infer/s", "p99 ms", "meets constraints"):
        table.add_column(col, no_wrap=col == "config")
    for r in top_across_models(outcome):
        m = r.best
        table.add_row(r.name, _setting(r), f"{_load_label(m.load, m.value)} b={m.batch_size}",
                      f"{m.metrics['perf_throughput']:.1f}",
                      f"{m.metrics['perf_latency_p99']:.3f}", "yes" if r.satisfies else "no")
    print_whole(console, table)
