"""One loaded model version: its completed config, scheduler, instances and statistics."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine, Iterable
from typing import Any

from tritonclient.grpc import model_config_pb2

from analyzer.config.model_config import ModelConfig
from analyzer.datatypes import config_to_wire
from analyzer.repository.repository import ModelSource
from analyzer.worker import devices, load_deadline
from analyzer.worker.backends.base import Backend, InstanceSpec
from analyzer.worker.batcher import Scheduler
from analyzer.worker.errors import InferError, Status
from analyzer.worker.instances import BatchSource, InstanceRunner
from analyzer.worker.limits import HeldBytes, Limits
from analyzer.worker.memory import release_free_memory
from analyzer.worker.request import InferRequest, Outputs
from analyzer.worker.sequence import SequenceScheduler
from analyzer.worker.stats import ModelStats
from analyzer.worker.validate import RequestValidator
from analyzer.worker.warmup import warmup_samples

log = logging.getLogger(__name__)
KIND = model_config_pb2.ModelInstanceGroup.Kind
_THREAD_PARAMS = ("INTRA_OP_THREAD_COUNT", "intra_op_thread_count")
# how long an unload waits, in all, for the instances' in-flight batches before answering them
UNLOAD_JOIN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 5.0  # a readiness check's wait for the instances' answers (Triton's 5 s)


class ModelVersion:
    """Serves one version of one model; `submit` is called on the protocol's event loop.

    Every answer to an accepted request (result, model error, expiry, cancellation, queue full,
    unload) goes through `_deliver`, so preserve_ordering sees each sequence number once.
    """

    def __init__(
        self,
        source: ModelSource,
        version: int,
        backend: Backend,
        max_instance_count: int = Limits.max_instance_count,
        held: HeldBytes | None = None,
    ):
        self.source = source
        self.held = held  # the worker's --max-queued-size, shared by every model
        self.name = source.name
        self.version = version
        self.backend = backend
        self.max_instance_count = max_instance_count
        self.config: ModelConfig = source.config
        self.stats = ModelStats(self.name, version)
        self._order = _OrderedDelivery() if self._preserve_ordering() else None
        self.scheduler: Scheduler | SequenceScheduler = (
            SequenceScheduler(self.config, self.stats, self._deliver)
            if self.config.HasField("sequence_batching")
            else Scheduler(self.config, self.stats, self._deliver))  # fmt: skip
        self.validator = RequestValidator(self.config)
        self.runners: list[InstanceRunner] = []
        self.decoupled = self.config.model_transaction_policy.decoupled

    def _preserve_ordering(self) -> bool:
        return self.config.HasField("dynamic_batching") and bool(
            self.config.dynamic_batching.preserve_ordering
        )

    def load(self) -> None:
        """Create every instance; on failure, finalize what was created and re-raise."""
        if self.decoupled and self.source.backend != "python":
            raise ValueError(f"model '{self.name}': model_transaction_policy.decoupled is "
                             "supported for python models only")  # fmt: skip
        sequences = self.scheduler if isinstance(self.scheduler, SequenceScheduler) else None
        if sequences is not None and self.config.sequence_batching.state:  # refuse, not serve
            raise ValueError(f"model '{self.name}': sequence_batching.state (implicit state) is "
                             "not supported by this worker")  # fmt: skip
        specs = instance_specs(self.config, self.backend.gpu_capable(), self.max_instance_count)
        if sequences is not None:
            sequences.set_instances(len(specs))
        samples = warmup_samples(self.config, self.source.path)
        timed_out = False
        try:
            for index, spec in enumerate(specs):
                if load_deadline.remaining() == 0:
                    raise load_deadline.expired(f"{index} of {len(specs)} instances were created")
                instance = self.backend.create_instance(self.source, self.version, spec)
                scheduler = self.scheduler  # narrowed below: a lane, or the batcher itself
                lane: BatchSource = (
                    scheduler.lane(index) if isinstance(scheduler, SequenceScheduler) else scheduler
                )
                runner = InstanceRunner(spec, instance, lane, self.stats, self._deliver,
                                        samples, max(self.config.max_batch_size, 1))  # fmt: skip
                self.runners.append(runner)
            for runner in self.runners:
                runner.start()
            for runner in self.runners:  # READY only once every instance ran its warm-up
                if not runner.warmed.wait(load_deadline.remaining()):
                    timed_out = True
                    raise load_deadline.expired(f"instance {runner.spec.name}'s warm-up "
                                                "(model_warmup) was still running")  # fmt: skip
                if runner.warmup_error is not None:
                    raise ValueError(f"model '{self.name}' instance {runner.spec.name}: "
                                     f"{runner.warmup_error}")  # fmt: skip
        except BaseException:
            samples = []  # the warm-up's inputs go before the trim, not with the traceback
            self.unload(join_timeout_s=0.0 if timed_out else None)
            raise
        if samples:
            samples = []
            release_free_memory()  # the warm-up's inputs and activations

    def submit(self, request: InferRequest, checked: bool = False) -> None:
        """Queue a valid request; once queued (or refused by the queue) it is answered once.

        `checked`: the caller ran `validator.check` on this request's layout already.
        """
        if not checked:
            self.validator.check(request)
        if self.decoupled and request.on_response is None:
            raise InferError(
                f"model '{self.name}' is decoupled (it may send any number of responses per "
                "request): call it over gRPC streaming (ModelStreamInfer), not HTTP or unary "
                "gRPC", Status.UNSUPPORTED)  # fmt: skip
        if self.held is not None:
            self.held.admit(request)
        if self._order is not None:
            self._order.register(request)
        try:
            self.scheduler.enqueue(request)
        except InferError as err:  # queue full or unloading: answered in its turn
            self.stats.record_failure(request)
            self._deliver(request, None, err)

    def _deliver(self, request: InferRequest, outputs: Outputs | None,
                 error: Exception | None) -> None:  # fmt: skip
        if self.held is not None:
            self.held.release(request)
        if self._order is None:
            try:
                request.on_done(outputs, error)
            except Exception:  # noqa: BLE001 - see _answer_failed
                _answer_failed(request)
        else:
            self._order.done(request, outputs, error)

    def unload(self, join_timeout_s: float | None = None) -> None:
        """Answer what is queued, let in-flight batches finish, then finalize the instances.

        A runner still busy after the join timeout has its batch answered with an error here, so
        no client waits on a model that is gone; its late results are discarded.
        """
        gone = InferError(f"model '{self.name}' was unloaded", Status.UNAVAILABLE)
        for request in self.scheduler.close():
            self.stats.record_failure(request)
            self._deliver(request, None, gone)
        wait = UNLOAD_JOIN_TIMEOUT_S if join_timeout_s is None else join_timeout_s
        deadline = time.monotonic() + wait
        for runner in self.runners:
            if runner.thread.is_alive():
                runner.join(timeout=max(deadline - time.monotonic(), 0.0))
            if runner.thread.is_alive():
                log.warning("instance %s did not finish its batch; answering it", runner.spec.name)
                runner.abandon(gone)
        for runner in self.runners:
            try:
                runner.instance.finalize()
            except Exception as err:  # finalize errors must not stop the others
                log.warning("finalize of %s failed: %s", runner.spec.name, err)
        self.runners.clear()
        release_free_memory()  # its tensors' pages go back to the system, not to the heap

    def probe_ready(self) -> bool | Coroutine[Any, Any, bool]:
        """(On an event loop.) Triton's model readiness beyond the loaded state: every
        instance can serve (a python model's process is alive and its is_ready() says so,
        within READY_TIMEOUT_S). A coroutine only when an instance must be asked."""
        probes = [runner.instance.probe_ready() for runner in list(self.runners)]
        asked = [probe for probe in probes if not isinstance(probe, bool)]
        if False in probes:
            for future in asked:
                future.cancel()
            return False
        return _all_true(asked) if asked else True

    @property
    def pending(self) -> int:
        """Requests waiting in the queue (Triton's pending request count)."""
        return self.scheduler.pending

    def metadata(self, versions: list[int]) -> dict[str, Any]:
        return model_metadata(self.config, self.name, versions)


async def _all_true(futures: list[asyncio.Future[bool]]) -> bool:
    done, pending = await asyncio.wait(futures, timeout=READY_TIMEOUT_S)
    for future in pending:
        future.cancel()
    return not pending and all(future.result() for future in done)


def model_metadata(config: ModelConfig, name: str, versions: list[int]) -> dict[str, Any]:
    """Triton's model metadata: with batching, each shape starts with -1."""
    lead = [-1] if config.max_batch_size > 0 else []

    def tensors(items: Iterable[Any]) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "datatype": config_to_wire(model_config_pb2.DataType.Name(t.data_type)),
                "shape": lead + [int(d) for d in t.dims],
            }
            for t in items
        ]

    return {
        "name": name,
        "versions": [str(v) for v in versions],
        "platform": config.platform or config.backend,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
    }


