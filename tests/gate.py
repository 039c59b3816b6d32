"""A one-model worker core whose instance echoes X and holds its batches at a gate.

Tests that must queue requests behind a batch in flight (unload, ordering, faults around the
model) build a real ModelVersion over this backend; `gate.set()` lets the model go on.
"""

from __future__ import annotations

import threading
from pathlib import Path

from analyzer.config.model_config import parse_model_config
from analyzer.repository.repository import ModelSource
from analyzer.worker.backends.base import Backend, BackendInstance
from analyzer.worker.model import ModelVersion

WAIT_S = 60  # generous bound for "it eventually happens" on a shared 2-core machine


class GateInstance(BackendInstance):
    """A real instance whose execute waits for the test, like a model stuck in `execute`."""

    def __init__(self, gate: threading.Event, started: threading.Event):
        self.gate, self.started = gate, started

    def execute(self, requests, timing):
        self.started.set()
        self.gate.wait(WAIT_S)
        return [dict(r.inputs) for r in requests]


class GateBackend(Backend):
    name = "gate"

    def __init__(self):
        self.gate, self.started = threading.Event(), threading.Event()

    def create_instance(self, source, version, spec):
        return GateInstance(self.gate, self.started)


def gate_model(tmp_path: Path, extra: str = "") -> tuple[ModelVersion, GateBackend]:
    """A loaded model "m" (FP32 X in, X out, max_batch_size 8, one CPU instance); `extra` is
    appended to its config."""
    config = parse_model_config(
        'name: "m"\nmax_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
        'output [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{extra}"
    )
    backend = GateBackend()
    source = ModelSource(name="m", path=tmp_path, config=config, backend="gate", versions=[1])
    version = ModelVersion(source, 1, backend)
    version.load()
    return version, backend
