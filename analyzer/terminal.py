"""Consoles that write whole lines to a file or a pipe, not only to a terminal.

rich renders at 80 columns when its stream is not a terminal (CI logs, `> log`, `| tee`), and a
table wider than that has every cell cut to `ra…`, `p99…`: the ranked summary becomes unreadable
exactly where it is kept. A terminal keeps rich's width; elsewhere lines get 120 columns (COLUMNS
still wins) and a table always gets its natural width.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console, RenderableType

NOT_A_TERMINAL_WIDTH = 120


def make_console(stderr: bool = False, quiet: bool = False) -> Console:
    """A console for stdout or stderr; a quiet one prints nothing (`--quiet`)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty() and not os.environ.get("COLUMNS"):
        width = NOT_A_TERMINAL_WIDTH
    return Console(stderr=stderr, highlight=False, width=width, quiet=quiet,
                   emoji=False)  # a user's ":abc:" (a host:port) stays as typed


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Print a table uncut: on a terminal at its width, elsewhere at least as wide as it needs."""
    if console.is_terminal:
        console.print(renderable)
        return
    needed = console.measure(renderable, options=console.options.update_width(10_000)).maximum
    width = console.width
    console.width = max(width, needed)  # print(width=...) cannot go beyond the console's own
    try:
        console.print(renderable)
    finally:
        console.width = width
