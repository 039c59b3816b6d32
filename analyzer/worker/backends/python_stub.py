"""Child process hosting one python-backend model instance (Triton's "stub").

    python -m analyzer.worker.backends.python_stub FD

FD is one end of a socketpair to the worker. Control messages (small pickled dicts) go over it;
tensor bytes never do: inputs arrive in a shared-memory file the worker wrote, outputs leave in
one this process writes (`ShmArena`). The GIL of this process is the model's alone.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import socket
import sys
import traceback
import uuid
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

PB_UTILS_DIR = Path(__file__).resolve().parent / "pb_utils"
if str(PB_UTILS_DIR) not in sys.path:
    sys.path.insert(0, str(PB_UTILS_DIR))

import triton_python_backend_utils as pb_utils  # noqa: E402

from analyzer.datatypes import (  # noqa: E402
    WIRE_TO_NUMPY,
    numpy_to_wire,
    serialize_bytes_tensor,
    tensor_from_bytes,
)

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


class ShmArena:
    """A growable shared-memory file; one writer, read by the other process by name."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.size = 0
        self.map: mmap.mmap | None = None

    def grow(self, size: int) -> None:
        self.close(unlink=self.path is not None)
        directory = SHM_DIR or os.environ.get("TMPDIR", "/tmp")
        self.path = os.path.join(directory, f"model-analyzer-{uuid.uuid4().hex}")
        with open(self.path, "w+b") as f:
            f.truncate(size)
            self.map = mmap.mmap(f.fileno(), size)
        self.size = size

    def attach(self, path: str, size: int) -> None:
        if self.map is not None and path == self.path and size == self.size:
            return
        self.close(unlink=False)
        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), size)
        self.path, self.size = path, size

    def ensure(self, size: int) -> None:
        if size > self.size:
            self.grow(max(size, self.size * 2, 1 << 20))

    def close(self, unlink: bool) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive; the mapping goes with the process
                pass
            self.map = None
        if unlink and self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def write_tensors(arena: ShmArena, arrays: list[tuple[str, np.ndarray]]) -> list[tuple]:
    """Lay tensors out back to back (64-byte aligned); return (name, wire, shape, offset, size)."""
    blobs = []
    for name, array in arrays:
        wire = numpy_to_wire(array.dtype)
        data = (
            serialize_bytes_tensor(array)
            if wire == "BYTES"
            else np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        )
        blobs.append((name, wire, tuple(array.shape), data))
    total = sum(_align(len(b[3])) for b in blobs)
    arena.ensure(max(total, 1))
    layout, offset = [], 0
    for name, wire, shape, data in blobs:
        n = len(data)
        arena.map[offset : offset + n] = data if isinstance(data, bytes) else data.tobytes()
        layout.append((name, wire, shape, offset, n))
        offset += _align(n)
    return layout


def read_tensor(arena: ShmArena, wire: str, shape, offset: int, size: int) -> np.ndarray:
    view = memoryview(arena.map)[offset : offset + size]
    if wire == "BYTES":
        return tensor_from_bytes(view, wire, tuple(shape))
    return np.frombuffer(view, dtype=WIRE_TO_NUMPY[wire]).reshape(shape)


def _align(n: int) -> int:
    return (n + 63) & ~63


def load_model_class(model_file: str):
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise ImportError(f"{model_file} defines no class TritonPythonModel")
    return module.TritonPythonModel


class Stub:
    def __init__(self, conn: Connection):
        self.conn = conn
        self.model = None
        self.inputs = ShmArena()  # written by the worker, attached here by name
        self.outputs = ShmArena()  # written here, attached by the worker

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except EOFError:
                break
            op = message["op"]
            try:
                reply = getattr(self, f"op_{op}")(message)
            except Exception as err:
                reply = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            self.conn.send(reply)
            if op == "finalize":
                break
        self.outputs.close(unlink=True)

    def op_auto_complete(self, message: dict) -> dict:
        cls = load_model_class(message["model_file"])
        config = pb_utils.ModelConfig(json.loads(message["config"]))
        if hasattr(cls, "auto_complete_config"):
            result = cls.auto_complete_config(config)
            config = result if result is not None else config
        return {"config": json.dumps(config.as_dict())}

    def op_initialize(self, message: dict) -> dict:
        cls = load_model_class(message["model_file"])
        self.model = cls()
        if hasattr(self.model, "initialize"):
            self.model.initialize(message["args"])
        return {"ok": True, "pid": os.getpid()}

    def op_execute(self, message: dict) -> dict:
        path, size = message["shm"]
        if path:
            self.inputs.attach(path, size)
        requests = [self._request(r) for r in message["requests"]]
        result = self.model.execute(requests)
        responses = self._responses(requests, result)
        outputs, errors = [], []
        for response in responses:
            if response is None or response.has_error():
                err = response.error() if response is not None else None
                errors.append(err.message() if err else "the model sent no response")
                outputs.append(None)
            else:
                errors.append(None)
                outputs.append([(t.name(), t.as_numpy()) for t in response.output_tensors()])
        flat = [t for out in outputs if out for t in out]
        layout = write_tensors(self.outputs, flat)
        per_request, i = [], 0
        for out in outputs:
            n = len(out) if out else 0
            per_request.append(layout[i : i + n])
            i += n
        return {
            "shm": (self.outputs.path, self.outputs.size),
            "outputs": per_request,
            "errors": errors,
        }

    def _request(self, spec: dict):
        inputs = [
            pb_utils.Tensor(name, read_tensor(self.inputs, wire, shape, offset, size))
            for name, wire, shape, offset, size in spec["inputs"]
        ]
        return pb_utils.InferenceRequest(
            request_id=spec["id"],
            correlation_id=spec["correlation_id"],
            inputs=inputs,
            requested_output_names=spec["requested"],
            flags=spec["flags"],
            timeout=spec["timeout"],
            parameters=spec["parameters"],
        )

    @staticmethod
    def _responses(requests, result) -> list:
        if result is None:  # the model answered through response senders
            out = []
            for request in requests:
                sender = request._sender
                out.append(sender.responses[0] if sender and len(sender.responses) == 1 else None)
            return out
        result = list(result)
        if len(result) != len(requests):
            raise pb_utils.TritonModelException(
                f"execute() returned {len(result)} responses for {len(requests)} requests"
            )
        return result

    def op_finalize(self, message: dict) -> dict:
        if self.model is not None and hasattr(self.model, "finalize"):
            self.model.finalize()
        return {"ok": True}


def main() -> None:
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    conn = Connection(sock.detach())
    # Model output printed with print() must not corrupt anything: stdout goes to stderr.
    sys.stdout = sys.stderr
    Stub(conn).serve()


if __name__ == "__main__":
    main()
