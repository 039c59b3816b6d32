"""The scheduler's batch formation, driven directly with real requests (no server)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from analyzer.config.model_config import parse_model_config
from analyzer.worker.batcher import Scheduler
from analyzer.worker.errors import InferError
from analyzer.worker.request import InferRequest
from analyzer.worker.stats import ModelStats


def scheduler(extra: str, max_batch_size: int = 8) -> Scheduler:
    config = parse_model_config(f'name: "m"\nmax_batch_size: {max_batch_size}\n{extra}')
    return Scheduler(config, ModelStats("m", 1))


def request(batch: int = 1, width: int = 4, done=None) -> InferRequest:
    r = InferRequest(
        model_name="m",
        inputs={"X": np.zeros((batch, width), np.float32)},
        wire_types={"X": "FP32"},
        requested_outputs=None,
        on_done=done or (lambda o, e: None),
        arrival_ns=time.perf_counter_ns(),
    )
    r.batch_size = batch
    return r


def test_without_dynamic_batching_each_request_runs_alone():
    s = scheduler("")
    for _ in range(3):
        s.enqueue(request())
    assert [len(s.next_batch()) for _ in range(3)] == [1, 1, 1]


def test_zero_delay_sends_everything_pending_up_to_max():
    s = scheduler("dynamic_batching {}")
    for b in (3, 3, 3):
        s.enqueue(request(b))
    assert [r.batch_size for r in s.next_batch()] == [3, 3]  # 9 would exceed 8
    assert [r.batch_size for r in s.next_batch()] == [3]


def test_preferred_size_is_favoured():
    s = scheduler("dynamic_batching { preferred_batch_size: [2, 4] }")
    for _ in range(3):
        s.enqueue(request())
    assert len(s.next_batch()) == 2  # largest preferred size found among the 3 pending


def test_different_shapes_do_not_batch_together():
    s = scheduler("dynamic_batching {}")
    s.enqueue(request(width=4))
    s.enqueue(request(width=5))
    assert len(s.next_batch()) == 1
    assert len(s.next_batch()) == 1


def test_queue_delay_waits_for_more_requests_then_sends():
    delay_us = 300_000
    s = scheduler(f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    first = request()
    s.enqueue(first)
    threading.Timer(0.05, lambda: s.enqueue(request())).start()
    batch = s.next_batch()
    waited = time.perf_counter_ns() - first.queue_start_ns
    assert len(batch) == 2  # the second request arrived within the delay and joined
    assert waited / (delay_us * 1000) >= 0.99  # held for the whole delay: the batch could grow


def test_full_batch_does_not_wait_for_the_delay():
    delay_us = 5_000_000
    s = scheduler(f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    for _ in range(8):
        s.enqueue(request())
    t0 = time.perf_counter_ns()
    assert len(s.next_batch()) == 8
    assert (time.perf_counter_ns() - t0) / (delay_us * 1000) < 0.5


def _waiting_instance(s: Scheduler) -> tuple[threading.Thread, list]:
    """An instance thread blocked in next_batch; its batch lands in the returned list."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(s.next_batch()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not s._idle and time.monotonic() < deadline:
        time.sleep(0.001)
    assert s._idle == 1
    return thread, got


