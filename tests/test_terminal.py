"""Console output to a file or a pipe is written whole (rich assumes 80 columns there)."""

from __future__ import annotations

import io
import sys

from rich.console import Console
from rich.table import Table

from analyzer.terminal import NOT_A_TERMINAL_WIDTH, make_console, print_whole

HEADERS = ("rank", "config", "instances", "max batch", "delay us", "load", "infer/s", "p99 ms",
           "vs default", "meets constraints", "client bound")  # fmt: skip
ROW = ("1", "resnet50_onnx_config_12 *", "2:GPU", "32", "1000", "c=64 b=1", "12345.6", "123.456",
       "1.42x", "yes", "no")  # fmt: skip


def test_a_wide_table_is_printed_whole_where_there_is_no_terminal():
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    table = Table()
    for header in HEADERS:
        table.add_column(header)
    table.add_row(*ROW)
    print_whole(console, table)
    text = out.getvalue()
    assert "…" not in text
    for cell in (*HEADERS, *ROW):
        assert cell in text, cell
    assert console.width == 80  # only that table got the room


def test_consoles_off_a_terminal_get_room(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a file or a pipe
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert make_console().width == NOT_A_TERMINAL_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert make_console(stderr=True).width == 90  # the user's COLUMNS still wins


def test_a_many_line_error_shows_its_cause_on_one_line():
    """A TorchScript failure's first line only says that an operation failed; profile showed
    just that, and the cause stayed in the results file."""
    from analyzer.report.console import headline

    error = ("RuntimeError: The following operation failed in the TorchScript interpreter.\n"
             "Traceback of TorchScript (most recent call last):\n  File \"code.py\", line 9\n"
             "RuntimeError: Input type (int) and bias type (float) should be the same\n")
    assert headline(error) == (
        "RuntimeError: The following operation failed in the TorchScript interpreter. ... "
        "RuntimeError: Input type (int) and bias type (float) should be the same")
    assert headline("one line\n") == "one line"
