"""Child process hosting one TorchScript instance, for instances that must not share the GIL.

    python -m analyzer.worker.backends.tensor_stub FD WORKER_PID

The worker's runner thread writes a whole batch (each input already concatenated) into a
shared-memory arena and sends a small pickled message over the socketpair FD; this process runs
the model on views of those bytes and writes every output into its own arena, whose layout the
reply carries. Tensors are never pickled; arena files are nameless and travel as fds, as in
`python_stub`. This process's GIL is the model's alone, so the worker's event loop and the
instance's Python steps around each CUDA call never wait on each other.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.worker.backends.python_stub import (
    ShmArena,
    die_with_worker,
    recv_fd,
    send_fd,
)

# (name, dtype string, shape, byte offset) of one tensor in an arena
Layout = tuple[str, str, tuple[int, ...], int]


def _align(n: int) -> int:
    return (n + 63) & ~63


def place(
    arena: ShmArena, tensors: list[tuple[str, list[np.ndarray]]]
) -> tuple[list[Layout], int | None]:
    """Write each named tensor -- the concatenation of its parts along axis 0 -- into `arena`,
    back to back and 64-byte aligned, in one copy. Returns the layout and the fd of a new arena
    file if it had to grow (to be sent to the peer, then closed)."""
    shapes = []
    total = 0
    for name, parts in tensors:
        first = parts[0]
        if first.dtype.hasobject:
            raise TypeError(f"tensor '{name}' holds Python objects; it cannot travel as bytes")
        shape = first.shape
        if len(parts) > 1:
            shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
        shapes.append(shape)
        total += _align(int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize)
    fd = arena.ensure(max(total, 1))
    layout: list[Layout] = []
    offset = 0
    for (name, parts), shape in zip(tensors, shapes, strict=True):
        dtype = parts[0].dtype
        target: np.ndarray = np.ndarray(shape, dtype, buffer=arena.map, offset=offset)
        if len(parts) == 1:
            target[...] = parts[0]
        else:
            np.concatenate(parts, axis=0, out=target)
        layout.append((name, dtype.str, tuple(int(d) for d in shape), offset))
        offset += _align(target.nbytes)
    return layout, fd


def view(arena: ShmArena, entry: Layout) -> np.ndarray:
    """The tensor `entry` describes, as a view of the arena (no copy)."""
    _, dtype, shape, offset = entry
    return np.ndarray(tuple(shape), np.dtype(dtype), buffer=arena.map, offset=offset)


class TensorStub:
    def __init__(self, conn: Connection, sock: socket.socket):
        self.conn = conn
        self.sock = sock
        self.instance: Any = None
        self.inputs = ShmArena()  # written by the worker, mapped here from the fd it sends
        self.outputs = ShmArena()  # written here, mapped by the worker

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
                if message.get("fd"):
                    message["fd"] = recv_fd(self.sock)
            except EOFError:
                break
            op = message["op"]
            fd = None
            try:
                reply = getattr(self, f"op_{op}")(message)
                fd = reply.pop("fd", None)
                reply["fd"] = fd is not None
            except Exception as err:
                reply = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            self.conn.send(reply)
            send_fd(self.sock, fd)
            if op == "finalize":
                break
        self.inputs.close()
        self.outputs.close()

    def op_initialize(self, message: dict) -> dict:
        from analyzer.config.model_config import ModelConfig
        from analyzer.repository.repository import ModelSource
        from analyzer.worker.backends.base import InstanceSpec
        from analyzer.worker.backends.torchscript import TorchScriptInstance

        config = ModelConfig.FromString(message["config"])
        source = ModelSource(name=message["name"], path=Path(message["path"]), config=config,
                             backend="pytorch", versions=[message["version"]])  # fmt: skip
        try:
            self.instance = TorchScriptInstance(source, message["model_file"],
                                                InstanceSpec(**message["spec"]))  # fmt: skip
        except ValueError as err:  # the load's own sentence, without a type name before it
            return {"error": str(err)}
        self.instance.thread_init()
        return {"ok": True, "pid": os.getpid()}

    def op_execute(self, message: dict) -> dict:
        if message.get("fd"):
            self.inputs.adopt(message["fd"], message["shm_size"])
        elif message["shm_size"] != self.inputs.size:
            raise RuntimeError("the worker's input arena is not the one mapped here")
        if message["outputs_size"] != self.outputs.size:  # the worker lost our last file
            self.outputs.close()
        inputs = {entry[0]: view(self.inputs, entry) for entry in message["inputs"]}
        outputs = self.instance.infer(inputs)
        layout, fd = place(self.outputs, [(name, [array]) for name, array in outputs.items()])
        return {"shm_size": self.outputs.size, "outputs": layout, "fd": fd}

    def op_finalize(self, message: dict) -> dict:
        self.instance = None
        return {"ok": True}


def main() -> None:
    fd, worker_pid = int(sys.argv[1]), int(sys.argv[2])
    die_with_worker(worker_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when instances stop
    sock = socket.socket(fileno=fd)
    conn = Connection(os.dup(fd))
    sys.stdout = sys.stderr
    TensorStub(conn, sock).serve()


if __name__ == "__main__":
    main()