def instance_specs(
    config: ModelConfig, gpu_capable: bool, max_instances: int = Limits.max_instance_count
) -> list[InstanceSpec]:
    """Expand instance_group the way Triton does: count × GPUs for GPU groups, count for CPU.

    No instance_group, or KIND_AUTO, means the GPUs when the backend can run on one here (torch
    sees CUDA, onnxruntime has its CUDA provider) and the CPU otherwise, as Triton's backends
    choose. The total is capped before anything is created: each instance is a thread or a process.
    """
    gpus = devices.gpu_count()
    model = config.name
    if not config.instance_group:
        group = config.instance_group.add()
        group.kind = KIND.KIND_GPU if gpus and gpu_capable else KIND.KIND_CPU
        group.count = 1
    _check_instance_count(config, gpus, max_instances)
    placements: list[tuple[str, str, str, int]] = []  # (instance name, group, kind, device)
    for gi, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{model}_{gi}"
        if group.count < 1:
            group.count = 1
        if group.kind == KIND.KIND_AUTO:
            group.kind = KIND.KIND_GPU if gpus and gpu_capable else KIND.KIND_CPU
        if group.kind == KIND.KIND_GPU:
            if not gpus:
                raise ValueError(
                    f"instance_group '{group.name}' of model '{model}' has kind KIND_GPU but "
                    "no GPU is available; use KIND_CPU"
                )
            if not group.gpus:
                group.gpus.extend(range(gpus))
            bad = [g for g in group.gpus if g >= gpus]
            if bad:
                raise ValueError(
                    f"instance_group '{group.name}' of model '{model}' lists GPU(s) {bad} "
                    f"but only {gpus} GPU(s) exist"
                )
            devices_of_group = [(int(g), "GPU") for g in group.gpus]
        else:
            devices_of_group = [(0, "MODEL" if group.kind == KIND.KIND_MODEL else "CPU")]
        n = 0
        for device, kind in devices_of_group:
            for _ in range(group.count):
                placements.append((f"{group.name}_{n}", group.name, kind, device))
                n += 1
    threads = _thread_budget(config, sum(1 for p in placements if p[2] != "GPU"))
    return [
        InstanceSpec(
            name=name,
            group=group_name,
            kind=kind,
            device_id=device,
            index=i,
            count=len(placements),
            cpu_threads=threads,
        )
        for i, (name, group_name, kind, device) in enumerate(placements)
    ]


