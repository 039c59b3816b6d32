"""A TorchScript instance in a child process of its own (`tensor_stub`), and when to use one.

In the worker's process an instance's Python steps -- concatenating a batch, entering and
leaving the TorchScript call, splitting outputs -- take the GIL from the thread that parses
requests. On a GPU the model's own work is microseconds, so those steps are most of an
execution, and they wait on the event loop while it waits on them (BENCHMARKS.md, "GPU
instances in processes of their own"). Triton runs each instance in C++ without a GIL; the
nearest this worker gets is a process per instance, as the python backend's stubs are: the
batch crosses in shared memory in one copy each way, and only a small message is pickled.

The model config's `parameters { key: "INSTANCE_PROCESS" }` chooses: `auto` (the default) puts
GPU instances in processes and keeps CPU instances on threads, where a process would add its
hand-off to a core the model already shares; `true` or `false` decide for every instance.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from analyzer.config.model_config import ModelConfig
from analyzer.repository.repository import ModelSource
from analyzer.worker.backends.base import BackendInstance, InstanceSpec, Result, split_outputs
from analyzer.worker.backends.python import START_TIMEOUT_S, StubProcess
from analyzer.worker.backends.python_stub import ShmArena, ShmSpaceError
from analyzer.worker.backends.tensor_stub import place, view
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import BatchTiming, InferRequest

PARAMETER = "INSTANCE_PROCESS"
_CHOICES = {"auto": None, "true": True, "false": False}


def instance_process_choice(config: ModelConfig) -> bool | None:
    """The config's INSTANCE_PROCESS: True, False, or None for `auto`; ValueError if it is
    anything else."""
    if PARAMETER not in config.parameters:
        return None
    value = config.parameters[PARAMETER].string_value.strip().lower()
    if value not in _CHOICES:
        raise ValueError(
            f"model '{config.name}': parameters {PARAMETER} must be auto, true or false, "
            f"got {config.parameters[PARAMETER].string_value!r}"
        )
    return _CHOICES[value]


def in_process_of_its_own(config: ModelConfig, spec: InstanceSpec) -> bool:
    choice = instance_process_choice(config)
    return spec.kind == "GPU" if choice is None else choice


class ProcessInstance(BackendInstance):
    """The worker's side: one batch per call, its inputs written straight into shared memory."""

    def __init__(self, source: ModelSource, version: int, path: Path, spec: InstanceSpec):
        self.name = f"pytorch model '{source.name}' instance {spec.name}"
        self.stub = StubProcess(self.name, module="analyzer.worker.backends.tensor_stub")
        self.inputs = ShmArena()
        self.outputs = ShmArena()
        message = {
            "op": "initialize", "config": source.config.SerializeToString(),
            "name": source.name, "path": str(source.path), "version": version,
            "model_file": str(path), "spec": dataclasses.asdict(spec),
        }  # fmt: skip
        try:
            reply = self.stub.call(message, timeout=START_TIMEOUT_S)
        except InferError as err:
            self.finalize()
            raise ValueError(str(err).removeprefix(f"{self.name}: ")) from None
        self.pid = reply["pid"]

    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        t0 = time.perf_counter_ns()
        tensors = [(name, [r.inputs[name] for r in requests]) for name in requests[0].inputs]
        try:
            layout, fd = place(self.inputs, tensors)
        except ShmSpaceError as err:
            raise InferError(f"{self.name}: {err}", Status.UNAVAILABLE) from None
        t1 = time.perf_counter_ns()
        message = {"op": "execute", "shm_size": self.inputs.size,
                   "outputs_size": self.outputs.size, "inputs": layout}  # fmt: skip
        try:
            reply = self.stub.call(message, fd=fd)
        except InferError:
            if fd is not None:  # the child may not hold the new file: reserve a fresh one next time
                self.inputs.close()
            raise
        t2 = time.perf_counter_ns()
        if reply["fd"] is not False:
            try:
                self.outputs.adopt(reply["fd"], reply["shm_size"])
            except OSError as err:
                raise InferError(f"{self.name}: cannot map its outputs: {err}",
                                 Status.INTERNAL) from None  # fmt: skip
        # copied out: the arena is rewritten by the next batch while these are still being sent
        outputs = {entry[0]: view(self.outputs, entry).copy() for entry in reply["outputs"]}
        results = split_outputs(requests, outputs)
        t3 = time.perf_counter_ns()
        timing.compute_input_ns = t1 - t0
        timing.compute_infer_ns = t2 - t1
        timing.compute_output_ns = t3 - t2
        return results

    def finalize(self) -> None:
        self.stub.stop()
        self.inputs.close()
        self.outputs.close()
