"""Model names from the network are one path component, checked before any lookup or file access.

A name reaches the filesystem (the repository folder, a load's temporary folder) and log lines,
so anything that could walk out of a folder or pass for a flag is refused on every route.
"""

from __future__ import annotations

from analyzer.worker.errors import InferError

MAX_NAME_LENGTH = 255  # one path component on Linux filesystems


def check_model_name(name: str) -> str:
    """Return `name` when it is safe as one path component; InferError (400) otherwise."""
    if (
        not name
        or len(name) > MAX_NAME_LENGTH
        or name in (".", "..")
        or name.startswith("-")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or not name.isprintable()
    ):
        shown = name[:64].encode("unicode_escape").decode("ascii")
        raise InferError(
            f"invalid model name '{shown}': a model name is one folder name (no '/', '\\', NUL, "
            "'.' or '..', no leading '-')"
        )
    return name
