"""The `model-analyzer` command line: one Typer app, one typed function per command, each in its
own module of analyzer/commands/. Every error a user's input causes is one line on stderr."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from analyzer.commands.check import check
from analyzer.commands.export import export
from analyzer.commands.perf import perf
from analyzer.commands.plan import plan
from analyzer.commands.profile import profile
from analyzer.commands.report import report
from analyzer.commands.serve import serve
from analyzer.config.flags import ProfileCommand
from analyzer.errors import AnalyzerError, usage_sentence


class _OneLineErrors(TyperGroup):
    """Typer prints a flag error as usage lines and a box; here it is `error: <sentence>` and exit
    2, as every other bad input (CI logs and scripts keep one line)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:  # fmt: skip
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no flags at all: the help is the answer
                exc.show()  # type: ignore[attr-defined]
            else:
                print(f"error: {usage_sentence(exc)}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except AnalyzerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        except typer.Abort:
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    help="Find the best serving configuration for a model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich's panel cuts long flag names to `--override-out…`
)
app.command()(serve)
app.command(no_args_is_help=True)(perf)
app.command(cls=ProfileCommand, context_settings={"help_option_names": ["-h", "--help"]})(profile)
app.command()(report)
app.command(no_args_is_help=True)(check)
app.command(no_args_is_help=True)(plan)
app.command(no_args_is_help=True)(export)


def _version(asked: bool) -> None:
    if asked:
        print(f"model-analyzer {metadata.version('model-analyzer')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit (MA's).")] = False,
    mode: Annotated[str, typer.Option("-m", "--mode",
                                      help="MA's preset of summary plots: online (throughput vs "
                                           "p99 latency) or offline (also throughput vs client "
                                           "batch size).")] = "online",
) -> None:  # fmt: skip
    """Find the best serving configuration for a model (Triton-compatible)."""
    from analyzer.commands import mode as preset

    if mode not in preset.MODES:
        raise typer.BadParameter(f"-m/--mode is '{mode}'; expected online or offline")
    preset.mode = mode


# tritonserver's flags that take no value (getopt's no_argument); here every flag has one
_TRITON_SWITCHES = {"--disable-auto-complete-config": "--disable-auto-complete-config=true"}


def server_main() -> None:
    """`model-analyzer-server`: the worker under exactly tritonserver's command line (no
    `serve` word), so MA's `triton_server_path`, an image's `tritonserver` and scripts written
    for tritonserver start it unchanged."""
    server = typer.Typer(pretty_exceptions_enable=False, rich_markup_mode=None,
                         add_completion=False)  # fmt: skip
    server.command()(serve)
    args = [_TRITON_SWITCHES.get(arg, arg) for arg in sys.argv[1:]]
    try:
        code = server(args, prog_name="model-analyzer-server", standalone_mode=False)
    except typer.TyperException as exc:
        print(f"error: {usage_sentence(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except AnalyzerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
