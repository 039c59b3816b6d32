"""CPU lists in taskset's syntax, parsed and written: shared by the settings (which validate
--worker-cpus and --client-cpus) and the launchers (which apply them)."""

from __future__ import annotations

import re

from analyzer.errors import AnalyzerError

_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class CpuListError(AnalyzerError):
    """A CPU list that is malformed or names CPUs this process may not use."""


def parse_cpu_list(text: str, field: str) -> frozenset[int]:
    """taskset -c syntax: "0", "2-7", "0,4-5", "0-14:2" (every second CPU)."""
    cpus: set[int] = set()
    for item in text.replace(" ", "").split(","):
        match = _ITEM.match(item)
        if not match:
            raise CpuListError(
                f"'{field}' is '{text}'; expected a CPU list such as 1, 2-7 or 0,4-5"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        step = int(match.group(3)) if match.group(3) else 1
        if last < first or step < 1:
            raise CpuListError(f"'{field}' is '{text}'; the range '{item}' is empty")
        cpus.update(range(first, last + 1, step))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int] | set[int]) -> str:
    """The shortest taskset -c list: {0, 1, 2, 5} -> "0-2,5"."""
    parts: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