@pytest.mark.parametrize("event", ["full batch", "other shape"])
def test_a_waiting_instance_launches_as_soon_as_an_arrival_allows(event):
    delay_us = 30_000_000  # far longer than the test: only a wake-up can launch the batch
    s = scheduler(f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    thread, got = _waiting_instance(s)
    s.enqueue(request())  # starts the instance's timed wait for more
    if event == "full batch":
        for _ in range(7):
            s.enqueue(request())
    else:
        s.enqueue(request(width=5))  # cannot join: the first request's batch is complete
    thread.join(10)
    assert not thread.is_alive()
    assert len(got[0]) == (8 if event == "full batch" else 1)


def test_arrivals_that_cannot_launch_a_batch_do_not_wake_the_instance(monkeypatch):
    """Waking the instance for every request cost a thread switch and a queue walk each."""
    s = scheduler("dynamic_batching { max_queue_delay_microseconds: 30000000 }")
    thread, got = _waiting_instance(s)
    wakes = []
    notify = s._cond.notify
    monkeypatch.setattr(s._cond, "notify", lambda n=1: (wakes.append(n), notify(n)))
    for _ in range(5):
        s.enqueue(request())
    assert len(wakes) == 1  # the first arrival starts the delay; the next four change nothing
    s.close()
    thread.join(10)
    assert got == [None]


def test_max_queue_size_rejects_at_once():
    s = scheduler("dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    s.enqueue(request())
    s.enqueue(request())
    with pytest.raises(InferError, match="maximum queue size"):
        s.enqueue(request())


def test_priority_levels_serve_higher_priority_first():
    s = scheduler("dynamic_batching { priority_levels: 2 default_priority_level: 2 }", 1)
    low = request()
    high = request()
    high.priority = 1
    s.enqueue(low)
    s.enqueue(high)
    assert s.next_batch() == [high]
    assert s.next_batch() == [low]


def test_timeout_rejects_expired_requests():
    errors = []
    s = scheduler(
        "dynamic_batching { max_queue_delay_microseconds: 100000 "
        "default_queue_policy { allow_timeout_override: true } }"
    )
    expiring = request(done=lambda o, e: errors.append(e))
    expiring.timeout_us = 1000  # the request's own timeout; the default is none
    s.enqueue(expiring)
    time.sleep(0.01)
    kept = request()
    s.enqueue(kept)
    assert s.next_batch() == [kept]
    assert len(errors) == 1 and "timeout" in str(errors[0])


def test_close_releases_waiting_instances_and_returns_leftovers():
    s = scheduler("dynamic_batching { max_queue_delay_microseconds: 10000000 }")
    s.enqueue(request())
    results = []
    t = threading.Thread(target=lambda: results.append(s.next_batch()))
    t.start()
    time.sleep(0.05)
    leftovers = s.close()
    t.join(5)
    assert results == [None] and len(leftovers) == 1


def test_a_delay_past_any_clock_waits_without_overflowing():
    """max_queue_delay_microseconds of 2^64-1: the wait raised OverflowError, logged a traceback
    every 0.2 s and never answered; it is now a long wait that close() ends."""
    s = scheduler("dynamic_batching { preferred_batch_size: [ 8 ] "
                  "max_queue_delay_microseconds: 18446744073709551615 }")  # fmt: skip
    s.enqueue(request())
    results: list = []
    t = threading.Thread(target=lambda: results.append(s.next_batch()))
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # waiting, not failing
    assert len(s.close()) == 1
    t.join(5)
    assert results == [None]


def _sequence_request(corrid: int, start: bool) -> InferRequest:
    from analyzer.worker.params import SEQUENCE_START

    r = request(batch=1)
    r.correlation_id = corrid
    r.flags = SEQUENCE_START if start else 0
    return r


def test_many_queued_sequences_cost_each_request_a_bounded_amount_of_work(monkeypatch):
    """Each request scanned every live sequence against the whole queue for idleness (under the
    lock the event loop takes): 3,000 queued sequences held the worker for minutes. Now a
    request checks its own sequence, and a pass over all of them runs at most every 50 ms."""
    from analyzer.worker import sequence as sequence_module
    from analyzer.worker.sequence import SequenceScheduler

    config = parse_model_config(
        'name: "m"\nmax_batch_size: 1073741824\nsequence_batching { '
        "max_sequence_idle_microseconds: 18446744073709551615 oldest { "
        "max_candidate_sequences: 4096 preferred_batch_size: [ 1073741824 ] "
        "max_queue_delay_microseconds: 18446744073709551615 } }")  # fmt: skip
    s = SequenceScheduler(config, ModelStats("m", 1), lambda *a: None)
    s.set_instances(1)
    checks = 0
    original = sequence_module._Sequence.idle

    def counted(self, now, idle_ns):
        nonlocal checks
        checks += 1
        return original(self, now, idle_ns)

    monkeypatch.setattr(sequence_module._Sequence, "idle", counted)
    monkeypatch.setattr(sequence_module, "SWEEP_NS", 1 << 62)  # no timed pass in this test
    results: list = []
    t = threading.Thread(target=lambda: results.append(s.lane(0).next_batch()))
    t.start()  # an instance waiting all along, woken by every arrival
    n = 3000
    for corrid in range(1, n + 1):
        s.enqueue(_sequence_request(corrid, start=True))
    for corrid in range(1, n + 1):
        s.enqueue(_sequence_request(corrid, start=False))
    assert s.pending == 2 * n
    assert checks <= 2 * n  # one per request for its own sequence (was ~n x queue per request)
    assert len(s.close()) == 2 * n
    t.join(5)
    assert results == [None]


def _scheduler(config_text: str):
    from analyzer.worker.sequence import SequenceScheduler

    s = SequenceScheduler(parse_model_config(config_text), ModelStats("m", 1), lambda *a: None)
    s.set_instances(1)
    return s


def test_sequences_beyond_the_slots_wait_in_the_backlog_until_one_ends():
    """Every live sequence was a candidate for every batch; Triton gives an instance
    max_batch_size sequence slots (max_candidate_sequences with `oldest`), and a sequence
    started beyond them waits, with its requests, until a slot frees."""
    from analyzer.worker.params import SEQUENCE_END

    s = _scheduler('name: "m"\nmax_batch_size: 2\nsequence_batching { direct { } }')
    for corrid in (1, 2, 3):
        s.enqueue(_sequence_request(corrid, start=True))
    lane = s.lane(0)
    assert [r.correlation_id for r in lane.next_batch()] == [1, 2]  # 3 holds no slot
    s.enqueue(_sequence_request(3, start=False))  # held with its sequence
    s.enqueue(_sequence_request(2, start=False))
    end = _sequence_request(1, start=False)
    end.flags |= SEQUENCE_END
    s.enqueue(end)
    assert [r.correlation_id for r in lane.next_batch()] == [2, 1]
    assert s.pending == 2  # sequence 3's two requests, now in the lane
    assert [r.correlation_id for r in lane.next_batch()] == [3]
    assert [r.correlation_id for r in lane.next_batch()] == [3]


def test_max_candidate_sequences_sets_the_oldest_strategys_slots():
    s = _scheduler('name: "m"\nmax_batch_size: 4\nsequence_batching { oldest { '
                   'max_candidate_sequences: 1 } }')
    for corrid in (1, 2):
        s.enqueue(_sequence_request(corrid, start=True))
        s.enqueue(_sequence_request(corrid, start=False))
    lane = s.lane(0)
    assert [r.correlation_id for r in lane.next_batch()] == [1]
    assert [r.correlation_id for r in lane.next_batch()] == [1]
    leftover = s.close()  # the held requests are answered too
    assert [r.correlation_id for r in leftover] == [2, 2]
