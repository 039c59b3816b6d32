"""`model-analyzer profile`: the flags (generated from the settings' metadata, config/flags.py)
and the YAML to settings, the profiler run, the results written and printed."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any, TextIO

import typer

from analyzer.config.flags import given, profile_signature
from analyzer.config.profile_config import STORAGE_VARIABLE, ProfileConfig, load_settings
from analyzer.errors import AnalyzerError
from analyzer.terminal import make_console


def profile(**flags: Any) -> None:
    """Search, measure and rank serving configs of models (NVIDIA Model Analyzer's flags; the same
    keys in snake_case in the -f YAML file)."""
    err = make_console(stderr=True)
    try:
        config = load_settings(given(flags))
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    from analyzer.search.ledger import url_secrets  # the profile's modules load only for it

    os.environ.pop(STORAGE_VARIABLE, None)  # read: the worker and the models need not see it
    with _hide(url_secrets(config.storage)):
        try:
            code = _profile(config)
        except Exception:  # noqa: BLE001 - shown as Python would, minus any secret
            traceback.print_exc()
            code = 1
    raise typer.Exit(code)


profile.__signature__ = profile_signature()  # type: ignore[attr-defined]


class _Scrubbed:
    """A text stream that never lets a secret through: database drivers and Optuna may echo the
    storage URL or its password in errors, warnings and tracebacks we do not format ourselves."""

    def __init__(self, stream: TextIO, secrets: list[str]) -> None:
        self._stream = stream
        self._secrets = secrets

    def write(self, text: str) -> int:
        from analyzer.search.ledger import scrub

        self._stream.write(scrub(text, self._secrets))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _hide(secrets: list[str]) -> Iterator[None]:
    """stdout, stderr and the log handlers writing to them scrub `secrets` while the run lasts."""
    if not secrets:
        yield
        return
    originals = {id(sys.stdout): sys.stdout, id(sys.stderr): sys.stderr}
    wrapped = {key: _Scrubbed(stream, secrets) for key, stream in originals.items()}
    handlers = [h for h in _stream_handlers() if id(h.stream) in wrapped]
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = wrapped[id(old_out)], wrapped[id(old_err)]
    for handler in handlers:
        handler.setStream(wrapped[id(handler.stream)])  # type: ignore[arg-type]
    try:
        yield
    finally:
        for handler in handlers:
            handler.setStream(originals[id(handler.stream._stream)])  # type: ignore[attr-defined]
        sys.stdout, sys.stderr = old_out, old_err


def _stream_handlers() -> list[logging.StreamHandler]:
    known = logging.Logger.manager.loggerDict.values()
    loggers = [logging.getLogger(), *(lg for lg in known if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]


def _profile(config: ProfileConfig) -> int:
    from analyzer.profiler import Profiler
    from analyzer.report.console import ProgressDisplay, print_summary
    from analyzer.report.exports import write_csvs, write_results
    from analyzer.report.html import render_reports

    console = make_console(quiet=config.quiet)
    err = make_console(stderr=True)
    for note in config.notes:
        console.print(f"note: {note}", markup=False)
    try:
        with ProgressDisplay(console, config.verbose) as display:
            outcome = Profiler(config, display).run()
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print(
            "interrupted: every point measured so far is in the checkpoint "
            f"({config.checkpoints}); rerun the same command to resume",
            markup=False,
        )
        return 130
    results = config.export / "results"
    try:
        paths = write_csvs(outcome, results)
    except AnalyzerError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 2
    paths = {"Results": write_results(outcome, results), **paths}
    parts = tuple(part for part, skip in (("summary", config.skip_summary_reports),
                                          ("detailed", config.skip_detailed_reports)) if not skip)
    if render_reports(config.export, parts=parts):
        paths["Reports"] = config.export / "reports" / ("summaries" if "summary" in parts
                                                        else "detailed")  # fmt: skip
    print_summary(outcome, console, paths)
    failed = [m for m in outcome.models if m.error or not any(r.measurements for r in m.results)]
    return 1 if failed and len(failed) == len(outcome.models) else 0
