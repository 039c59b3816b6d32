"""Work of one Python value per element, kept away from the event loop.

Decoding a BYTES tensor makes one Python object per element (~0.4 µs each): a 64 MiB body holds
16 million, and on the loop that was 7-8 s in which the worker answered nobody, health checks
included. So a BYTES input of at least OFFLOAD_ELEMENTS elements is decoded, gRPC typed contents
that large converted, and a REST request whose JSON is OFFLOAD_JSON_BYTES or longer parsed, each
with its request checked and queued, on one side thread (`defer`); an answer holding an output
that large is encoded on the thread that finished it (`heavy`). The side thread takes each
model's requests in arrival order: while one of a model's requests waits there, that model's
later requests follow it instead of passing it (a sequence's steps stay in order).

A thread helps only with work made of short C calls: the loop gets the GIL back every 5 ms.
One C call over millions of values (`tolist()`, `np.asarray` of a list, `json.loads`) holds the
GIL, and so the loop, whatever thread makes it: conversions here work a slice at a time, and a
large JSON body is parsed in a child process (json_process.py).
Below the thresholds a request costs a truth test or two more, nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from analyzer.datatypes import tensor_from_bytes
from analyzer.worker.errors import InferError, Status
from analyzer.worker.limits import HeldBytes
from analyzer.worker.request import InferRequest

log = logging.getLogger(__name__)

OFFLOAD_ELEMENTS = 1 << 16  # ~25 ms of decoding; a text batch of any usual size stays inline
OFFLOAD_JSON_BYTES = 1 << 20  # a REST request's JSON this long is read on the side thread
PENDING = np.empty(0, dtype=np.object_)  # an input's place in `inputs` until it is decoded


@dataclass(slots=True)
class PendingInput:
    """An input received but not yet made into an array: `make` makes it (ValueError when it
    is malformed); meanwhile it holds `size` bytes."""

    name: str
    size: int
    make: Callable[[], np.ndarray] | None


def pending_bytes(name: str, data: bytes | memoryview, shape: tuple[int, ...],
                  count: int) -> PendingInput:  # fmt: skip
    """A BYTES input's serialized elements, decoded later."""
    return PendingInput(name, len(data), partial(tensor_from_bytes, data, "BYTES", shape, count))


class Submits(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def held(self) -> HeldBytes | None: ...

    def submit(self, request: InferRequest, checked: bool = False) -> None: ...


def heavy(outputs: Mapping[str, Any]) -> bool:
    """Whether an answer's encoding is worth keeping off the loop: an output with as many
    elements as a deferred input (a BYTES one makes a Python call per element; any other
    one may be asked for as JSON, one number at a time)."""
    try:
        for array in outputs.values():
            if array.size >= OFFLOAD_ELEMENTS:
                return True
    except AttributeError:  # not an array: the encoder answers that one with its error
        pass
    return False


_lock = threading.Lock()
# id(model) -> its requests handed to the side thread, not yet queued; read without the lock
waiting: dict[int, int] = {}
_executor: ThreadPoolExecutor | None = None


def submit(model: Submits, request: InferRequest, pending: list[PendingInput] | None,
           checked: bool = False) -> None:  # fmt: skip
    """Queue `request` on `model` now, or after its `pending` inputs are decoded on the side
    thread. Raises InferError only when queued now; later, errors reach `request.on_done`.
    (The front ends call `model.submit` themselves when `pending` is None and `waiting` is
    empty: the usual case, without this call.)"""
    if pending is None and id(model) not in waiting:
        model.submit(request, checked)
        return
    # a request waiting to be decoded is accepted: its serialized inputs count against
    # --max-queued-size until the decoded ones are counted in their place (model.submit)
    size = sum(item.size for item in pending) if pending else 0
    defer(model, size, lambda: _decode_and_submit(model, request, pending or [], checked))


def defer(model: Submits, size: int, job: Callable[[], None]) -> None:
    """Run `job` on the side thread after what waits there for `model`; until it has run,
    `size` bytes count against --max-queued-size (InferError, 503 / UNAVAILABLE, beyond it),
    and the model's later requests follow it. `job` answers its own errors."""
    global _executor
    key = id(model)
    held = model.held
    if size and held is not None:
        held.hold(size)  # raises InferError (503 / UNAVAILABLE) beyond the limit
    with _lock:
        waiting[key] = waiting.get(key, 0) + 1
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="offload")
        executor = _executor
    try:
        executor.submit(_run, key, held, size, job)
    except RuntimeError:  # the interpreter is shutting down: answer here
        _done(key, held, size)
        raise InferError("the worker is shutting down", Status.UNAVAILABLE) from None


def _run(key: int, held: HeldBytes | None, size: int, job: Callable[[], None]) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001 - a job answers its errors; this is a bug in one
        log.exception("a job on the offload thread failed")
    finally:
        _done(key, held, size)


def decode(request: InferRequest, pending: list[PendingInput]) -> None:
    """Put the decoded `pending` inputs in their places; InferError naming a malformed one."""
    for item in pending:
        if item.make is None:
            continue
        try:
            request.inputs[item.name] = item.make()
        except ValueError as err:
            raise InferError(f"input '{item.name}': {err}") from None
        finally:
            item.make = None  # the received bytes are not kept past their decoding


def _decode_and_submit(model: Submits, request: InferRequest, pending: list[PendingInput],
                       checked: bool) -> None:  # fmt: skip
    try:
        if request.cancelled:  # the client went (or the worker is stopping): not decoded
            raise InferError("request was cancelled", Status.UNAVAILABLE)
        decode(request, pending)
        model.submit(request, checked and not pending)
    except InferError as err:
        _answer(request, err)
    except Exception as err:  # a bug must still answer the request
        log.exception("a deferred request for model '%s' failed", model.name)
        _answer(request, InferError(f"internal error: {type(err).__name__}: {err}",
                                    Status.INTERNAL))  # fmt: skip


def _answer(request: InferRequest, error: InferError) -> None:
    try:
        request.on_done(None, error)
    except Exception:  # noqa: BLE001 - the protocol's callback; nothing else can answer
        log.exception("cannot answer a deferred request")


def _done(key: int, held: HeldBytes | None, size: int) -> None:
    if size and held is not None:
        held.give(size)
    with _lock:
        left = waiting.get(key, 0) - 1
        if left > 0:
            waiting[key] = left
        else:
            waiting.pop(key, None)
