"""`model-analyzer profile`'s command line, generated from the settings' metadata: one Typer
option per Settings field that has one (`--kebab-case` of its name, its short flags and help).

Options are read as raw text (a bool as a switch) and validated with the YAML values by the
loader, so a flag and a YAML key can never disagree. MA's switches take no value; ours also accept
`--switch=true|false`, as the YAML does.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from analyzer.config.ignored import IGNORED
from analyzer.config.values import FIELDS, Field, ProfileConfigError, parse_bool
from analyzer.errors import usage_sentence


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# MA's keys that mean nothing here have their flags too (a note says so): MA's scripts run as is
_IGNORED = [Field(k, i.kind, help=f"MA's; no effect here: {i.why}.", flags=i.flags)
            for k, i in IGNORED.items() if i.cli]  # fmt: skip
_OPTIONS = [f for f in FIELDS if f.cli] + _IGNORED
_SWITCHES = {_flag(f.name) for f in _OPTIONS if f.kind == "bool"}


def _option(f: Field) -> Any:
    flag = _flag(f.name)
    if f.kind == "bool":
        return Annotated[bool | None, typer.Option(*f.flags, f"{flag}/--no-{flag[2:]}",
                                                   help=f.help)]  # fmt: skip
    if f.kind == "multi":
        return Annotated[list[str] | None, typer.Option(*f.flags, flag, help=f.help,
                                                        metavar="VALUE")]  # fmt: skip
    return Annotated[str | None, typer.Option(*f.flags, flag, help=f.help,
                                              metavar=f.kind.upper())]  # fmt: skip


def profile_signature() -> inspect.Signature:
    """The typed parameters of the `profile` command: every setting the command line has,
    None when not given (so the YAML's value, or the default, stands)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [inspect.Parameter(f.name, keyword, default=None, annotation=_option(f))
         for f in _OPTIONS]  # fmt: skip
    )


class ProfileCommand(TyperCommand):
    """The profile command: `--switch=false` is read as `--no-switch` before parsing."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, [_switch(arg) for arg in args])


def _switch(arg: str) -> str:
    flag, sep, value = arg.partition("=")
    if not sep or flag not in _SWITCHES:
        return arg
    try:
        return flag if parse_bool(value) else f"--no-{flag[2:]}"
    except ValueError:
        raise ProfileConfigError(
            f"command line: {flag} is '{value}'; expected true or false"
        ) from None


def given(flags: dict[str, Any]) -> dict[str, Any]:
    """The flags the command line set (a repeated flag given no time is not set)."""
    return {k: v for k, v in flags.items() if v is not None and v != [] and v != ()}


def parse_flags(argv: list[str]) -> dict[str, Any]:
    """`argv` read as the profile command reads it: the flags given, as raw values."""

    def profile(**flags: Any) -> None:
        """Only parsed, never run."""

    profile.__signature__ = profile_signature()  # type: ignore[attr-defined]
    app = typer.Typer()
    app.command(cls=ProfileCommand)(profile)
    command = typer.main.get_command(app)
    try:
        context = command.make_context("model-analyzer profile", list(argv))
    except typer.TyperException as exc:
        raise ProfileConfigError(f"command line: {usage_sentence(exc)}") from None
    return given(dict(context.params))
