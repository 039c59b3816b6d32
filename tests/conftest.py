from __future__ import annotations

import fcntl
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from serving import EXAMPLES, start_worker  # noqa: E402


@pytest.fixture(scope="session")
def examples_worker():
    """One worker serving the bundled examples for the whole session."""
    served = start_worker(EXAMPLES)
    yield served
    assert served.stop() == 0, "".join(served.output)


# `make test` runs pytest-xdist processes. A test marked `exclusive_cpu` measures something only
# a machine with no other test running shows (a client alone on its core); it waits for the
# other processes' current tests and holds every other test back while it runs. A reader-writer
# lock over two files: the turnstile makes a waiting writer block new readers.
_LOCKS = Path(tempfile.gettempdir())

# Seconds each file's tests took together (a 2-process run on the 2-core VM, 2026-11-29; the
# docker file's includes its image build, made once per fresh clone). Files are handed out
# longest first, so that no long file starts when the others are nearly done; the rest follow
# by number of tests, many first (pytest-xdist's own order, which `make test` turns off with
# --no-loadscope-reorder: it would sort these by their number of tests too, and give the docker
# file, four tests and ~6 min, out last). Rough figures suffice: an order, not a budget.
_FILE_SECONDS = {
    "test_profile.py": 490, "test_docker.py": 355, "test_ensemble.py": 165,
    "test_profile_safety.py": 115, "test_profile_parts.py": 105, "test_http_limits.py": 100,
    "test_loadgen.py": 100, "test_ma_peer.py": 95, "test_report.py": 90, "test_remote.py": 85,
    "test_plan_export.py": 70, "test_shared_study.py": 70, "test_together.py": 65,
    "test_fuzz.py": 45, "test_tls.py": 45, "test_loadgen_sequences.py": 40,
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with an `exclusive_cpu` test first (each then runs while the others are still
    starting, not after waiting for the longest test in flight with every other process held
    idle), then the longest files, then the rest by number of tests. A file's tests stay in
    their order and together (a stable sort on the file's keys)."""
    counts = Counter(item.path.name for item in items)
    exclusive = {item.path.name for item in items if item.get_closest_marker("exclusive_cpu")}
    items.sort(key=lambda item: (item.path.name not in exclusive,
                                 -_FILE_SECONDS.get(item.path.name, 0),
                                 -counts[item.path.name], str(item.path)))  # fmt: skip


@pytest.fixture(autouse=True)
def _machine_share(request: pytest.FixtureRequest) -> Iterator[None]:
    exclusive = request.node.get_closest_marker("exclusive_cpu") is not None
    with open(_LOCKS / "model-analyzer-tests.turnstile", "a") as turn, \
            open(_LOCKS / "model-analyzer-tests.lock", "a") as main:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if not exclusive:
            fcntl.flock(turn, fcntl.LOCK_UN)
        fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turn, fcntl.LOCK_UN)
