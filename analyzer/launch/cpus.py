"""Which CPUs the local worker and the load generator run on.

Sharing cores makes the load generator part of what is measured: its processes take the model's
CPU time, the scheduler moves both around, and the same config measures 20-50% apart minutes later.
On a machine with two or more cores a local worker and the load generator therefore get disjoint
sets by default. The load generator takes a quarter of the physical cores (at least one) and the
worker keeps the rest, so the model still has most of the machine. Hyperthread siblings stay on
one side, so the two sides never share a core's execution units. A GPU worker's feeding threads
live in the worker process, so they are on the worker's side too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from analyzer.cpulist import CpuListError, format_cpu_list, parse_cpu_list


def core_groups(cpus: frozenset[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[
    list[int]
]:
    """The CPUs grouped by physical core (hyperthread siblings together), lowest first."""
    groups: dict[frozenset[int], list[int]] = {}
    for cpu in sorted(cpus):
        siblings_file = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = parse_cpu_list(siblings_file.read_text().strip(), str(siblings_file))
        except (OSError, CpuListError):
            siblings = frozenset({cpu})
        groups.setdefault(siblings & cpus or frozenset({cpu}), []).append(cpu)
    return sorted(groups.values(), key=min)


@dataclass(frozen=True)
class Placement:
    """CPU sets for the worker and the load generator; None leaves a side unpinned."""

    worker: frozenset[int] | None
    client: frozenset[int] | None
    how: str  # one sentence for the console and the results file

    @property
    def worker_list(self) -> str:
        """The worker's set as a taskset list; "" when it is not pinned."""
        return format_cpu_list(self.worker) if self.worker else ""

    def to_dict(self) -> dict[str, str]:
        return {
            "worker_cpus": self.worker_list or "all",
            "client_cpus": format_cpu_list(self.client) if self.client else "all",
            "how": self.how,
        }


def default_split(allowed: frozenset[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> (
    tuple[frozenset[int], frozenset[int]] | None
):
    """(worker, client) by physical cores, the client on the lowest; None below two CPUs."""
    if len(allowed) < 2:
        return None
    groups = core_groups(allowed, sysfs)
    if len(groups) < 2:  # one core with several hyperthreads: split the threads
        groups = [[cpu] for cpu in sorted(allowed)]
    take = max(1, len(groups) // 4)
    client = frozenset(cpu for group in groups[:take] for cpu in group)
    return allowed - client, client


def plan_placement(
    worker_text: str,
    client_text: str,
    local_worker: bool,
    allowed: frozenset[int] | None = None,
    sysfs: Path = Path("/sys/devices/system/cpu"),
) -> Placement:
    """The sets for `--worker-cpus` / `--client-cpus` ("" = default, "all" = unpinned).

    A worker that is not on this machine (remote mode) is not placed; the load generator is
    pinned there only when asked.
    """
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    mine = format_cpu_list(allowed)

    def chosen(text: str, field: str) -> frozenset[int] | None:
        if text in ("", "all"):
            return None
        cpus = parse_cpu_list(text, field)
        outside = cpus - allowed
        if outside:
            raise CpuListError(
                f"'{field}' is '{text}', but CPU {format_cpu_list(outside)} is not one this "
                f"process may use ({mine})"
            )
        return cpus

    worker = chosen(worker_text, "worker_cpus")
    client = chosen(client_text, "client_cpus")
    if not local_worker:
        if worker_text:
            raise CpuListError(
                f"'worker_cpus' is '{worker_text}', but the worker is remote: its own host "
                "places it (worker_cpus applies to the local and docker launch modes)"
            )
        how = f"load generator on CPUs {format_cpu_list(client)}" if client else (
            "load generator not pinned (remote worker)"
        )
        return Placement(None, client, how)
    if "all" in (worker_text, client_text) and worker is None and client is None:
        return Placement(None, None, "worker and load generator share every CPU (asked)")
    if worker_text == "" and client_text == "":
        split = default_split(allowed, sysfs)
        if split is None:
            return Placement(None, None, f"worker and load generator share the one CPU ({mine})")
        worker, client = split
        return Placement(worker, client, (
            f"worker on CPUs {format_cpu_list(worker)}, load generator on CPUs "
            f"{format_cpu_list(client)}, so neither takes the other's time "
            "(--worker-cpus / --client-cpus to change)"
        ))  # fmt: skip
    if worker is not None and client_text == "":
        client = (allowed - worker) or None
    elif client is not None and worker_text == "":
        worker = (allowed - client) or None
    w = format_cpu_list(worker) if worker else "every CPU"
    c = format_cpu_list(client) if client else "every CPU"
    shared = worker & client if worker and client else frozenset()
    note = f" (they share CPU {format_cpu_list(shared)})" if shared else ""
    return Placement(worker, client, f"worker on {w}, load generator on {c}{note} (asked)")


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Every thread of this process on `cpus` for the block, each put back as it was after;
    threads and processes started inside inherit the set."""
    if not cpus:
        yield
        return
    before: dict[int, set[int]] = {}
    for tid in _threads():
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            before.pop(tid, None)
    try:
        yield
    finally:
        for tid, cpus_before in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus_before)


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread only
        return [0]
