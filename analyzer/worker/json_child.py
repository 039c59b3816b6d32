"""Parses one JSON document from stdin for json_process.py, in a process of its own.

Run as a script (`python -I -S json_child.py`): the standard library only, so it starts in tens
of milliseconds and imports nothing of the worker's. Writes b"K" and a pickle of (the document
with each large list or object replaced by a marker, those as pickled slices), b"N" for JSON
that is not an object, or b"E" and the parser's error. The slices let the worker rebuild a
container a slice at a time: one pickle.loads over millions of values (numbers, empty lists,
keys) would hold the worker's GIL as json.loads did.
"""

from __future__ import annotations

import json
import pickle
import sys
from bisect import bisect_left
from itertools import accumulate, chain
from typing import Any

SLICE = 1 << 16  # values per pickled slice: a few ms to load each
_CONTAINERS = {list, dict}
Cut = list[tuple[bool, list[tuple[bytes, bool]]]]  # (is an object, its runs) by marker index


class _Node:
    """A list or object being measured, children first: its containers still to visit, the
    weight of each item (of a list; of each container's value, of an object), as it stands
    once the heavy ones are replaced by markers, and the items that are or hold markers."""

    __slots__ = ("value", "key", "todo", "weights", "marks")

    def __init__(self, value: list[Any] | dict[str, Any], key: Any) -> None:
        self.value = value
        self.key = key  # its place in its parent
        self.todo: list[Any] = []
        self.marks: set[Any] = set()
        if isinstance(value, dict):
            self.weights: list[int] | dict[Any, int] = {}
            self._visit(value.items())
            return
        self.weights = []
        types = set(map(type, value))  # C passes over the list from here on
        if not types & _CONTAINERS:
            return
        if types == {list} and not set(map(type, chain.from_iterable(value))) & _CONTAINERS:
            lengths = list(map(len, value))  # rows of scalars (a matrix's 'data')
            if max(lengths) < SLICE:
                self.weights = list(map((1).__add__, lengths))
                return
        self.weights = [1] * len(value)
        self._visit(enumerate(value))

    def _visit(self, pairs: Any) -> None:
        """Weigh a small list of scalars here; visit other containers."""
        weights, todo = self.weights, self.todo
        for key, item in pairs:
            if type(item) is list:
                if len(item) < SLICE and not set(map(type, item)) & _CONTAINERS:
                    weights[key] = 1 + len(item)
                else:
                    todo.append(key)
            elif type(item) is dict:
                todo.append(key)


def split(document: dict[str, Any]) -> tuple[Any, Cut]:
    """The document with each list or object of more than about SLICE values (its heavy
    parts already cut out) replaced by `(index,)` (a tuple: JSON has none), and those as
    `(is_object, runs)` by index: each run a pickled slice of about SLICE values, and
    whether markers lie inside it. Each container counts at least 1, so a list of millions of
    empty lists is cut too. Children first, iteratively: the document may be nested as deep
    as json.loads allows, and a marker's index is above those of the markers inside it. The
    document itself may come back as a marker."""
    cut: Cut = []
    root = [document]
    stack = [_Node(root, None)]
    while stack:
        node = stack[-1]
        if node.todo:
            key = node.todo.pop()
            stack.append(_Node(node.value[key], key))
            continue
        stack.pop()
        if not stack:  # the wrapper around the document
            break
        weight, marker = _measure(node, cut)
        parent = stack[-1]
        parent.weights[node.key] = weight
        if marker is not None:
            parent.value[node.key] = marker
        if node.marks or marker is not None:
            parent.marks.add(node.key)
    return root[0], cut


def _measure(node: _Node, cut: Cut) -> tuple[int, Any]:
    """(weight, its marker or None): a node heavier than SLICE is cut into runs."""
    value, weights = node.value, node.weights
    if isinstance(weights, list):
        weight = 1 + (sum(weights) if weights else len(value))
    else:
        weight = 1 + len(value) + sum(weights.values()) - len(weights)
    if weight <= SLICE:
        return weight, None
    items: list[Any] = list(value.items()) if isinstance(value, dict) else value
    keys = [k for k, _ in items] if isinstance(value, dict) else []
    if not weights:  # scalars: runs of SLICE items
        ends = [*range(SLICE, len(items), SLICE), len(items)]
    else:  # each run ends at the item where its weight reaches SLICE
        sizes = [weights.get(k, 1) for k in keys] if isinstance(weights, dict) else weights
        ends, total = [], 0
        totals = list(accumulate(sizes))
        while (end := bisect_left(totals, total + SLICE)) < len(items) - 1:
            ends.append(end + 1)
            total = totals[end]
        ends.append(len(items))
    marked = sorted(node.marks if isinstance(value, list) else
                    (i for i, k in enumerate(keys) if k in node.marks))  # fmt: skip
    runs, start = [], 0
    for end in ends:
        inside = bisect_left(marked, end) > bisect_left(marked, start)
        part = items[start:end]
        runs.append((pickle.dumps(dict(part) if isinstance(value, dict) else part,
                                  pickle.HIGHEST_PROTOCOL), inside))  # fmt: skip
        start = end
    cut.append((isinstance(value, dict), runs))
    return 1, (len(cut) - 1,)


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
    except RecursionError:  # within json's depth but past pickle's
        out.write(b"E" + b"nested too deeply")
        return 0
    out.write(b"K" + result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
