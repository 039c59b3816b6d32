"""CPU placement of the worker and the load generator: parsing, the default split, pinning."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from analyzer.launch.cpus import (
    CpuListError,
    core_groups,
    default_split,
    format_cpu_list,
    parse_cpu_list,
    pinned,
    plan_placement,
)


def topology(tmp_path: Path, siblings: dict[int, str]) -> Path:
    """A fake /sys/devices/system/cpu with these thread_siblings_list files."""
    for cpu, text in siblings.items():
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0,2-4, 7", "x") == {0, 2, 3, 4, 7}
    assert parse_cpu_list("0-7:2", "x") == {0, 2, 4, 6}
    assert format_cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    for bad in ("", "a", "3-1", "1-", "0-4:0"):
        with pytest.raises(CpuListError, match="'worker_cpus' is"):
            parse_cpu_list(bad, "worker_cpus")


def test_the_default_split_keeps_hyperthreads_together_and_gives_the_worker_most(tmp_path):
    # 8 cores x 2 threads, Linux numbering: cpu i and i+8 are siblings
    sysfs = topology(tmp_path, {i: f"{i % 8},{i % 8 + 8}" for i in range(16)})
    allowed = frozenset(range(16))
    assert core_groups(allowed, sysfs)[0] == [0, 8]
    worker, client = default_split(allowed, sysfs)
    assert client == {0, 1, 8, 9}  # a quarter of the cores, both threads of each
    assert worker == allowed - client
    two = topology(tmp_path / "two", {0: "0", 1: "1"})
    assert default_split(frozenset({0, 1}), two) == ({1}, {0})
    one_core = topology(tmp_path / "ht", {0: "0-1", 1: "0-1"})  # one core, two threads
    assert default_split(frozenset({0, 1}), one_core) == ({1}, {0})
    assert default_split(frozenset({3}), two) is None


def test_plan_placement_overrides_and_refusals(tmp_path):
    sysfs = topology(tmp_path, {i: str(i) for i in range(4)})
    allowed = frozenset(range(4))

    def plan(worker: str, client: str, local: bool = True):
        return plan_placement(worker, client, local, allowed, sysfs)

    default = plan("", "")
    assert (default.worker, default.client) == ({1, 2, 3}, {0})
    assert "load generator on CPUs 0" in default.how
    assert (plan("2-3", "").worker, plan("2-3", "").client) == ({2, 3}, {0, 1})
    assert (plan("", "3").worker, plan("", "3").client) == ({0, 1, 2}, {3})
    assert (plan("all", "").worker, plan("all", "").client) == (None, None)
    assert plan("0-3", "").client is None  # the worker has them all: the client is not pinned
    assert "share CPU 1" in plan("0-1", "1-2").how
    remote = plan("", "", local=False)
    assert (remote.worker, remote.client) == (None, None)
    assert plan("", "2", local=False).client == {2}
    with pytest.raises(CpuListError, match="'worker_cpus' is '1', but the worker is remote"):
        plan("1", "", local=False)
    with pytest.raises(CpuListError, match="CPU 7-8 is not one this process may use"):
        plan("2,7-8", "")
    single = plan_placement("", "", True, frozenset({2}), sysfs)
    assert (single.worker, single.client) == (None, None)
    assert default.to_dict() == {"worker_cpus": "1-3", "client_cpus": "0", "how": default.how}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_pinned_moves_every_thread_and_children_and_puts_them_back():
    before = os.sched_getaffinity(0)
    target = frozenset({min(before)})
    ready, done = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def other() -> None:
        ready.set()
        done.wait(10)
        seen["thread"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(10)
    with pinned(target):
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        done.set()
        thread.join(10)
        assert os.sched_getaffinity(0) == target
    assert child.stdout.strip() == str(sorted(target))
    assert seen["thread"] == target  # a thread started before the block was moved too
    assert os.sched_getaffinity(0) == before
