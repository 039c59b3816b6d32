"""The `model-analyzer` command line: each command parses its flags and calls one function."""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Find the best serving configuration for a model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _as_bool(flag: str, value: str) -> bool:
    """tritonserver style `--allow-grpc=false`: booleans are values, not switches."""
    low = value.strip().lower()
    if low in _TRUE | _FALSE:
        return low in _TRUE
    raise typer.BadParameter(f"{flag} must be true or false, got '{value}'")


class ControlMode(StrEnum):
    none = "none"
    explicit = "explicit"


@app.callback()
def main() -> None:
    """Find the best serving configuration for a model (Triton-compatible)."""


@app.command()
def serve(
    model_repository: Annotated[
        Path, typer.Option("--model-repository", help="Triton model repository folder.")
    ],
    host: Annotated[str, typer.Option("--host", "--http-address", help="Bind address.")] = (
        "127.0.0.1"
    ),
    http_port: Annotated[int, typer.Option(help="HTTP port (0 picks a free one).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port (0 picks a free one).")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Metrics port (0 picks a free one).")] = 8002,
    model_control_mode: Annotated[ControlMode, typer.Option()] = ControlMode.none,
    load_model: Annotated[
        list[str] | None, typer.Option(help="Model to load at start in explicit mode ('*': all).")
    ] = None,
    allow_http: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_grpc: Annotated[str, typer.Option(help="true or false.")] = "true",
    allow_metrics: Annotated[str, typer.Option(help="true or false.")] = "true",
    exit_on_error: Annotated[
        str, typer.Option(help="true: exit if a model fails to load at start.")
    ] = "true",
    log_verbose: Annotated[int, typer.Option(help="1: log loads and batches.")] = 0,
) -> None:
    """Serve a model repository with Triton's HTTP/REST, gRPC and metrics protocols."""
    from analyzer.worker.server import ServeOptions
    from analyzer.worker.server import serve as run_worker

    logging.basicConfig(
        level=logging.INFO if log_verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = ServeOptions(
        model_repository=str(model_repository),
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_control_mode=model_control_mode.value,
        load_models=list(load_model or []),
        allow_http=_as_bool("--allow-http", allow_http),
        allow_grpc=_as_bool("--allow-grpc", allow_grpc),
        allow_metrics=_as_bool("--allow-metrics", allow_metrics),
        exit_on_error=_as_bool("--exit-on-error", exit_on_error),
    )
    raise typer.Exit(run_worker(options))
