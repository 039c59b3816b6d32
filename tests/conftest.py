from __future__ import annotations

import fcntl
import sys
import tempfile
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


# `make test` runs two pytest-xdist processes. A test marked `exclusive_cpu` measures something
# only a machine with no other test running shows (a client alone on its core); it waits for the
# other processes' current tests and holds every other test back while it runs. A reader-writer
# lock over two files: the turnstile makes a waiting writer block new readers.
_LOCKS = Path(tempfile.gettempdir())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`exclusive_cpu` tests first (a stable sort: every xdist process collects the same order),
    so their files are handed out first and each runs while the others are still starting, not
    after waiting for the longest test in flight with every other process held idle."""
    items.sort(key=lambda item: item.get_closest_marker("exclusive_cpu") is None)


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
