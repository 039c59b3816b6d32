"""`model-analyzer export`: a profile's winners as a Triton model repository, or that repository
with a KServe InferenceService beside it (report/deploy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import AnalyzerError
from analyzer.terminal import make_console


def export(
    export_path: Annotated[
        Path, typer.Option("-e", "--export-path", help="The export path of a profile run.")
    ],
    output: Annotated[Path, typer.Option(help="A new (or empty) folder to write.")],
    format: Annotated[str, typer.Option(help="triton (a model repository) or kserve.")] = (
        "triton"
    ),
    model: Annotated[
        str | None, typer.Option(help="Comma-separated models (default: every profiled one).")
    ] = None,
    storage_uri: Annotated[
        str | None,
        typer.Option(help="kserve: where the repository will be uploaded (s3://..., gs://...)."),
    ] = None,
) -> None:
    """Write each model's winning config, under the model's own name, as a model repository ready
    to upload; with --format kserve also an InferenceService for KServe's Triton runtime (the
    measured resources, and the replicas of `model-analyzer plan` when it ran)."""
    from analyzer.report.deploy import export as write_export

    err = make_console(stderr=True)
    names = [m.strip() for m in (model or "").split(",") if m.strip()] or None
    try:
        written = write_export(export_path, format, output, names, storage_uri)
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console = make_console()
    for path in written:
        console.print(f"wrote {path}", markup=False)
