"""A model thread outlives faults around the model: every other request is still answered.

The instance runner answers a whole batch from one thread. Before these guards, one answer that
could not be handed over (its event loop closed, a protocol bug) or a fault in the statistics
ended that thread, and every later request on the model waited forever.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from gate import WAIT_S, gate_model

from analyzer.worker import instances as instances_module
from analyzer.worker.request import InferRequest


class _Answers:
    """Collects answers by request value; a value in `broken` raises from its on_done."""

    def __init__(self, broken: set[float] = frozenset()):
        self.broken = broken
        self.got: dict[float, object] = {}
        self.cond = threading.Condition()

    def request(self, value: float) -> InferRequest:
        def done(outputs, error):
            if value in self.broken:
                raise RuntimeError("Event loop is closed")
            with self.cond:
                self.got[value] = error if error is not None else float(outputs["X"][0, 0])
                self.cond.notify_all()

        return InferRequest(model_name="m", inputs={"X": np.full((1, 1), value, np.float32)},
                            wire_types={"X": "FP32"}, requested_outputs=None, on_done=done,
                            id=f"r{value:g}", arrival_ns=time.perf_counter_ns())  # fmt: skip

    def wait_for(self, values: set[float]) -> dict[float, object]:
        with self.cond:
            assert self.cond.wait_for(lambda: values <= self.got.keys(), WAIT_S), self.got
            return dict(self.got)


@pytest.mark.parametrize("extra", ["", "preserve_ordering: true"])
def test_an_answer_that_cannot_be_handed_over_loses_no_other(tmp_path, caplog, extra):
    version, backend = gate_model(tmp_path, f"dynamic_batching {{ {extra} }}")
    answers = _Answers(broken={2.0})
    try:
        version.submit(answers.request(0.0))  # runs alone; the next four queue behind it
        assert backend.started.wait(WAIT_S)
        for value in (1.0, 2.0, 3.0, 4.0):
            version.submit(answers.request(value))
        with caplog.at_level(logging.ERROR, logger="analyzer.worker.model"):
            backend.gate.set()
            got = answers.wait_for({0.0, 1.0, 3.0, 4.0})  # 2.0's own answer is the one lost
            version.submit(answers.request(5.0))  # the model thread lives on
            got = answers.wait_for({5.0})
        assert {k: got[k] for k in (1.0, 3.0, 4.0, 5.0)} == {1.0: 1.0, 3.0: 3.0, 4.0: 4.0, 5.0: 5.0}
        assert "handing the answer of request 'r2' to its client failed" in caplog.text
        assert "Event loop is closed" in caplog.text
    finally:
        version.unload()


def test_a_fault_in_the_statistics_still_answers_the_batch(tmp_path, caplog, monkeypatch):
    version, backend = gate_model(tmp_path, "dynamic_batching { }")
    answers = _Answers()
    calls = []

    def broken_record(ok, failed, timing):
        calls.append(len(ok))
        raise ZeroDivisionError("a bug in the bookkeeping")

    monkeypatch.setattr(version.stats, "record_batch", broken_record)
    backend.gate.set()
    try:
        with caplog.at_level(logging.ERROR, logger="analyzer.worker.instances"):
            version.submit(answers.request(1.0))
            assert answers.wait_for({1.0})[1.0] == 1.0
            version.submit(answers.request(2.0))
            assert answers.wait_for({2.0})[2.0] == 2.0
        assert calls == [1, 1]
        assert "recording a batch's statistics failed" in caplog.text
    finally:
        version.unload()


def test_a_fault_forming_a_batch_is_retried_not_fatal(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(instances_module, "_RETRY_S", 0.01)
    version, backend = gate_model(tmp_path, "dynamic_batching { }")
    backend.gate.set()
    answers = _Answers()
    scheduler = version.scheduler
    real = scheduler._form_batch
    faults = [ValueError("a bug in the batcher")]

    def flaky(dropped):
        if faults:
            raise faults.pop()
        return real(dropped)

    monkeypatch.setattr(scheduler, "_form_batch", flaky)
    try:
        with caplog.at_level(logging.ERROR, logger="analyzer.worker.instances"):
            version.submit(answers.request(7.0))
            assert answers.wait_for({7.0})[7.0] == 7.0  # the request stayed queued, then ran
        assert "forming a batch failed; trying again" in caplog.text
        assert "a bug in the batcher" in caplog.text
    finally:
        version.unload()
