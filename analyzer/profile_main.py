"""`model-analyzer profile`: parse the settings, run the profiler, write and print the results."""

from __future__ import annotations

import sys

from rich.console import Console

from analyzer.config.profile_config import ProfileConfigError, argument_parser, load_profile_config
from analyzer.launch.base import LaunchSetupError
from analyzer.profiler import Profiler
from analyzer.report.console import ProgressDisplay, print_summary
from analyzer.report.exports import write_csvs, write_results
from analyzer.report.html import render_reports
from analyzer.repository.repository import RepositoryError
from analyzer.search.space import SearchSpaceError


def profile_command(argv: list[str]) -> int:
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    if "-h" in argv or "--help" in argv:
        argument_parser().print_help(sys.stdout)
        return 0
    try:
        config = load_profile_config(argv)
    except ProfileConfigError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 2
    for note in config.notes:
        console.print(f"note: {note}", markup=False)
    try:
        with ProgressDisplay(console) as display:
            outcome = Profiler(config, display).run()
    except (ProfileConfigError, RepositoryError, SearchSpaceError, LaunchSetupError) as exc:
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
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        return 2
    paths = {"Results": write_results(outcome, results), **paths}
    written = render_reports(config.export)
    summaries = [p for p in written if p.name == "result_summary.html"]
    if summaries:
        paths["Reports"] = summaries[0].parent.parent
    print_summary(outcome, console, paths)
    failed = [m for m in outcome.models if m.error or not any(r.measurements for r in m.results)]
    return 1 if failed and len(failed) == len(outcome.models) else 0
