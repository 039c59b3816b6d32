"""Parses one JSON document from stdin for json_process.py, in a process of its own.

Run as a script (`python -I -S json_child.py`): the standard library only, so it starts in tens
of milliseconds and imports nothing of the worker's. Writes b"K" and a pickle of (the document
with each long list replaced by a marker, the lists as pickled slices), b"N" for JSON that is
not an object, or b"E" and the parser's error. The slices let the worker rebuild a list a slice
at a time: one pickle.loads over millions of values would hold the worker's GIL as json.loads
did.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

SLICE = 1 << 16  # values per pickled slice: a few ms to load each


def weight(value: list[Any] | dict[str, Any]) -> int:
    """About how many values a list or object holds: a list of scalars costs one len(); lists
    that begin with a container, and objects, are counted through their containers."""
    if isinstance(value, dict):
        return len(value) + sum(weight(v) for v in value.values() if isinstance(v, list | dict))
    if not value or not isinstance(value[0], list | dict):
        return len(value)
    return sum(weight(v) if isinstance(v, list | dict) else 1 for v in value)


def runs(value: list[Any]) -> list[bytes] | None:
    """A non-empty list as pickled runs of items holding about SLICE values each (an item
    holding more is a run of its own), or None when it is to be walked into instead: small, or
    heavy through one item, which is then split itself."""
    if not isinstance(value[0], list | dict):  # scalars: runs of SLICE items
        if len(value) <= SLICE:
            return None
        return [pickle.dumps(value[i : i + SLICE], pickle.HIGHEST_PROTOCOL)
                for i in range(0, len(value), SLICE)]  # fmt: skip
    weights = [weight(v) if isinstance(v, list | dict) else 1 for v in value]
    if len(value) <= SLICE and (sum(weights) <= SLICE or max(weights) > SLICE):
        return None
    out: list[bytes] = []
    start = held = 0
    for i, w in enumerate(weights):
        held += w
        if held >= SLICE:
            out.append(pickle.dumps(value[start : i + 1], pickle.HIGHEST_PROTOCOL))
            start, held = i + 1, 0
    if start < len(value):
        out.append(pickle.dumps(value[start:], pickle.HIGHEST_PROTOCOL))
    return out


def split(document: dict[str, Any]) -> tuple[dict[str, Any], list[list[bytes]]]:
    """The document with each list of many values replaced by `(index,)` (a tuple: JSON has
    none), and those lists as pickled runs, by index. Iterative: the document may be nested as
    deep as json.loads allows."""
    lists: list[list[bytes]] = []
    stack: list[Any] = [document]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, list) and value:
                pieces = runs(value)
                if pieces is None:
                    stack.append(value)
                else:
                    node[key] = (len(lists),)
                    lists.append(pieces)
            elif isinstance(value, dict) and value:
                stack.append(value)
    return document, lists


def main() -> int:
    body = sys.stdin.buffer.read()
    out = sys.stdout.buffer
    try:
        document = json.loads(body)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an int over 4300 digits
        out.write(b"E" + str(err).encode())
        return 0
    except RecursionError:
        out.write(b"E" + b"nested too deeply")
        return 0
    if not isinstance(document, dict):
        out.write(b"N")
        return 0
    try:
        result = pickle.dumps(split(document), pickle.HIGHEST_PROTOCOL)
    except RecursionError:  # within json's depth but past pickle's (or weight()'s)
        out.write(b"E" + b"nested too deeply")
        return 0
    out.write(b"K" + result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
