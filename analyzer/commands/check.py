"""`model-analyzer check`: the repository doctor (repository/doctor.py) on the command line; one
line per problem, exit 0 when nothing stops a load, 1 when something does, 2 on bad usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from analyzer.errors import AnalyzerError
from analyzer.terminal import make_console


def check(
    model_repository: Annotated[
        Path, typer.Option("--model-repository", help="Triton model repository folder.")
    ],
    profile_models: Annotated[
        str | None,
        typer.Option(help="Comma-separated models to check (default: every model folder)."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="The findings as JSON on stdout.")
    ] = False,
) -> None:
    """Check a model repository for what would keep its models from loading, without serving
    them: each problem with its path and its fix (warnings do not fail the check)."""
    from analyzer.repository.doctor import check_repository
    from analyzer.worker.devices import gpu_count

    err = make_console(stderr=True)
    models = [m.strip() for m in (profile_models or "").split(",") if m.strip()] or None
    try:
        findings = check_repository(model_repository, models, gpu_count())
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    errors = [f for f in findings if f.severity == "error"]
    if json_output:
        print(json.dumps({"repository": str(model_repository), "ok": not errors,
                          "findings": [f.as_dict() for f in findings]}, indent=2))  # fmt: skip
    else:
        console = make_console()
        for finding in findings:
            console.print(finding.line(), markup=False, soft_wrap=True)
        if not findings:
            console.print(f"{model_repository}: no problems found", markup=False)
    raise typer.Exit(1 if errors else 0)
