"""perf_analyzer's `--shared-memory system`: the requests' tensors in POSIX shared memory the
server maps, so a request carries only region names (Triton's system shared-memory extension).

Each distinct request's inputs are written once into a region of their own; every output goes to
one region per output of `--output-shared-memory-size` bytes, shared by all requests (the load
generator reads no outputs, as it reads none over the wire either, so requests in flight writing
the same bytes change nothing it measures). The regions are registered with the server before the
load and unregistered and unlinked when the load generator moves on or closes: the server only
ever maps what this process made. For the worker on this host, or a server that shares /dev/shm.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from analyzer.datatypes import tensor_to_bytes
from analyzer.loadgen.control import ControlClient, ServerError

DEFAULT_OUTPUT_SIZE = 102400  # perf_analyzer's --output-shared-memory-size


@dataclass(frozen=True)
class Placed:
    """Where a tensor lies: a registered region, the offset in it and the byte size."""

    region: str
    offset: int
    size: int

    def parameters(self) -> dict[str, Any]:
        return {"shared_memory_region": self.region, "shared_memory_byte_size": self.size,
                "shared_memory_offset": self.offset}  # fmt: skip


class SharedTensors:
    """The regions of one model's requests: made, filled and registered at construction, through
    `control`, which this object owns from then on (closed with it)."""

    def __init__(self, control: ControlClient, requests: list[dict[str, np.ndarray]],
                 datatypes: dict[str, str], outputs: tuple[str, ...],
                 output_size: int = DEFAULT_OUTPUT_SIZE) -> None:  # fmt: skip
        self.control = control
        self.prefix = f"model_analyzer_{secrets.token_hex(6)}"
        self.made: list[tuple[str, shared_memory.SharedMemory]] = []
        self.inputs: list[dict[str, Placed]] = []
        self.outputs: dict[str, Placed] = {}
        try:
            for index, tensors in enumerate(requests):
                blobs = {n: bytes(tensor_to_bytes(a, datatypes[n])) for n, a in tensors.items()}
                name = f"{self.prefix}_in{index}"
                memory = self._region(name, sum(len(b) for b in blobs.values()))
                placed, offset = {}, 0
                for tensor, blob in blobs.items():
                    memory.buf[offset : offset + len(blob)] = blob
                    placed[tensor] = Placed(name, offset, len(blob))
                    offset += len(blob)
                self.inputs.append(placed)
            if outputs:
                name = f"{self.prefix}_out"
                self._region(name, output_size * len(outputs))
                self.outputs = {o: Placed(name, i * output_size, output_size)
                                for i, o in enumerate(outputs)}  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _region(self, name: str, size: int) -> shared_memory.SharedMemory:
        memory = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
        self.made.append((name, memory))
        self.control.register_system_shm(name, f"/{name}", max(size, 1))
        return memory

    def close(self) -> None:
        """Unregister every region from the server and remove it (the server keeps none)."""
        for name, memory in self.made:
            try:
                self.control.unregister_system_shm(name)
            except ServerError:
                pass  # the server went away: its mappings went with it
            memory.close()
            try:
                memory.unlink()
            except FileNotFoundError:
                pass
        self.made.clear()
        self.control.close()
