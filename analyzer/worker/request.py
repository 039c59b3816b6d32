"""The records that travel between the protocol layer, the scheduler and the model instances."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.datatypes import object_chunks

# a request's non-batch shapes: (input name, shape[1:]) per input, in order
Signature = tuple[tuple[str, tuple[int, ...]], ...]
Outputs = dict[str, np.ndarray]
# a response parameter's value, as the protocols carry them (bool, int64, string)
Parameter = bool | int | str


class Answer(dict[str, np.ndarray]):
    """Outputs that come with response parameters (a python model's InferenceResponse(
    parameters=...)); the protocols send them in the response's `parameters`."""

    __slots__ = ("parameters",)

    def __init__(self, outputs: Outputs, parameters: dict[str, Parameter]) -> None:
        super().__init__(outputs)
        self.parameters = parameters


def response_parameters(outputs: Outputs) -> dict[str, Parameter] | None:
    return outputs.parameters if type(outputs) is Answer else None


# the answer's hand-over: (outputs, None) or (None, error), once
OnDone = Callable[[Outputs | None, Exception | None], None]
# a decoupled model's response, as it is sent: (outputs or None, error, final)
OnResponse = Callable[[Outputs | None, Exception | None, bool], None]


@dataclass(slots=True)
class InferRequest:
    """One client request after decoding: input tensors are numpy views of the received bytes.

    `on_done(outputs, error)` is called exactly once, from whichever thread finished the request;
    the protocol layer makes it hop back onto its own event loop.
    """

    model_name: str
    inputs: dict[str, np.ndarray]
    wire_types: dict[str, str]
    requested_outputs: list[str] | None
    on_done: OnDone
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    arrival_ns: int = 0
    queue_start_ns: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    cancelled: bool = False  # the client went away: drop it instead of running it
    # batch_signature(): given by a protocol that knows it from a repeated layout, else set
    # once by a dynamic batcher's enqueue
    signature: Signature = ()
    # the execution that answered it, set by the instance runner (an ensemble sums its steps')
    timing: BatchTiming | None = None
    # a decoupled model's responses, each as it is sent: (outputs or None, error, final); set
    # by a protocol that can stream them (gRPC ModelStreamInfer). `on_done` then only says the
    # request is complete (or failed).
    on_response: OnResponse | None = None
    # input bytes counted against the worker's --max-queued-size until it is answered
    held_bytes: int = 0

    def cancel(self) -> None:
        """Called from the protocol's loop when the client disconnects or cancels the call."""
        self.cancelled = True

    def batch_signature(self) -> Signature:
        return batch_signature((name, arr.shape) for name, arr in self.inputs.items())


ELEMENT_OVERHEAD = 40  # a BYTES element's own object and its slot in the array, in bytes


def input_bytes(inputs: dict[str, np.ndarray]) -> int:
    """What a request's inputs hold: their bytes; a BYTES tensor's, its elements' lengths and
    each element's object (ELEMENT_OVERHEAD). A client may send a quarter as many elements as
    bytes: 16 million empty ones in 64 MiB held ~640 MB and counted as nothing."""
    total = 0
    for array in inputs.values():
        if array.dtype == object:
            for chunk, all_bytes in object_chunks(array):  # C-level passes, GIL-sized
                if all_bytes:  # what the protocols decode
                    total += sum(map(len, chunk))
                else:
                    total += sum(len(x) if isinstance(x, bytes | str) else 8 for x in chunk)
            total += array.size * ELEMENT_OVERHEAD
        else:
            total += array.nbytes
    return total


def batch_signature(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> Signature:
    """Requests batch together only when every non-batch dimension agrees: (name, shape[1:])
    per input, in order. A protocol that knows its requests' shapes ahead gives this itself."""
    return tuple((name, shape[1:]) for name, shape in shapes)


@dataclass(slots=True)
class BatchTiming:
    """Durations of one execution, shared by every request in it (Triton's accounting)."""

    compute_start_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
