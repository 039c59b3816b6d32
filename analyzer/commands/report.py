"""`model-analyzer report`: the reports of a profile run rebuilt from its stored results.

MA's report keys, as flags and in a YAML file (`-f`): `export_path`, `report_model_configs`
(the configs to write detailed reports of, each optionally with its own `plots`),
`output_formats`, `plots` (the detailed reports' plots, written as MA's `plots/` files),
`checkpoint_directory` and `always_report_gpu_metrics`; the last two are accepted with a note
(the results file is the source here, and GPU columns show whenever a GPU was sampled).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

REPORT_KEYS = ("config_file", "checkpoint_directory", "export_path", "plots",
               "report_model_configs", "output_formats", "always_report_gpu_metrics")  # fmt: skip
FORMATS = ("html", "pdf")


def report(
    export_path: Annotated[
        Path | None, typer.Option("-e", "--export-path", help="The export path of a profile run.")
    ] = None,
    report_model_configs: Annotated[
        str | None,
        typer.Option("-n", "--report-model-configs",
                     help="Comma-separated configs (e.g. add_sub_config_default) to write "
                          "detailed reports of, instead of each model's top configs."),
    ] = None,
    output_formats: Annotated[
        str | None,
        typer.Option("-o", "--output-formats",
                     help="Comma-separated: html, pdf (the summary also as PDF)."),
    ] = None,
    report_format: Annotated[
        str | None, typer.Option(help="html, or pdf (as --output-formats).")
    ] = None,
    config_file: Annotated[
        Path | None, typer.Option("-f", "--config-file", help="A YAML file with report keys.")
    ] = None,
    checkpoint_directory: Annotated[
        Path | None,
        typer.Option("-s", "--checkpoint-directory",
                     help="Accepted for MA's scripts: the run's results file is the source."),
    ] = None,
    always_report_gpu_metrics: Annotated[
        bool, typer.Option("--always_report-gpu-metrics", "--always-report-gpu-metrics",
                           help="Accepted for MA's scripts: GPU columns are shown whenever a GPU "
                                "was sampled.")
    ] = False,
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

    try:
        values, notes = _settings(config_file, {
            "export_path": export_path, "report_model_configs": report_model_configs,
            "output_formats": output_formats or report_format,
            "checkpoint_directory": checkpoint_directory,
            "always_report_gpu_metrics": always_report_gpu_metrics or None,
        })  # fmt: skip
    except _BadInput as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for note in notes:
        typer.echo(f"note: {note}")
    export = Path(values.get("export_path") or ".").resolve()
    try:
        for note in refresh_from_studies(export, load_results(export), storage):
            typer.echo(f"note: {note}")
        written = render_reports(export, ("html", *values["output_formats"]),
                                 configs=values["report_model_configs"],
                                 plot_specs=values["plots"])  # fmt: skip
    except AnalyzerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(str(path))


class _BadInput(Exception):
    """A report key or value that cannot be used; the message names it."""


def _settings(config_file: Path | None, flags: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The report's settings: defaults < the YAML file < flags; notes for the keys accepted
    without an effect here."""

    from analyzer.config.yaml_file import YamlFileError, read_user_yaml

    raw: dict[str, Any] = {}
    where = "the command line"
    if config_file is not None:
        where = str(config_file)
        try:
            raw = read_user_yaml(config_file, "config file")
        except YamlFileError as err:
            raise _BadInput(str(err)) from None
        if not isinstance(raw, dict):
            raise _BadInput(f"config file '{config_file}' must hold a mapping of report keys")
        unknown = [k for k in raw if k not in REPORT_KEYS]
        if unknown:
            raise _BadInput(f"{where}: '{unknown[0]}' is not a key of the report command "
                            f"(its keys: {', '.join(REPORT_KEYS)})")  # fmt: skip
    merged = {**raw, **{k: v for k, v in flags.items() if v is not None}}
    if not isinstance(merged.get("export_path") or "", str | Path):
        raise _BadInput(f"{where}: 'export_path' is {merged['export_path']!r}; expected a folder")
    notes = []
    for key, why in (("checkpoint_directory", "the run's results file is the source"),
                     ("always_report_gpu_metrics", "GPU columns are shown whenever a GPU was "
                                                   "sampled")):  # fmt: skip
        if merged.get(key) not in (None, False):
            notes.append(f"'{key}' is accepted and changes nothing here: {why}")
    merged["plots"] = _plots(merged.get("plots"), merged.get("report_model_configs"), where)
    merged["report_model_configs"] = _names(merged.get("report_model_configs"), where)
    formats = _names(merged.get("output_formats"), where) or ["html"]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise _BadInput(f"{where}: output format '{bad[0]}' is not one of {', '.join(FORMATS)}")
    merged["output_formats"] = formats
    return merged, notes


def _plots(value: Any, configs: Any, where: str):
    """MA's `plots` (every detailed report's) and each `report_model_configs` entry's own
    `plots`, which replaces it for that config; checked whole before anything is drawn."""
    from analyzer.report.html import PlotChoice
    from analyzer.report.plot_files import PlotSpecError, parse_plots

    entries: list[tuple[Any, Any]] = []
    if isinstance(configs, dict):
        entries = list(configs.items())
    elif isinstance(configs, list):
        entries = [pair for item in configs if isinstance(item, dict) for pair in item.items()]
    try:
        per_config = {}
        for name, fields in entries:
            if fields is None:
                continue
            if not isinstance(fields, dict) or any(k != "plots" for k in fields):
                raise _BadInput(f"{where}: report_model_configs '{name}' may only hold 'plots', "
                                f"got {fields!r}")  # fmt: skip
            if "plots" in fields:
                per_config[str(name)] = parse_plots(fields["plots"], f"{where}: '{name}'")
        default = parse_plots(value, where) if value is not None else None
    except PlotSpecError as exc:
        raise _BadInput(str(exc)) from None
    return PlotChoice(default, per_config)


def _names(value: Any, where: str) -> list[str] | None:
    """MA's list forms: a comma-separated string, a list, or a mapping whose keys are the
    names (each with its own `plots`)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, dict):
        return [str(k) for k in value]
    if isinstance(value, list):
        out: list[str] = []
        for item in value:
            out += [str(k) for k in item] if isinstance(item, dict) else [str(item)]
        return out
    raise _BadInput(f"{where}: expected a name, a list of names or a mapping, got {value!r}")
