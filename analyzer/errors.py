"""The one error base of the commands: `AnalyzerError` means the user's input is wrong (a flag, a
YAML key, a file, a folder), and its text is one sentence naming what and where. Every command
catches this type alone, prints the sentence and exits 2; anything else is a bug and keeps its
traceback. It is a ValueError, so code that validates with ValueError keeps working. A parse error
of the command line is shown the same way (`usage_sentence`)."""

from __future__ import annotations


class AnalyzerError(ValueError):
    """The user's input is wrong: print this one sentence."""


def usage_sentence(exc: Exception) -> str:
    """A command-line parse error (Typer's) as one sentence, without the usage lines and box
    around it: a bad flag is bad input like any other."""
    option = getattr(exc, "option_name", None)
    if option and hasattr(exc, "possibilities"):  # a flag the command does not have
        close = sorted(exc.possibilities or [])
        return f"unrecognized arguments: {option}" + (
            f" (did you mean {', '.join(close)}?)" if close else ""
        )
    text = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return " ".join(text.split())
