"""The python backend: each instance is a child process running the model's TritonPythonModel.

Python models hold the GIL, so instances live in their own processes (`python_stub`). The runner
thread of an instance writes the batch's input tensors into a shared-memory file, sends a small
control message over a socketpair, and reads the outputs back from the child's shared memory:
tensors are never pickled. Python models receive the requests of a batch as a list, as in Triton.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from analyzer.config.model_config import (
    ConfigError,
    model_config_from_json,
    model_config_to_dict,
)
from analyzer.repository.repository import ModelSource
from analyzer.worker.backends.base import Backend, BackendInstance, InstanceSpec, Result
from analyzer.worker.backends.python_stub import ShmArena, read_tensor, write_tensors
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import BatchTiming, InferRequest

START_TIMEOUT_S = 120


class StubProcess:
    """One child process and its control channel; every call is a request/reply pair."""

    def __init__(self, label: str):
        self.label = label
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "analyzer.worker.backends.python_stub", str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            env=env,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.lock = threading.Lock()

    def call(self, message: dict, timeout: float | None = None) -> dict:
        with self.lock:
            try:
                self.conn.send(message)
                if timeout is not None and not self.conn.poll(timeout):
                    raise InferError(f"{self.label} did not answer within {timeout:.0f} s",
                                     Status.INTERNAL)  # fmt: skip
                reply = self.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                code = self.process.poll()
                raise InferError(
                    f"{self.label} stopped (exit code {code}); see the worker's log",
                    Status.INTERNAL,
                ) from None
        if "error" in reply:
            raise InferError(f"{self.label}: {reply['error']}", Status.INTERNAL)
        return reply

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.call({"op": "finalize"}, timeout=30)
            except InferError:
                pass
        self.conn.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class PythonBackend(Backend):
    name = "python"

    def auto_complete(self, source: ModelSource, version: int) -> None:
        config = source.config
        if config.model_transaction_policy.decoupled:
            raise ValueError(
                f"model '{source.name}': decoupled python models are not supported yet"
            )
        model_file = source.model_file(version)
        if not model_file.exists():
            raise ValueError(
                f"model '{source.name}' version {version}: {model_file} does not exist"
            )
        stub = StubProcess(f"python model '{source.name}' (auto-complete)")
        try:
            reply = stub.call(
                {"op": "auto_complete", "model_file": str(model_file),
                 "config": json.dumps(model_config_to_dict(config))},
                timeout=START_TIMEOUT_S,
            )  # fmt: skip
        except InferError as err:
            raise ValueError(str(err)) from None
        finally:
            stub.stop()
        try:
            completed = model_config_from_json(
                reply["config"], f"auto_complete_config of model '{source.name}'"
            )
        except ConfigError as err:
            raise ValueError(str(err)) from None
        if completed.name != config.name:
            raise ValueError(f"model '{source.name}': auto_complete_config changed the name")
        config.CopyFrom(completed)
        if not config.input or not config.output:
            raise ValueError(
                f"model '{source.name}': the config lists no "
                f"{'inputs' if not config.input else 'outputs'} and auto_complete_config "
                "did not add any"
            )

    def create_instance(
        self, source: ModelSource, version: int, spec: InstanceSpec
    ) -> BackendInstance:
        return PythonInstance(source, version, spec)


class PythonInstance(BackendInstance):
    def __init__(self, source: ModelSource, version: int, spec: InstanceSpec):
        self.name = f"python model '{source.name}' instance {spec.name}"
        self.stub = StubProcess(self.name)
        self.inputs = ShmArena()
        self.outputs = ShmArena()
        args = {
            "model_config": json.dumps(model_config_to_dict(source.config)),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(source.path),
            "model_version": str(version),
            "model_name": source.name,
        }
        try:
            reply = self.stub.call(
                {"op": "initialize", "model_file": str(source.model_file(version)), "args": args},
                timeout=START_TIMEOUT_S,
            )
        except InferError as err:
            self.finalize()
            raise ValueError(f"initialize failed: {err}") from None
        self.pid = reply["pid"]

    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        t0 = time.perf_counter_ns()
        arrays = [(name, arr) for r in requests for name, arr in r.inputs.items()]
        layout = write_tensors(self.inputs, arrays)
        specs, i = [], 0
        for r in requests:
            n = len(r.inputs)
            specs.append({
                "id": r.id, "correlation_id": r.correlation_id, "flags": r.flags,
                "timeout": r.timeout_us, "parameters": r.parameters,
                "requested": list(r.requested_outputs or []), "inputs": layout[i : i + n],
            })  # fmt: skip
            i += n
        t1 = time.perf_counter_ns()
        reply = self.stub.call(
            {"op": "execute", "shm": (self.inputs.path, self.inputs.size), "requests": specs}
        )
        t2 = time.perf_counter_ns()
        self.outputs.attach(*reply["shm"])
        results: list[Result] = []
        for outputs, error in zip(reply["outputs"], reply["errors"], strict=True):
            if error is not None:
                results.append(InferError(error, Status.INTERNAL))
                continue
            results.append({
                name: read_tensor(self.outputs, wire, shape, offset, size).copy()
                for name, wire, shape, offset, size in outputs
            })  # fmt: skip
        t3 = time.perf_counter_ns()
        timing.compute_input_ns = t1 - t0
        timing.compute_infer_ns = t2 - t1
        timing.compute_output_ns = t3 - t2
        return results

    def finalize(self) -> None:
        self.stub.stop()
        self.inputs.close(unlink=True)
        self.outputs.close(unlink=False)
