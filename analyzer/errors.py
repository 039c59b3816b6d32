"""The one error base of the commands: `AnalyzerError` means the user's input is wrong (a flag, a
YAML key, a file, a folder), and its text is one sentence naming what and where. Every command
catches this type alone, prints the sentence and exits 2; anything else is a bug and keeps its
traceback. It is a ValueError, so code that validates with ValueError keeps working."""

from __future__ import annotations


class AnalyzerError(ValueError):
    """The user's input is wrong: print this one sentence."""