def _check_instance_count(config: ModelConfig, gpus: int, max_instances: int) -> None:
    total = 0
    for group in config.instance_group:
        on_gpu = group.kind == KIND.KIND_GPU or (group.kind == KIND.KIND_AUTO and gpus)
        total += max(group.count, 1) * (max(len(group.gpus) or gpus, 1) if on_gpu else 1)
    if total > max_instances:
        raise ValueError(
            f"model '{config.name}' asks for {total} instances (instance_group counts x GPUs), "
            f"more than --max-instance-count {max_instances}"
        )


def _thread_budget(config: ModelConfig, cpu_instances: int) -> int:
    """Split the CPUs between CPU instances unless the config sets a thread count."""
    for key in _THREAD_PARAMS:
        if key in config.parameters:
            value = config.parameters[key].string_value
            if value.isascii() and value.isdigit() and int(value) > 0:
                return int(value)
            raise ValueError(
                f"parameter '{key}' of model '{config.name}' must be a positive integer, "
                f"got '{value}'"
            )
    return max(1, devices.cpu_count() // max(cpu_instances, 1))


class _OrderedDelivery:
    """preserve_ordering: hold responses that finish early until their predecessors finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_seq = 0
        self._send_seq = 0
        self._seq: dict[int, int] = {}
        self._ready: dict[int, tuple[InferRequest, Outputs | None, Exception | None]] = {}

    def register(self, request: InferRequest) -> None:
        with self._lock:
            self._seq[id(request)] = self._next_seq
            self._next_seq += 1

    def done(self, request: InferRequest, outputs: Outputs | None,
             error: Exception | None) -> None:  # fmt: skip
        with self._lock:
            seq = self._seq.pop(id(request), None)
            if seq is None:  # answered already; a second answer would break the sequence
                return
            self._ready[seq] = (request, outputs, error)
            out = []
            while self._send_seq in self._ready:
                out.append(self._ready.pop(self._send_seq))
                self._send_seq += 1
        for req, outs, err in out:
            try:
                req.on_done(outs, err)
            except Exception:  # noqa: BLE001 - see _answer_failed
                _answer_failed(req)


def _answer_failed(request: InferRequest) -> None:
    """A request's answer could not be handed to its protocol (its loop closed at shutdown, or
    a bug there). Logged, and the caller -- a model thread with the rest of a batch to answer,
    or the ordered queue with later responses -- goes on: one lost answer must not lose more."""
    log.exception("model '%s': handing the answer of request '%s' to its client failed",
                  request.model_name, request.id)  # fmt: skip
