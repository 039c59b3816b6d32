from __future__ import annotations

import sys
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
