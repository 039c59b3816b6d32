"""Summary and detailed HTML reports, rendered with Jinja2 from templates/ and the results file.

Everything comes from EXPORT_PATH/results/profile_results.json, so `model-analyzer report`
rebuilds the same pages later, elsewhere, without the model repository or a worker. Pages are
single files: CSS inline, plots as PNG data URIs.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2

from analyzer.commands import mode
from analyzer.errors import AnalyzerError
from analyzer.fsutil import atomic_write_bytes, atomic_write_text
from analyzer.report import plot_files, plots
from analyzer.report.console import how_sure
from analyzer.report.exports import RESULTS_FILE
from analyzer.results.finals import Comparison
from analyzer.results.plan import mix_text, read_plan

# the repository's top-level templates/, shipped in the wheel as the package's data (in the
# source tree analyzer/templates is a link to it), so an installed copy finds it too
TEMPLATES = Path(str(files("analyzer") / "templates"))


class ReportError(AnalyzerError):
    """The results file is missing or unreadable; the message names it."""


def load_results(export_path: Path) -> dict[str, Any]:
    path = export_path / "results" / RESULTS_FILE
    try:
        document = json.loads(path.read_text())
    except OSError:
        raise ReportError(f"no profile results at '{path}' (run model-analyzer profile "
                          "with this --export-path first)") from None  # fmt: skip
    except ValueError:
        raise ReportError(f"'{path}' is not a valid results file") from None
    if not isinstance(document, dict) or document.get("format") != (
        "model-analyzer profile results"
    ) or not isinstance(document.get("models"), list) or not all(
        isinstance(m, dict) for m in document["models"]
    ):
        raise ReportError(f"'{path}' is not a model-analyzer results file")
    return document


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _setting(config: dict[str, Any]) -> str:
    d = config["description"]
    if d.get("composing_configs"):  # an ensemble: its composing models' values, in step order
        return (f"{d['instance_group']}; max_batch_size {d['max_batch_size_text']}; "
                f"queue delay µs {d['max_queue_delay_text']}")  # fmt: skip
    text = f"{d['instance_group']}, max_batch_size {d['max_batch_size']}"
    if d.get("dynamic_batching"):
        text += f", dynamic batching with queue delay {d['max_queue_delay_us']} µs"
    elif d["max_batch_size"] > 0:
        text += ", no dynamic batching"
    return text


def _load(m: dict[str, Any]) -> str:
    unit = "concurrency" if m["load"] == "concurrency" else "requests/s"
    text = f"{unit} {m['value']}" if unit == "concurrency" else f"{m['value']} {unit}"
    return text + (f", batch {m['batch_size']}" if m["batch_size"] > 1 else "")


def _budget(model: dict[str, Any]) -> float | None:
    return model["constraints"].get("perf_latency_p99", {}).get("max")


def recommendation(model: dict[str, Any], winner: dict[str, Any], default: dict | None) -> str:
    m = winner["best"]["metrics"]
    text = (f"Use {winner['name']} ({_setting(winner)}): {m['perf_throughput']:.1f} infer/s at "
            f"{_load(winner['best'])}")  # fmt: skip
    base = default["best"]["metrics"]["perf_throughput"] if default and default["best"] else 0
    if base:
        text += (f", {m['perf_throughput'] / base:.2f}× the default config's "
                 f"{base:.1f} infer/s")  # fmt: skip
    text += f", with p99 latency {m['perf_latency_p99']:.2f} ms"
    budget = _budget(model)
    if budget is not None:
        verdict = "within" if m["perf_latency_p99"] <= budget else "over"
        text += f", {verdict} the {budget:g} ms budget"
    else:
        text += " (no latency budget was set)"
    if not winner["satisfies_constraints"]:
        text += f"; no config meets every constraint ({'; '.join(winner['violations'])})"
    return text + "."


def _constraint_lines(model: dict[str, Any]) -> list[str]:
    lines = []
    for tag, bounds in model["constraints"].items():
        for key, value in bounds.items():
            lines.append(f"{tag} {'≤' if key == 'max' else '≥'} {value:g}")
    return lines


REPORTS = ("summary", "detailed")


@dataclass(frozen=True)
class PlotChoice:
    """MA's report keys `plots` (every detailed report's plots; default: the `-m/--mode`
    preset) and `report_model_configs: {<config>: {plots: ...}}` (one config's, instead)."""

    default: tuple[plot_files.PlotSpec, ...] | None = None
    per_config: dict[str, tuple[plot_files.PlotSpec, ...]] = field(default_factory=dict)

    def for_config(self, name: str) -> tuple[plot_files.PlotSpec, ...]:
        if name in self.per_config:
            return self.per_config[name]
        return self.default if self.default is not None else plot_files.REPORT_PLOTS[mode.mode]


def render_model(document: dict[str, Any], model: dict[str, Any], out: Path,
                 parts: tuple[str, ...] = REPORTS, chosen: list[str] | None = None,
                 plot_specs: PlotChoice | None = None) -> list[Path]:  # fmt: skip
    """The summary of one model and the detailed report of each of its top configs (`parts`
    names which of the two: MA's skip_summary_reports / skip_detailed_reports; `chosen`: the
    configs to write detailed reports of instead, MA's report_model_configs), and MA's
    `plots/` files of both beside `out` (`plot_specs`: the detailed reports' plots)."""
    env = _environment()
    css = (TEMPLATES / "base.css").read_text()
    measured = [c for c in model["configs"] if c["measurements"]]
    ranked = sorted(measured, key=lambda c: c["rank"])
    default = next((c for c in model["configs"] if c["is_default"]), None)
    winner = ranked[0] if ranked else None
    top = [c for c in ranked if c["name"] in model["top"]]
    if default is not None and default in measured and default not in top:
        top.append(default)
    if chosen is not None:
        top = [c for c in ranked if c["name"] in chosen]
    base = default["best"]["metrics"]["perf_throughput"] if default and default["best"] else 0
    rows = []
    for c in ranked:  # every measured config, best first; the top ones get detailed reports
        delay = c["description"]["max_queue_delay_us"]
        delay = c["description"].get("max_queue_delay_text", "–" if delay is None else delay)
        throughput = c["best"]["metrics"]["perf_throughput"]
        rows.append({**c, "delay": delay, "load": _load(c["best"]),
                     "vs_default": f"{throughput / base:.2f}×" if base else "–",
                     "detailed": c in top and "detailed" in parts})  # fmt: skip
    written: list[Path] = []
    choice = plot_specs or PlotChoice()
    if "detailed" in parts:
        breakdowns = {c["name"]: plots.latency_breakdown_png(c) for c in top}
        written += [_render_detailed(env, css, model, c, breakdowns[c["name"]], out)
                    for c in top]  # fmt: skip
        for c in top:
            written += plot_files.write_detailed_plots(out.parent, c, choice.for_config(c["name"]),
                                                       breakdowns[c["name"]])  # fmt: skip
    if "summary" not in parts:
        return written
    written += plot_files.write_summary_plots(out.parent, model["name"], top,
                                              model["constraints"], mode.mode)  # fmt: skip
    figures = _summary_figures(model, measured, winner, default)
    summary_dir = out / "summaries" / model["name"]
    summary_dir.mkdir(parents=True, exist_ok=True)
    summary = summary_dir / "result_summary.html"
    atomic_write_text(summary, env.get_template("result_summary.html.j2").render(
        css=css, model=model, created=document["created"], winner=winner,
        recommendation=recommendation(model, winner, default) if winner else "",
        how_sure=how_sure(Comparison.from_dict(model["final_comparison"]))
        if model.get("final_comparison") else "",
        ranking=rows, plots=figures, constraints=_constraint_lines(model),
        breakers=[c for c in measured if not c["satisfies_constraints"]],
        failed=[c for c in model["configs"] if c["error"]],
        objectives=", ".join(f"{t} ×{w:g}" for t, w in model["objectives"].items()),
        machine=document["machine"], kind=document["instance_kind"],
        placement=document.get("cpu_placement") or {},
        settings=document["settings"], source=RESULTS_FILE,
        measured_points=sum(len(c["measurements"]) for c in measured),
        measured_configs=len(measured),
        pareto=model.get("pareto_objectives") or [],
        pareto_configs=[c["name"] for c in ranked if c.get("pareto_optimal")],
        plan=_plan(out.parent, model["name"]),
    ))  # fmt: skip
    return [summary, *written]


def _plan(export_path: Path, model: str) -> dict[str, Any] | None:
    """The model's capacity plan (`model-analyzer plan`), when one was made for this run."""
    document = read_plan(export_path)
    if document is None:
        return None
    rows = (document.get("models") or {}).get(model)
    return ({"settings": document["settings"], "rows": rows, "mix": mix_text(rows)}
            if rows else None)  # fmt: skip


def _summary_figures(model: dict[str, Any], measured: list[dict[str, Any]],
                     winner: dict[str, Any] | None,
                     default: dict[str, Any] | None) -> list[dict[str, str]]:  # fmt: skip
    """The summary's plots: throughput vs p99 with the Pareto front, the final comparison's
    intervals, the winner and the default over load, and GPU memory when it was measured."""
    figures: list[dict[str, str]] = []
    if measured and winner is not None:
        figures.append({"alt": "throughput vs p99 latency per config, Pareto front marked",
                        "uri": plots.throughput_vs_latency(
                            measured, winner["name"], default["name"] if default else "",
                            _budget(model))})  # fmt: skip
        if model.get("final_comparison") and any(c.get("final_comparison") for c in measured):
            figures.append({"alt": "final comparison: throughput and p99 with 95% intervals",
                            "uri": plots.final_comparison(measured, model["final_comparison"])})
        pair = [winner] + ([default] if default and default is not winner and default in measured
                           else [])  # fmt: skip
        figures.append({"alt": "throughput vs load for the winner and the default",
                        "uri": plots.throughput_vs_load(
                            pair, "Throughput vs load: the winner and the default config")})
        if mode.mode == "offline":  # MA's offline preset: throughput by client batch size
            figures.append({"alt": "throughput vs client batch size for the winner and the "
                                   "default", "uri": plots.throughput_vs_batch_size(pair)})
        if any("gpu_used_memory" in m["metrics"] for c in measured for m in c["measurements"]):
            figures.append({"alt": "GPU memory vs throughput",
                            "uri": plots.gpu_memory_vs_throughput(measured, winner["name"])})
    return figures


def _render_detailed(env, css, model, config, breakdown: bytes, out: Path) -> Path:
    budget = _budget(model)
    rows = plots.breakdown_rows(config)
    for r in rows:
        p99 = r["measurement"]["metrics"]["perf_latency_p99"]
        r["breaks"] = budget is not None and p99 > budget
    m = config["best"]
    headline = (f"Best point: {m['metrics']['perf_throughput']:.1f} infer/s at {_load(m)}, "
                f"p99 {m['metrics']['perf_latency_p99']:.2f} ms"
                + ("" if config["satisfies_constraints"]
                   else f" — breaks {'; '.join(config['violations'])}"))  # fmt: skip
    figures = [
        {"alt": "throughput vs load", "uri": plots.throughput_vs_load(
            [config], f"Throughput vs load: {config['name']}")},
        {"alt": "latency breakdown per load point", "uri": plots.uri(breakdown)},
    ]  # fmt: skip
    folder = out / "detailed" / config["name"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "detailed_report.html"
    atomic_write_text(path, env.get_template("detailed_report.html.j2").render(
        css=css, model=model["name"], config=config, setting=_setting(config), headline=headline,
        rows=rows, plots=figures, config_pbtxt=config["description"].get("config_pbtxt", ""),
        load_header="concurrency" if m["load"] == "concurrency" else "request rate (/s)",
        source=RESULTS_FILE,
    ))  # fmt: skip
    return path


def render_reports(export_path: Path, formats: tuple[str, ...] = ("html",),
                   parts: tuple[str, ...] = REPORTS, configs: list[str] | None = None,
                   plot_specs: PlotChoice | None = None) -> list[Path]:  # fmt: skip
    """Every model's summary and its top configs' detailed reports (those of `parts`; `configs`:
    the configs named, MA's report_model_configs, instead of the top ones), MA's `plots/` files
    of each; with "pdf" in `formats` each page is also rendered to a PDF beside it
    (result_summary.pdf, detailed_report.pdf, as MA names them; WeasyPrint)."""
    document = load_results(export_path)
    if configs is not None:
        measured = {c["name"] for m in document["models"] for c in m["configs"]
                    if c["measurements"]}  # fmt: skip
        unknown = [name for name in configs if name not in measured]
        if unknown:
            raise ReportError(
                f"report_model_configs names '{unknown[0]}', which is no measured config of "
                f"the run in '{export_path}' (measured: {', '.join(sorted(measured)) or 'none'})")
    out = export_path / "reports"
    written: list[Path] = []
    for model in document["models"]:
        written += render_model(document, model, out, parts, configs, plot_specs)
    if "summary" in parts and document.get("top_across_models"):
        written += _render_top_across(document, out)
    if "pdf" in formats:
        import weasyprint  # imported here: it loads pango, which the HTML path never needs

        for page in [p for p in written if p.suffix == ".html"]:
            pdf = page.with_suffix(".pdf")
            atomic_write_bytes(pdf, weasyprint.HTML(filename=str(page)).write_pdf())
            written.append(pdf)
    return written


def _render_top_across(document: dict[str, Any], out: Path) -> list[Path]:
    """MA's `Best Configs Across All Models` summary (num_top_model_configs): one ranking of the
    best configs of every model, its table and the mode's preset plots, as a page and as
    `plots/simple/Best Configs Across All Models/` files."""
    by_name = {c["name"]: (m, c) for m in document["models"] for c in m["configs"]}
    chosen = [by_name[n] for n in document["top_across_models"] if n in by_name]
    if not chosen:
        return []
    configs = [c for _, c in chosen]
    constraints = [m["constraints"] for m, _ in chosen]  # drawn only when every model shares them
    shared = constraints[0] if all(c == constraints[0] for c in constraints) else {}
    key = plot_files.TOP_ACROSS_MODELS
    written = plot_files.write_summary_plots(out.parent, key, configs, shared, mode.mode)
    rows = [{**c, "model": m["name"], "setting": _setting(c), "load": _load(c["best"])}
            for m, c in chosen]  # fmt: skip
    figures = [{"alt": path.stem.replace("_", " "),
                "uri": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()}
               for path in written]  # fmt: skip
    folder = out / "summaries" / key
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / "result_summary.html"
    atomic_write_text(page, _environment().get_template("top_across_summary.html.j2").render(
        css=(TEMPLATES / "base.css").read_text(), title=key, created=document["created"],
        models=list(dict.fromkeys(m["name"] for m, _ in chosen)), ranking=rows, plots=figures,
        source=RESULTS_FILE,
    ))  # fmt: skip
    return [page, *written]
