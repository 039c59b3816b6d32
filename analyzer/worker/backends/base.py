"""What a backend provides to the worker, and the batching glue shared by tensor backends.

Lifecycle, driven by `analyzer.worker.model.ModelVersion`:
1. `Backend.auto_complete(source, version)` runs once per load and may fill the config
   (inputs, outputs, max_batch_size, dynamic_batching) the way Triton's backends do.
2. `Backend.create_instance(source, version, spec)` is called once per model instance; the
   instance is then owned by one runner thread, which calls `thread_init()` once on that thread,
   then `execute(requests, timing)` for each batch, and `finalize()` at unload.
Instances never see the network or the queue: they get a batch, they return one result per request.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analyzer.repository.repository import ModelSource
from analyzer.worker.request import BatchTiming, InferRequest, Outputs


class Deferred:
    """The result of a request that is still open when execute() returns: a decoupled model
    answers it later, through `BackendInstance.complete`, while the instance runs other batches
    (Triton frees a decoupled model's instance once execute() returns)."""

    __slots__ = ()


DEFERRED = Deferred()


class Rescheduled:
    """The result of a request the model released with RELEASE_RESCHEDULE: it goes back to the
    sequence batcher for a later batch (sequence_batching { iterative_sequence: true })."""

    __slots__ = ()


RESCHEDULED = Rescheduled()
# One result per request: its output tensors, the exception that failed it alone, DEFERRED or
# RESCHEDULED.
Result = dict[str, np.ndarray] | Exception | Deferred | Rescheduled
# how an instance answers a deferred request: (request, outputs, None) or (request, None, error)
Complete = Callable[[InferRequest, Outputs | None, Exception | None], None]


@dataclass(frozen=True)
class InstanceSpec:
    """Where and how one model instance runs."""

    name: str  # Triton's instance name, e.g. "add_sub_0_1"
    group: str
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int  # CUDA device for GPU instances, 0 otherwise
    index: int  # position among all instances of this model version
    count: int  # number of instances of this model version
    cpu_threads: int  # intra-op thread budget for this instance


class BackendInstance(ABC):
    # set by the runner: answers the requests an execute() returned as DEFERRED, once each
    complete: Complete | None = None

    def thread_init(self) -> None:  # noqa: B027 - optional hook
        """Called once on the runner thread before the first batch (thread-local settings)."""

    @abstractmethod
    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        """Run one batch; fill `timing`'s compute_input/infer/output durations."""

    def probe_ready(self) -> bool | asyncio.Future[bool]:
        """(On an event loop.) Whether this instance can serve now, for the model's readiness
        endpoint: a future when the answer must be asked for (a python model's is_ready())."""
        return True

    def forget(self, requests: list[InferRequest]) -> None:  # noqa: B027 - optional hook
        """These requests were answered by the runner (an unload gave up on their batch): an
        instance that defers answers must not answer them again."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds (sessions, processes, device memory)."""


class Backend(ABC):
    """One backend kind (pytorch, onnxruntime, python); stateless, all state lives in instances."""

    name: str = ""

    def auto_complete(self, source: ModelSource, version: int) -> None:  # noqa: B027
        """Fill missing config fields in place from the model itself (Triton's auto-complete)."""

    def gpu_capable(self) -> bool:
        """Whether this process can run the backend on a GPU: the default kind follows it."""
        return False

    @abstractmethod
    def create_instance(
        self, source: ModelSource, version: int, spec: InstanceSpec
    ) -> BackendInstance: ...


class TensorInstance(BackendInstance):
    """Batching glue for backends that run one tensor program on a whole batch.

    Concatenates each input along the batch dimension (one copy per batch), calls `infer`, and
    splits the outputs back per request as views. With max_batch_size 0 there is no batch
    dimension and every request runs alone.
    """

    def __init__(self, batched: bool):
        self.batched = batched

    @abstractmethod
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model; outputs are host numpy arrays."""

    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        t0 = time.perf_counter_ns()
        if len(requests) == 1:
            inputs = requests[0].inputs
        else:
            inputs = {
                name: np.concatenate([r.inputs[name] for r in requests], axis=0)
                for name in requests[0].inputs
            }
        t1 = time.perf_counter_ns()
        outputs = self.infer(inputs)
        t2 = time.perf_counter_ns()
        if len(requests) == 1:
            results: list[Result] = [outputs]
        else:
            results = []
            offset = 0
            for r in requests:
                end = offset + r.batch_size
                results.append({name: out[offset:end] for name, out in outputs.items()})
                offset = end
        t3 = time.perf_counter_ns()
        timing.compute_input_ns = t1 - t0
        timing.compute_infer_ns = t2 - t1
        timing.compute_output_ns = t3 - t2
        return results
