"""Triton's system shared-memory extension: regions a client registers by POSIX shm key, then
names in its infer requests instead of sending the tensors (inputs read from the region, outputs
written into it).

A client controls which shm objects the worker maps, so: a key is one name under /dev/shm (no
path), opened without O_CREAT (the client made it) and never the worker's own (the python
backend's arenas are unnamed memfds/O_TMPFILE files, so they cannot be named); the region must lie
inside the object; at most MAX_REGIONS are registered; inputs are copied out of the region, so a
region unregistered while a request is queued changes nothing the model sees, and one input's copy
is capped as a request body is (--http-max-input-size). The client may also shrink its object after
registering it: a region is therefore read and written through the object's descriptor
(pread/pwrite), never through a mapping, whose pages past the object's new end would kill the
worker with SIGBUS. CUDA shared memory needs a GPU build of the worker: its status is empty and its
register says so.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from stat import S_ISREG
from typing import Any

from analyzer.worker.errors import InferError, Status
from analyzer.worker.params import show_value

SHM_DIR = "/dev/shm"
CUDA_UNAVAILABLE = ("CUDA shared memory is not available: this worker has no CUDA support; use "
                    "system shared memory")
MAX_REGIONS = 256
MAX_NAME = 256


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int  # the object's descriptor, kept open while the region is registered

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip


def _cut(name: str) -> str:
    """A region name the client gave, for a message: the registered ones are MAX_NAME long at
    most, one an infer request or a status names is not."""
    return name if len(name) <= 64 else name[:64] + "..."


def _natural(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferError(f"{what} must be a non-negative integer, got {show_value(value)}")
    return value


class SharedMemoryRegistry:
    def __init__(self, directory: str = SHM_DIR, max_read_bytes: int = 64 << 20) -> None:
        self.directory = directory
        self.max_read_bytes = max_read_bytes  # one input's copy: the worker's input size cap
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        if not name or len(name) > MAX_NAME:
            raise InferError(f"shared memory region name must be 1 to {MAX_NAME} characters")
        if not isinstance(key, str):
            raise InferError(f"shared memory 'key' must be a string, got {show_value(key)}")
        offset = _natural(offset, "shared memory 'offset'")
        byte_size = _natural(byte_size, "shared memory 'byte_size'")
        shown = show_value(key)  # the client's: cut, and escaped as JSON
        base = key[1:] if key.startswith("/") else key
        if not base or "/" in base or base in (".", "..") or "\0" in base:
            raise InferError(f"shared memory key {shown} must name one object under {SHM_DIR}")
        try:  # JSON may carry a lone surrogate, which no file name holds (UnicodeEncodeError)
            path = os.fsencode(os.path.join(self.directory, base))
        except UnicodeEncodeError:
            raise InferError(f"shared memory key {shown} is not valid UTF-8 text") from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as err:
            raise InferError(f"Unable to open shared memory region: {shown} "
                             f"({err.strerror})") from None  # fmt: skip
        try:
            stat = os.fstat(fd)
            if not S_ISREG(stat.st_mode):
                raise InferError(f"shared memory key {shown} does not name a shared memory "
                                 "object")  # fmt: skip
            if byte_size == 0 or offset + byte_size > stat.st_size:
                raise InferError(f"shared memory region '{name}': offset {offset} + "
                                 f"byte_size {byte_size} does not fit in {shown} of "
                                 f"{stat.st_size} bytes")  # fmt: skip
            with self._lock:
                if name in self._regions:
                    raise InferError(f"shared memory region '{name}' already in manager",
                                     Status.ALREADY_EXISTS)  # fmt: skip
                if len(self._regions) >= MAX_REGIONS:
                    raise InferError(f"too many shared memory regions registered (at most "
                                     f"{MAX_REGIONS}); unregister some first")  # fmt: skip
                self._regions[name] = Region(name, key, offset, byte_size, fd)
        except BaseException:
            os.close(fd)
            raise

    def unregister(self, name: str = "") -> None:
        """One region, or every region when `name` is empty (Triton's)."""
        with self._lock:
            names = [name] if name else list(self._regions)
            gone = [self._regions.pop(n) for n in names if n in self._regions]
        for region in gone:
            os.close(region.fd)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if name and name not in self._regions:
                raise InferError(f"Unable to find system shared memory region: '{_cut(name)}'",
                                 Status.NOT_FOUND)  # fmt: skip
            return [r.status() for n, r in self._regions.items() if not name or n == name]

    def _region(self, name: str, offset: int, size: int) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise InferError(f"Unable to find shared memory region: '{_cut(name)}'")
        if offset + size > region.byte_size:
            raise InferError(f"shared memory region '{name}' holds {region.byte_size} bytes; "
                             f"offset {offset} + {size} bytes do not fit")  # fmt: skip
        return region

    def check(self, name: str, offset: int, size: int) -> None:
        """An output's region, checked before the model runs: it exists and holds the room the
        request gives the output there."""
        with self._lock:
            self._region(name, offset, size)

    def read(self, name: str, offset: int, size: int) -> bytes:
        """A copy of `size` bytes at `offset` in the region (so unregistering cannot pull it
        from under a queued request)."""
        if size > self.max_read_bytes:
            raise InferError(f"an input of {size} bytes in shared memory region '{name}' is over "
                             f"the worker's input limit of {self.max_read_bytes} bytes "
                             "(--http-max-input-size)")  # fmt: skip
        with self._lock:  # (a region's descriptor is closed under the lock only)
            region = self._region(name, offset, size)
            start = region.offset + offset
            data = os.pread(region.fd, size, start)  # short only at the object's end
            if len(data) < size:
                raise self._shrunk(region, start + size)
            return data

    def write(self, name: str, offset: int, data: bytes | memoryview, room: int) -> None:
        """An output into the region; `room` is the byte size the request gave for it."""
        if len(data) > room:
            raise InferError(f"output needs {len(data)} bytes; its shared memory region "
                             f"'{name}' was given {room}")  # fmt: skip
        with self._lock:
            region = self._region(name, offset, len(data))
            start = region.offset + offset
            if os.fstat(region.fd).st_size < start + len(data):
                raise self._shrunk(region, start + len(data))
            view = memoryview(data).cast("B")
            while view:
                written = os.pwrite(region.fd, view, start)
                view, start = view[written:], start + written

    @staticmethod
    def _shrunk(region: Region, end: int) -> InferError:
        size = os.fstat(region.fd).st_size
        return InferError(f"shared memory region '{region.name}': its object '{region.key}' "
                          f"now holds {size} bytes, fewer than the {end} this request needs")

    def close(self) -> None:
        self.unregister()


def region_params(params: dict[str, Any], what: str) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) when an input's or output's parameters name a region."""
    name = params.get("shared_memory_region")
    if name is None:
        return None
    if not isinstance(name, str):
        raise InferError(f"{what}: 'shared_memory_region' must be a string, got "
                         f"{show_value(name)}")  # fmt: skip
    size = _natural(params.get("shared_memory_byte_size"), f"{what}: 'shared_memory_byte_size'")
    offset = _natural(params.get("shared_memory_offset", 0), f"{what}: 'shared_memory_offset'")
    return name, offset, size
