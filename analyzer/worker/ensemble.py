"""An ensemble (`platform: "ensemble"`): its steps run on the composing models, as Triton's do.

A step starts as soon as every tensor its `input_map` names exists (an ensemble input, or
another step's output), not in list order, so independent steps run side by side. Tensors pass
from step to step as the same numpy arrays (no copy). Each step is an ordinary request to its
composing model, found when the step starts (`model_version` -1: the latest loaded version), so
the composing model's own dynamic batcher, instances and statistics apply, and a composing model
reloaded with a new config (a profile's variant) serves the ensemble's next request.

The first step to fail answers the request with that model's message; steps still running are
left to finish and their results dropped. Statistics follow Triton: the ensemble counts one
execution per request, and its queue and compute durations are the sums over its steps, so
perf_analyzer's "Composing models" breakdown adds up.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer.config.model_config import ModelConfig
from analyzer.datatypes import config_to_wire, numpy_to_wire
from analyzer.repository.repository import ModelSource, composing_models

__all__ = ["EnsembleVersion", "check_graph", "composing_models"]
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import InferRequest, Outputs
from analyzer.worker.stats import ModelStats
from analyzer.worker.validate import RequestValidator, model_type_name

if TYPE_CHECKING:
    from analyzer.worker.limits import HeldBytes
    from analyzer.worker.manager import ModelManager
    from analyzer.worker.model import ModelVersion

PLATFORM = "ensemble"


@dataclass(frozen=True)
class Step:
    """One step, resolved at load: what it reads and where its outputs go."""

    index: int
    model: str
    version: str  # "" = the latest loaded version
    inputs: tuple[tuple[str, str], ...]  # (composing model's input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (composing model's output, ensemble tensor)
    needs: frozenset[str]  # the ensemble tensors it waits for


class EnsembleVersion:
    """Serves one version of an ensemble; the same surface as `ModelVersion` for the protocols."""

    def __init__(self, source: ModelSource, version: int, manager: ModelManager):
        self.source = source
        self.name = source.name
        self.version = version
        self.config: ModelConfig = source.config
        self.manager = manager
        self.stats = ModelStats(self.name, version)
        self.validator = RequestValidator(self.config)
        self.steps: tuple[Step, ...] = ()
        self.outputs = [o.name for o in self.config.output]
        self._lock = threading.Lock()
        self._running = 0
        self._closed = False

    @property
    def held(self) -> HeldBytes:
        """The worker's --max-queued-size count, which an ensemble's requests share."""
        return self.manager.held

    @property
    def pending(self) -> int:
        """Requests in flight (an ensemble has no queue of its own)."""
        return self._running

    def load(self) -> None:
        """Check the graph against the composing models, which the manager has loaded."""
        self.steps = check_graph(self.config, self.manager)

    def submit(self, request: InferRequest, checked: bool = False) -> None:
        if not checked:
            self.validator.check(request)
        with self._lock:
            if self._closed:
                raise InferError(f"model '{self.name}' was unloaded", Status.UNAVAILABLE)
        self.manager.held.admit(request)  # its steps' requests are counted too, in their models
        with self._lock:
            self._running += 1
        _Run(self, request).advance(None)

    def finished(self, request: InferRequest, outputs: Outputs | None, error: Exception | None,
                 sums: list[int]) -> None:  # fmt: skip
        """One request's answer, counted as Triton counts an ensemble's request."""
        if error is None:
            self.stats.record_request(request, *sums)
        else:
            self.stats.record_failure(request)
        with self._lock:
            self._running -= 1
        self.manager.held.release(request)
        request.on_done(outputs, error)

    def unload(self) -> None:
        """New requests are refused; those in flight finish on the composing models."""
        with self._lock:
            self._closed = True

    def probe_ready(self) -> bool:
        """An ensemble has no instances of its own: READY is ready (Triton's)."""
        return True

    def metadata(self, versions: list[int]) -> dict[str, Any]:
        from analyzer.worker.model import model_metadata

        return model_metadata(self.config, self.name, versions)


class _Run:
    """One ensemble request on its way through the steps. `advance` runs on whichever thread
    finished a step (an instance runner's, or the protocol's loop for the first steps)."""

    __slots__ = ("ensemble", "request", "tensors", "types", "waiting", "running", "done",
                 "lock", "sums")  # fmt: skip

    def __init__(self, ensemble: EnsembleVersion, request: InferRequest):
        self.ensemble = ensemble
        self.request = request
        self.tensors: dict[str, np.ndarray] = dict(request.inputs)
        self.types: dict[str, str] = dict(request.wire_types)
        self.waiting = list(ensemble.steps)
        self.running = 0
        self.done = False
        self.lock = threading.Lock()
        self.sums = [0, 0, 0, 0]  # queue, compute input, infer, output (ns) over the steps

    def advance(self, finished: tuple[Step, InferRequest, Outputs | None, Exception | None] | None
                ) -> None:  # fmt: skip
        """Take a finished step's outputs (if any), then start every step now ready; answer the
        request when nothing is left or a step failed."""
        ready: list[Step] = []
        answer: tuple[Outputs | None, Exception | None] | None = None
        with self.lock:
            if self.done:
                return  # answered already (a step failed): late results are dropped
            if finished is not None:
                step, sent, outputs, error = finished
                self.running -= 1
                if error is None and outputs is not None:
                    error = self._take(step, sent, outputs)
                if error is not None:
                    self.done = True
                    answer = (None, _step_error(step, error))
            if answer is None and self.request.cancelled:
                self.done = True
                answer = (None, InferError("request was cancelled", Status.UNAVAILABLE))
            if answer is None:
                ready = [s for s in self.waiting if s.needs <= self.tensors.keys()]
                for step in ready:
                    self.waiting.remove(step)
                self.running += len(ready)
                if not self.waiting and not self.running:
                    self.done = True
                    answer = (self._outputs(), None)
        if answer is not None:
            self.ensemble.finished(self.request, answer[0], answer[1], self.sums)
            return
        for step in ready:
            self._start(step)

    def _take(self, step: Step, sent: InferRequest, outputs: Outputs) -> Exception | None:
        for produced, tensor in step.outputs:
            array = outputs.get(produced)
            if array is None:
                return InferError(f"model '{step.model}' did not produce output '{produced}'",
                                  Status.INTERNAL)  # fmt: skip
            self.tensors[tensor] = array
            self.types[tensor] = _wire_of(array)
        timing = sent.timing
        if timing is not None:
            self.sums[0] += timing.compute_start_ns - sent.queue_start_ns
            self.sums[1] += timing.compute_input_ns
            self.sums[2] += timing.compute_infer_ns
            self.sums[3] += timing.compute_output_ns
        return None

    def _outputs(self) -> dict[str, np.ndarray]:
        wanted = self.request.requested_outputs or self.ensemble.outputs
        return {name: self.tensors[name] for name in wanted}

    def _start(self, step: Step) -> None:
        now = time.perf_counter_ns()
        request = self.request
        sent = InferRequest(
            model_name=step.model,
            inputs={name: self.tensors[tensor] for name, tensor in step.inputs},
            wire_types={name: self.types[tensor] for name, tensor in step.inputs},
            requested_outputs=[name for name, _ in step.outputs],
            on_done=lambda outputs, error: self.advance((step, sent, outputs, error)),
            id=request.id,
            priority=0,
            timeout_us=request.timeout_us,
            arrival_ns=now,
            queue_start_ns=now,
            correlation_id=request.correlation_id,
            flags=request.flags,
        )  # fmt: skip
        try:
            model = self.ensemble.manager.get(step.model, step.version)
            model.submit(sent)  # validated by the composing model: a shape it refuses fails here
        except InferError as err:
            self.advance((step, sent, None, err))


def _step_error(step: Step, error: Exception) -> InferError:
    if isinstance(error, InferError):
        return error
    return InferError(f"in ensemble step {step.index + 1} ('{step.model}'): {error}",
                      Status.INTERNAL)  # fmt: skip


def _wire_of(array: np.ndarray) -> str:
    return "BYTES" if array.dtype == np.object_ else numpy_to_wire(array.dtype)


def check_graph(config: ModelConfig, manager: ModelManager) -> tuple[Step, ...]:
    """The steps, checked as Triton checks an ensemble at load: every composing model loaded,
    every mapped name a real input or output of it, every tensor written once, every step able
    to run, every ensemble output produced, data types agreeing; ValueError names what is wrong."""
    name = config.name
    where = f"ensemble '{name}'"
    if not config.ensemble_scheduling.step:
        raise ValueError(f"{where}: ensemble_scheduling has no step")
    types = {i.name: config_to_wire(model_type_name(i.data_type)) for i in config.input}
    producers: dict[str, str] = {t: "the ensemble's inputs" for t in types}
    steps = []
    for index, spec in enumerate(config.ensemble_scheduling.step):
        at = f"{where}, step {index + 1}"
        if not spec.model_name:
            raise ValueError(f"{at}: model_name is empty")
        if spec.model_name == name:
            raise ValueError(f"{at}: the ensemble cannot call itself")
        version = "" if spec.model_version < 0 else str(spec.model_version)
        try:
            model = manager.get(spec.model_name, version)
        except InferError as err:
            raise ValueError(f"{at}: composing model '{spec.model_name}' is not available "
                             f"({err.message})") from None  # fmt: skip
        inputs, outputs = _model_tensors(model)
        for key in spec.input_map:
            if key not in inputs:
                raise ValueError(
                    f"{at}: input_map key '{key}' is not an input of model "
                    f"'{spec.model_name}' (it has {', '.join(inputs)})"
                )
        missing = [i.name for i in model.config.input
                   if not i.optional and i.name not in spec.input_map]  # fmt: skip
        if missing:
            raise ValueError(f"{at}: input_map gives no tensor for input(s) "
                             f"{', '.join(missing)} of model '{spec.model_name}'")  # fmt: skip
        for key, tensor in spec.output_map.items():
            if key not in outputs:
                raise ValueError(
                    f"{at}: output_map key '{key}' is not an output of model "
                    f"'{spec.model_name}' (it has {', '.join(outputs)})"
                )
            if tensor in producers:
                raise ValueError(
                    f"{at}: tensor '{tensor}' is already produced by "
                    f"{producers[tensor]} (an ensemble tensor has one producer)"
                )
            producers[tensor] = f"step {index + 1} ('{spec.model_name}')"
            types[tensor] = outputs[key]
        _check_batching(config, model, at)
        steps.append(Step(
            index=index, model=spec.model_name, version=version,
            inputs=tuple(sorted(spec.input_map.items())),
            outputs=tuple(sorted(spec.output_map.items())),
            needs=frozenset(spec.input_map.values()),
        ))  # fmt: skip
    for step in steps:
        inputs, _ = _model_tensors(manager.get(step.model, step.version))
        for key, tensor in step.inputs:
            if tensor not in producers:
                raise ValueError(f"{where}, step {step.index + 1}: input_map value '{tensor}' "
                                 "is neither an ensemble input nor any step's output")  # fmt: skip
            if types[tensor] != inputs[key]:
                raise ValueError(
                    f"{where}, step {step.index + 1}: tensor '{tensor}' is {types[tensor]} but "
                    f"input '{key}' of model '{step.model}' is {inputs[key]}"
                )
    for output in config.output:
        if output.name not in producers or output.name in {i.name for i in config.input}:
            raise ValueError(f"{where}: output '{output.name}' is not produced by any step's "
                             "output_map")  # fmt: skip
        wire = config_to_wire(model_type_name(output.data_type))
        if types[output.name] != wire:
            raise ValueError(f"{where}: output '{output.name}' is {wire} in the ensemble's "
                             f"config but its step produces {types[output.name]}")  # fmt: skip
    _check_order(steps, set(i.name for i in config.input), where)
    return tuple(steps)


def _model_tensors(model: ModelVersion | EnsembleVersion) -> tuple[dict[str, str], dict[str, str]]:
    config = model.config
    return (
        {i.name: config_to_wire(model_type_name(i.data_type)) for i in config.input},
        {o.name: config_to_wire(model_type_name(o.data_type)) for o in config.output},
    )


def _check_batching(config: ModelConfig, model: ModelVersion | EnsembleVersion, at: str) -> None:
    """A batching ensemble hands its whole batch to each step: each model must take it."""
    if config.max_batch_size > 0 and model.config.max_batch_size < config.max_batch_size:
        raise ValueError(
            f"{at}: the ensemble's max_batch_size is {config.max_batch_size} but model "
            f"'{model.name}' takes at most {model.config.max_batch_size} (0: no batching); "
            "lower the ensemble's max_batch_size or raise the model's"
        )


def _check_order(steps: list[Step], inputs: set[str], where: str) -> None:
    """Every step can run: walk the graph as a request would (a cycle leaves steps waiting)."""
    have = set(inputs)
    waiting = list(steps)
    while waiting:
        ready = [s for s in waiting if s.needs <= have]
        if not ready:
            names = ", ".join(f"{s.index + 1} ('{s.model}')" for s in waiting)
            raise ValueError(f"{where}: step(s) {names} can never run: their inputs depend on "
                             "each other in a cycle")  # fmt: skip
        for step in ready:
            waiting.remove(step)
            have.update(tensor for _, tensor in step.outputs)
