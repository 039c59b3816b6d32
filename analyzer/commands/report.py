"""`model-analyzer report`: the reports of a profile run rebuilt from its stored results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


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
