"""Child process hosting one python-backend model instance (Triton's "stub").

    python -m analyzer.worker.backends.python_stub FD WORKER_PID

FD is one end of a socketpair to the worker. Control messages (small pickled dicts) go over it;
tensor bytes never do: inputs arrive in a shared-memory file the worker wrote, outputs leave in
one this process writes (`ShmArena`). Those files have no name: their fds travel over the
socketpair (SCM_RIGHTS) when an arena grows, so nothing is left in /dev/shm after any kill.
The GIL of this process is the model's alone; the process dies with the worker.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.util
import inspect
import itertools
import json
import mmap
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

PB_UTILS_DIR = Path(__file__).resolve().parent / "pb_utils"
if str(PB_UTILS_DIR) not in sys.path:
    sys.path.insert(0, str(PB_UTILS_DIR))

if TYPE_CHECKING:  # the same module the models import by its top-level name
    import asyncio
    import concurrent.futures

    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb_utils
else:
    import triton_python_backend_utils as pb_utils

from analyzer.datatypes import (  # noqa: E402
    WIRE_TO_NUMPY,
    numpy_to_wire,
    serialize_bytes_tensor,
    tensor_from_bytes,
)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# a message over the channel to the worker: JSON-like fields (tensors travel in the arenas)
Message = dict[str, Any]
# where a tensor lies in an arena: (name, wire type, shape, offset, size)
Placed = tuple[str, str, tuple[int, ...], int, int]
SHM_DIR_ENV = "MODEL_ANALYZER_SHM_DIR"
_MIN_ARENA = 1 << 20
CANCEL_ASK_S = 5.0  # is_cancelled(): False if the worker has not answered by then
ASK_S = 30.0  # a custom metric's creation or value(): an error if the worker has not answered


class ShmSpaceError(Exception):
    """The shared-memory folder has no room left for a batch's tensors."""


def shm_dir() -> str | None:
    """Where tensors live: $MODEL_ANALYZER_SHM_DIR, else /dev/shm, else None (an anonymous memfd).

    /dev/shm is the default so that Docker's --shm-size caps it, as it caps Triton's python
    backend; the env var points the worker (and its stubs, which inherit it) at another tmpfs.
    """
    return os.environ.get(SHM_DIR_ENV) or ("/dev/shm" if os.path.isdir("/dev/shm") else None)


def reserve(size: int) -> int:
    """A new nameless 0600 file of `size` bytes, every page reserved; returns its fd.

    Nameless (O_TMPFILE, or memfd without a folder) so that no kill, SIGKILL included, can leave
    a file behind or let another user open one; the peer gets the fd over the socketpair.
    posix_fallocate makes a full tmpfs an error here instead of a SIGBUS at the first write.
    """
    directory = shm_dir()
    where = directory or "memfd"
    try:
        fd = _nameless_file(directory)
    except OSError as err:
        raise ShmSpaceError(
            f"cannot create a shared-memory file in {where}: {err.strerror or err}"
        ) from None
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        os.close(fd)
        raise ShmSpaceError(
            f"cannot reserve {size / (1 << 20):.1f} MiB of shared memory in {where} "
            f"({err.strerror or err}); free space there or enlarge it (docker run --shm-size)"
        ) from None
    return fd


def _nameless_file(directory: str | None) -> int:
    if directory is None:
        return os.memfd_create("model-analyzer", os.MFD_CLOEXEC)
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # a file system without O_TMPFILE: the name lives only between these two calls
    path = os.path.join(directory, f"model-analyzer-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    os.unlink(path)
    return fd


class ShmArena:
    """A growable shared mapping: one side reserves and writes it, the other maps the fd sent."""

    def __init__(self) -> None:
        self.size = 0
        self.map: mmap.mmap | None = None

    def ensure(self, size: int) -> int | None:
        """Grow to hold `size` bytes; returns the new file's fd for the peer (caller closes it)."""
        if size <= self.size:
            return None
        new_size = max(size, self.size * 2, _MIN_ARENA)
        fd = reserve(new_size)
        try:
            mapping = mmap.mmap(fd, new_size)
        except OSError:
            os.close(fd)
            raise
        self.close()
        self.map, self.size = mapping, new_size
        return fd

    def adopt(self, fd: int, size: int) -> None:
        """Map the peer's new file; the fd is closed here (the mapping keeps the file)."""
        try:
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.close()
        self.map, self.size = mapping, size

    def mapped(self) -> mmap.mmap:
        """The mapping, which a closed arena has not."""
        if self.map is None:
            raise RuntimeError("the shared-memory arena is closed")
        return self.map

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive; the mapping goes with the process
                pass
            self.map = None
        self.size = 0


def write_tensors(
    arena: ShmArena, arrays: list[tuple[str, np.ndarray]]
) -> tuple[list[Placed], int | None]:
    """Lay tensors out back to back (64-byte aligned).

    Returns (name, wire, shape, offset, size) per tensor, and the fd of a new file if the arena
    had to grow (to be sent to the peer, then closed).
    """
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
    fd = arena.ensure(max(total, 1))
    layout, offset = [], 0
    for name, wire, shape, data in blobs:
        n = len(data)
        arena.mapped()[offset : offset + n] = data if isinstance(data, bytes) else data.tobytes()
        layout.append((name, wire, shape, offset, n))
        offset += _align(n)
    return layout, fd


def send_fd(sock: socket.socket, fd: int | None) -> None:
    """Pass a new arena's fd after a control message that says one follows, then close ours."""
    if fd is None:
        return
    try:
        socket.send_fds(sock, [b"F"], [fd])
    finally:
        os.close(fd)


def recv_fd(sock: socket.socket) -> int:
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        raise EOFError("the peer closed the channel before sending a shared-memory file")
    return fds[0]


def read_tensor(arena: ShmArena, wire: str, shape: Sequence[int], offset: int,
                size: int) -> np.ndarray:  # fmt: skip
    view = memoryview(arena.mapped())[offset : offset + size]
    if wire == "BYTES":
        return tensor_from_bytes(view, wire, tuple(shape))
    return np.frombuffer(view, dtype=WIRE_TO_NUMPY[wire]).reshape(shape)


def _align(n: int) -> int:
    return (n + 63) & ~63


# BLS: a request's (or a reply's) tensors travel inside the control message when they are
# this small, else in a shared-memory file of their own, sent as an fd and mapped by the peer
# (one file per message: replies to several async_exec() calls may be in flight at once).
BLS_INLINE_BYTES = 64 << 10


def pack_tensors(arrays: list[tuple[str, np.ndarray]]) -> tuple[Message, int | None]:
    """Message fields holding `arrays` ('tensors' layout, and 'inline' bytes or an fd to send)."""
    blobs = []
    for name, array in arrays:
        wire = numpy_to_wire(array.dtype)
        data = (serialize_bytes_tensor(array) if wire == "BYTES"
                else np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # fmt: skip
        blobs.append((name, wire, tuple(array.shape), data))
    total = sum(_align(len(b[3])) for b in blobs)
    layout, offset = [], 0
    for name, wire, shape, data in blobs:
        layout.append((name, wire, shape, offset, len(data)))
        offset += _align(len(data))
    if total <= BLS_INLINE_BYTES:
        buffer = bytearray(total)
        for (_, _, _, start, size), (_, _, _, data) in zip(layout, blobs, strict=True):
            buffer[start : start + size] = data if isinstance(data, bytes) else data.tobytes()
        return {"tensors": layout, "inline": bytes(buffer), "size": total}, None
    fd = reserve(total)
    try:
        with mmap.mmap(fd, total) as mapping:
            for (_, _, _, start, size), (_, _, _, data) in zip(layout, blobs, strict=True):
                mapping[start : start + size] = data if isinstance(data, bytes) else data.tobytes()
    except BaseException:
        os.close(fd)
        raise
    return {"tensors": layout, "inline": None, "size": total}, fd


def unpack_tensors(message: Message) -> dict[str, np.ndarray]:
    """The arrays of a message made by `pack_tensors` (its fd, if any, already received and
    closed here): writable views of the inline bytes or of the mapped file, no copy."""
    fd = message.get("fd")
    if message.get("inline") is not None:
        buffer: bytearray | mmap.mmap = bytearray(message["inline"])
    elif isinstance(fd, int) and not isinstance(fd, bool):
        try:
            buffer = mmap.mmap(fd, message["size"])
        finally:
            os.close(fd)
    else:
        return {}
    out = {}
    view = memoryview(buffer)
    for name, wire, shape, offset, size in message["tensors"]:
        out[name] = tensor_from_bytes(view[offset : offset + size], wire, tuple(shape))
    return out


def discard_fd(message: Message) -> None:
    fd = message.get("fd")
    if isinstance(fd, int) and not isinstance(fd, bool):
        os.close(fd)


def load_model_class(model_file: str) -> Any:
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise ImportError(f"{model_file} defines no class TritonPythonModel")
    return module.TritonPythonModel


class BlsClient:
    """The stub's one channel to the worker, read by whichever thread needs a message, and the
    model's BLS calls (`InferenceRequest.exec()` / `async_exec()`) over it.

    The worker runs each BLS call on the named model's own scheduler and answers with a
    `bls_reply` carrying its id; replies may come in any order, and a model may call from any
    thread: from execute(), or from threads it started, between calls too (the bell). So no
    thread owns the channel: one waiting thread at a time reads
    it (the serve loop between calls, a BLS caller during one) and files what it reads, replies
    by id for their callers and the worker's requests for the serve loop; the others wait on a
    condition. The serve loop reads the next execute itself when nothing else waits: no thread
    hop on the hot path."""

    def __init__(self, conn: Connection, sock: socket.socket, send_lock: threading.Lock,
                 bell: socket.socket | None = None) -> None:  # fmt: skip
        self.conn = conn
        self.sock = sock
        self.send_lock = send_lock
        # the worker reads a model's channel while it runs one of its calls (a decoupled
        # model's always); a message sent between calls rings this bell so that the worker
        # reads it then too (non-blocking: a full bell has rung already)
        self.bell = bell
        self.busy = False  # a call of the worker's is in progress (set by the serve loop)
        self.ids = itertools.count(1)
        self.cond = threading.Condition()
        self.reading = False  # a thread is reading the channel (outside the condition's lock)
        self.closed = False  # the worker closed the channel
        self.ops: deque[Message] = deque()  # the worker's requests, for the serve loop
        self.replies: dict[int, Message] = {}  # arrived, not yet taken
        # async_exec() calls waiting: their future and its loop
        self.futures: dict[int, tuple[asyncio.Future[Message], asyncio.AbstractEventLoop]] = {}
        self.abandoned: set[int] = set()  # timed out or cancelled: their late replies are dropped
        self.later: deque[Message] = deque()  # sent with the next message (tell_later)
        self._wake: tuple[int, int] | None = None  # the flusher's pipe (start_flusher)
        self.streams: dict[int, deque[Message]] = {}  # exec(decoupled=True): responses so far
        self.loop: asyncio.AbstractEventLoop | None = None  # watching the channel, when async

    # ---- reading ------------------------------------------------------------------------------
    def wait_until(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ready() holds (it is checked under the condition's lock), reading the
        channel meanwhile when no other thread does. False on timeout; EOFError once the worker
        closed the channel."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while not ready():
                if self.closed:
                    raise EOFError("the worker closed the channel")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self.reading:
                    self.cond.wait(left)
                    continue
                self.reading = True
                self.cond.release()
                try:
                    messages = self._read(left)
                finally:
                    self.cond.acquire()
                    self.reading = False
                self._file(messages)
            return True

    def _read(self, timeout: float | None) -> list[Message] | None:
        """The next message, after waiting up to `timeout` for it (None: as long as it takes,
        with no poll first: the serve loop's read of each execute is one recv); [] on timeout,
        None when the channel closed."""
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return []
            message = self.conn.recv()
            if message.get("fd"):
                message["fd"] = recv_fd(self.sock)
            return [message]
        except (EOFError, OSError):
            return None

    def _file(self, messages: list[Message] | None) -> None:
        """(Under the condition's lock.) Replies to their callers, the rest to the serve loop;
        every waiter is woken to look."""
        if messages is None:
            self.closed = True
        for message in messages or []:
            if message.get("op") == "bls_reply":
                self._take(message)
            else:
                self.ops.append(message)
        self.cond.notify_all()
        if self.closed:
            for future, loop in self.futures.values():
                loop.call_soon_threadsafe(_fail, future, EOFError("the worker closed the channel"))
            self.futures.clear()

    def _take(self, message: Message) -> None:
        number = message["id"]
        if "cancelled" in message or message.get("plain"):  # ask_cancelled(), ask()
            if number in self.abandoned:
                self.abandoned.discard(number)
            else:
                self.replies[number] = message
            return
        try:
            message["arrays"] = unpack_tensors(message)
        except (OSError, ValueError) as err:
            message["error"] = f"the BLS reply's tensors cannot be read: {err}"
        if number in self.abandoned:
            if message.get("final", True):
                self.abandoned.discard(number)
            return
        stream = self.streams.get(number)
        if stream is not None:  # exec(decoupled=True): one message per response
            stream.append(message)
            return
        waiting = self.futures.pop(number, None)
        if waiting is not None:
            future, loop = waiting
            loop.call_soon_threadsafe(_resolve, future, message)
        else:
            self.replies[number] = message

    def next_op(self) -> Message:
        """The worker's next request (execute, finalize, ...), for the serve loop: read at once
        when no other thread reads (the common case: one lock round trip and one recv)."""
        with self.cond:
            if self.ops:
                return self.ops.popleft()
            fast = not self.reading and not self.closed
            if fast:
                self.reading = True
        if fast:
            messages: list[Message] | None = None
            direct = False
            try:
                messages = self._read(None)
            finally:
                with self.cond:
                    self.reading = False
                    direct = bool(messages) and not self.ops and \
                        messages[0].get("op") != "bls_reply"  # type: ignore[index]  # fmt: skip
                    if direct:
                        self.cond.notify_all()  # a waiting caller may read the channel now
                    else:
                        self._file(messages)
            if direct and messages:
                return messages[0]
        self.wait_until(lambda: bool(self.ops), None)
        with self.cond:
            return self.ops.popleft()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Replies to async calls are read by the loop when the channel is readable and no
        other thread reads it (that thread files them for the loop)."""
        if self.loop is not loop:
            loop.add_reader(self.conn.fileno(), self._readable)
            self.loop = loop

    def _readable(self) -> None:
        with self.cond:
            if not self.futures:  # no coroutine waits for a reply: the serve loop reads
                self.stop_watching()
                return
            if self.reading or self.closed:
                return
            self.reading = True
        messages: list[Message] | None = []
        try:
            while messages is not None and self.conn.poll(0):
                more = self._read(0)
                messages = None if more is None else messages + more
        finally:
            with self.cond:
                self.reading = False
                self._file(messages)

    def stop_watching(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self.conn.fileno())
            self.loop = None

    # ---- calls --------------------------------------------------------------------------------
    def ask_cancelled(self, serial: int) -> bool:
        """Whether request `serial` was cancelled by its client (the worker knows while the
        request is open); False if no answer comes in a short while."""
        number = next(self.ids)
        with self.send_lock:
            self.conn.send({"op": "is_cancelled", "id": number, "request": serial, "fd": False})
            self.ring()
        try:
            arrived = self.wait_until(lambda: number in self.replies, CANCEL_ASK_S)
        except EOFError:
            return True  # the worker is gone: so is the client's request
        with self.cond:
            if not arrived:
                self.abandoned.add(number)
                return False
            return bool(self.replies.pop(number).get("cancelled"))

    def ask(self, message: Message, timeout: float | None = ASK_S) -> Message:
        """A question to the worker (a custom metric's creation or value, the model loading
        API), from any thread at any time: its answer, or a TritonModelException when none
        comes within `timeout`."""
        number = next(self.ids)
        with self.send_lock:
            self.send_later()
            self.conn.send({**message, "id": number, "fd": False})
            self.ring()
        try:
            arrived = self.wait_until(lambda: number in self.replies, timeout)
        except EOFError:
            raise pb_utils.TritonModelException("the worker closed the channel") from None
        with self.cond:
            if not arrived:
                self.abandoned.add(number)
                raise pb_utils.TritonModelException(
                    f"the worker did not answer within {timeout or 0:g} s")
            return self.replies.pop(number)

    def tell(self, message: Message) -> None:
        """A message that needs no answer (a metric's update)."""
        with self.send_lock:
            self.send_later()
            self.conn.send({**message, "fd": False})
            self.ring()

    def tell_later(self, message: Message) -> None:
        """A message from a finalizer (a metric's deletion): the garbage collector may run it
        inside a send on this very thread, so it does not take the send lock (which is not
        reentrant). It goes with the next send, or with the flusher thread, woken by one byte
        on a pipe (a system call: no lock of Python's), when no send comes first."""
        self.later.append({**message, "fd": False})
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
            except Exception:  # noqa: BLE001 - full (a wake-up is pending), or shutting down
                pass

    def start_flusher(self) -> None:
        """(Before the model's code runs.) The thread that sends what finalizers left."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wake = (read, write)
        threading.Thread(target=self._flush, name="flusher", daemon=True).start()

    def _flush(self) -> None:
        assert self._wake is not None
        while True:
            try:
                if not os.read(self._wake[0], 4096):
                    return
            except OSError:
                return
            with self.send_lock:
                if self.later:
                    try:
                        self.send_later()
                    except OSError:
                        return
                    self.ring()

    def send_later(self) -> None:
        """(With the send lock held.) What finalizers left to send."""
        while self.later:
            self.conn.send(self.later.popleft())

    def ring(self) -> None:
        """(With the send lock held, after a send.) Between the worker's calls, tell it that
        the channel has something to read."""
        if not self.busy and self.bell is not None:
            try:
                self.bell.send(b"!")
            except OSError:  # full (it has rung), or the worker is gone
                pass

    def send(self, request: pb_utils.InferenceRequest, decoupled: bool = False) -> int:
        number = next(self.ids)
        fields, fd = pack_tensors([(t.name(), t.as_numpy()) for t in request.inputs()])
        with self.send_lock:
            self.conn.send({
                "op": "bls", "id": number, "model": request._model_name,
                "version": request._model_version, "requested": request._requested,
                "request_id": request._id, "correlation_id": request._correlation_id,
                "flags": request._flags, "timeout": request._timeout,
                "parameters": request._parameters, "decoupled": decoupled,
                "fd": fd is not None, **fields,
            })  # fmt: skip
            send_fd(self.sock, fd)
            self.ring()
        return number

    def call(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """exec(): send, then wait for this call's reply (any thread may call)."""
        number = self.send(request)
        try:
            arrived = self.wait_until(lambda: number in self.replies, _seconds(request))
        except EOFError:
            return _closed()
        with self.cond:
            if not arrived:
                self.abandoned.add(number)
                return _timed_out(request)
            return _response(self.replies.pop(number))

    def call_decoupled(self, request: pb_utils.InferenceRequest) -> ResponseIterator:
        """exec(decoupled=True), and async_exec(decoupled=True) as Triton's: an iterator over the
        responses as they come; the last one is the final flag (an empty response when the model
        sent the flag alone)."""
        number = self.send(request, decoupled=True)
        with self.cond:
            self.streams[number] = deque()
        return ResponseIterator(self, number, request)

    def call_async(self, request: pb_utils.InferenceRequest,
                   loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any]:  # fmt: skip
        """async_exec(): sent now; a task on `loop` waits for the future the channel's reader
        resolves (an InferenceResponse), so the call is under way before the model awaits it."""
        future: asyncio.Future[Message] = loop.create_future()
        number = self.send(request)
        with self.cond:
            if number in self.replies:  # filed by another thread before the future existed
                future.set_result(self.replies.pop(number))
            elif self.closed:
                future.set_exception(EOFError("the worker closed the channel"))
            else:
                self.futures[number] = (future, loop)
        self._watch(loop)
        return loop.create_task(self._reply(number, future, request))

    async def _reply(self, number: int, future: asyncio.Future[Message],
                     request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:  # fmt: skip
        import asyncio  # here, not at the top: see Stub.call_loop

        try:
            reply = await asyncio.wait_for(future, _seconds(request))
        except TimeoutError:
            with self.cond:
                self.futures.pop(number, None)
                self.abandoned.add(number)
            return _timed_out(request)
        except EOFError:
            return _closed()
        return _response(reply)


class ResponseIterator:
    """The responses of one decoupled BLS call, as they come (Triton's ResponseIterator);
    `cancel()` stops waiting for more, and the responses still to come are dropped."""

    def __init__(self, client: BlsClient, number: int, request: pb_utils.InferenceRequest) -> None:
        self.client = client
        self.number = number
        self.request = request
        self.done = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        client, number = self.client, self.number
        if self.done:
            raise StopIteration
        stream = client.streams.get(number)
        if stream is None:
            self.done = True
            raise StopIteration
        try:
            arrived = client.wait_until(lambda: bool(stream), _seconds(self.request))
        except EOFError:
            self._end()
            return _closed()
        if not arrived:
            self.cancel()
            return _timed_out(self.request)
        with client.cond:
            message = stream.popleft()
        if message.get("final", True):
            self._end()
        return _response(message)

    def cancel(self) -> None:
        """No more responses are waited for; those still to come are dropped."""
        if not self.done:
            with self.client.cond:
                self.client.abandoned.add(self.number)
            self._end()

    def _end(self) -> None:
        self.done = True
        with self.client.cond:
            self.client.streams.pop(self.number, None)


def _code(error: Any) -> int:
    """A TritonError's code (INTERNAL for anything else a model put there)."""
    code = error.code() if isinstance(error, pb_utils.TritonError) else 1
    return code if isinstance(code, int) and 0 <= code <= 7 else 1


def _closed() -> pb_utils.InferenceResponse:
    return _error_response("the worker closed the channel", pb_utils.TritonError.UNAVAILABLE)


def _resolve(future: asyncio.Future[Message], message: Message) -> None:
    if not future.done():
        future.set_result(message)


def _fail(future: asyncio.Future[Message], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _response(reply: Message) -> pb_utils.InferenceResponse:
    if reply.get("error") is not None:
        return _error_response(reply["error"], reply.get("code", pb_utils.TritonError.INTERNAL))
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(n, a) for n, a in reply["arrays"].items()],
        parameters=reply.get("params"))


def _seconds(request: pb_utils.InferenceRequest) -> float | None:
    """A BLS request's timeout (microseconds in the API), None for none."""
    return request._timeout / 1e6 if request._timeout > 0 else None


def _timed_out(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
    text = f"BLS request to model '{request._model_name}' timed out after {request._timeout} us"
    return _error_response(text, pb_utils.TritonError.UNAVAILABLE)


def _error_response(message: str, code: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class Stub:
    def __init__(self, conn: Connection, sock: socket.socket,
                 bell: socket.socket | None = None) -> None:  # fmt: skip
        self.conn = conn
        self.sock = sock  # the same channel, for passing arena fds
        self.model: Any = None  # the repository's TritonPythonModel, once initialized
        self.inputs = ShmArena()  # written by the worker, mapped here from the fd it sends
        self.outputs = ShmArena()  # written here, mapped by the worker
        # every message out: replies, BLS requests and a decoupled model's responses, which
        # its threads may send while execute() runs or after it returned
        self.send_lock = threading.Lock()
        self.decoupled = False
        self.calling = range(0)  # the serials of the call in progress (not decoupled)
        # a decoupled model's requests (by serial) that have not sent their final flag; they
        # outlive their call: the worker sends the next call once execute() returns
        self.open: set[int] = set()
        self.bls = BlsClient(conn, sock, self.send_lock, bell)
        self.bls.start_flusher()
        self.bell = bell  # also how the worker asks the model's is_ready() (answer_readiness)
        # where a decoupled model's async execute() and an async is_ready() run: one event
        # loop on a thread of its own, made on first use, as Triton's stub has
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        # a model that is not decoupled: its async execute(), run on the serve loop's thread
        # (made on first use: asyncio is imported only by models that use it, since its
        # import was ~0.1 of a stub's ~0.37 s start, which every instance of a load pays)
        self.call_loop: asyncio.AbstractEventLoop | None = None
        self.one_loop = False  # async execute() on the model's loop too: see op_initialize
        pb_utils._bls_client = self.bls

    def serve(self) -> None:
        while True:
            try:
                message = self.bls.next_op()
            except EOFError:
                break
            self.bls.busy = True  # until its reply: the worker reads the channel meanwhile
            op = message["op"]
            fd = None
            try:
                reply = getattr(self, f"op_{op}")(message)
                fd = reply.pop("fd", None)
                reply["fd"] = fd is not None
            except ShmSpaceError as err:
                reply = {"error": str(err), "no_space": True}
            except Exception as err:
                reply = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            with self.send_lock:
                self.bls.send_later()  # metrics deleted during the call: before its reply
                self.bls.busy = False  # what the model sends after the reply rings the bell
                self.conn.send(reply)
                send_fd(self.sock, fd)
            if op == "finalize":
                break
        self.outputs.close()

    def op_auto_complete(self, message: Message) -> Message:
        pb_utils._model_dir = os.path.dirname(message["model_file"])
        cls = load_model_class(message["model_file"])
        config = pb_utils.ModelConfig(json.loads(message["config"]))
        if hasattr(cls, "auto_complete_config"):
            result = cls.auto_complete_config(config)
            config = result if result is not None else config
        return {"config": json.dumps(config.as_dict())}

    def op_initialize(self, message: Message) -> Message:
        pb_utils._model_dir = os.path.dirname(message["model_file"])
        cls = load_model_class(message["model_file"])
        self.model = cls()
        config = json.loads(message["args"]["model_config"])
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        if self.decoupled:  # the worker reads its channel at all times
            self.bls.bell = None
        if hasattr(self.model, "initialize"):
            self.model.initialize(message["args"])
        readiness = callable(getattr(self.model, "is_ready", None)) and self.bell is not None
        # an async is_ready() runs on the model's loop: its async execute() then does too, so
        # that what one makes on the loop (a lock, a client session) the other can use
        self.one_loop = readiness and inspect.iscoroutinefunction(self.model.is_ready)
        if readiness:
            threading.Thread(target=self.answer_readiness, name="is_ready", daemon=True).start()
        return {"ok": True, "pid": os.getpid(), "is_ready": readiness}

    def answer_readiness(self) -> None:
        """The model's is_ready() (sync or async), each time the worker asks on the bell, on a
        thread of its own, as Triton's python backend runs it: while execute() runs too. Its
        answer goes back on the bell; an exception or a value that is not a bool is "not
        ready", written to the model's log."""
        bell = self.bell
        assert bell is not None
        while True:
            try:
                select.select([bell], [], [])
                asked = bell.recv(64)
            except BlockingIOError:
                continue
            except (OSError, ValueError):
                return
            if not asked:  # the worker closed the bell
                return
            ready = False
            try:
                result = self.model.is_ready()
                if inspect.isawaitable(result):  # on the model's loop, as Triton runs it
                    import asyncio  # see call_loop

                    result = asyncio.run_coroutine_threadsafe(
                        result, self.async_loop()).result()  # type: ignore[arg-type]
                if not isinstance(result, bool):
                    raise TypeError(f"is_ready() must return a boolean value, not "
                                    f"{type(result).__name__}")  # fmt: skip
                ready = result
            except Exception:  # noqa: BLE001 - the model's fault: not ready, and why in its log
                print(f"is_ready() failed; the model reads as not ready:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, flush=True)  # fmt: skip
            try:
                bell.send(b"1" if ready else b"0")
            except OSError:
                return

    def op_execute(self, message: Message) -> Message:
        if message.get("fd"):
            self.inputs.adopt(message["fd"], message["shm_size"])
        elif message["shm_size"] != self.inputs.size:
            raise RuntimeError("the worker's input arena is not the one mapped here")
        if message["outputs_size"] != self.outputs.size:  # the worker lost our last file
            self.outputs.close()
        specs = message["requests"]
        requests = [self._request(r) for r in specs]
        for spec, request in zip(specs, requests, strict=True):
            request._ask_cancelled = lambda n=spec["serial"]: self._is_cancelled(n)
        if self.decoupled:
            return self._execute_decoupled(requests, [spec["serial"] for spec in specs])
        if specs:
            self.calling = range(specs[0]["serial"], specs[-1]["serial"] + 1)
        try:
            return self._execute(requests)
        finally:
            self.calling = range(0)

    def _is_cancelled(self, serial: int) -> bool:
        """request.is_cancelled(): the worker knows, while the request is open. A request of a
        model that is not decoupled is open during its call only: asked later, it was answered
        already, so not cancelled (the worker would not read the question until the next call)."""
        if not self.decoupled and serial not in self.calling:
            return False
        return self.bls.ask_cancelled(serial)

    def async_loop(self) -> asyncio.AbstractEventLoop:
        """The model's event loop, running on its own thread from the first coroutine on."""
        with self._loop_lock:
            if self._loop is None:
                import asyncio  # see call_loop

                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="asyncio", daemon=True).start()
                self._loop = loop
            return self._loop

    def _keep_running(self, loop: asyncio.AbstractEventLoop) -> None:
        """The call left tasks on its loop (a model's asyncio.create_task()): they stalled
        between calls, where Triton's loop runs for ever. The loop becomes the model's loop,
        run on a thread of its own, and the model's async execute() runs there from now on."""
        with self._loop_lock:
            if self._loop is not None:  # cannot happen: a model with one never uses call_loop
                return
            self._loop, self.call_loop, self.one_loop = loop, None, True
        threading.Thread(target=loop.run_forever, name="asyncio", daemon=True).start()

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> Message:
        result = self.model.execute(requests)
        if self.one_loop and inspect.iscoroutine(result):  # on the model's loop, and waited for
            import asyncio  # see call_loop

            result = asyncio.run_coroutine_threadsafe(result, self.async_loop()).result()
        elif inspect.isawaitable(result):  # async def execute (BLS with async_exec)
            # waited for here, on a loop of this thread's: Triton runs it on the model's loop
            # thread and waits, which costs a thread hop each way (~42 against ~9 us a call);
            # a model with an async is_ready() pays it (one_loop)
            import asyncio  # see call_loop

            try:
                if self.call_loop is None:
                    self.call_loop = asyncio.new_event_loop()
                result = self.call_loop.run_until_complete(result)
            finally:
                self.bls.stop_watching()
            if asyncio.all_tasks(self.call_loop):
                self._keep_running(self.call_loop)
        responses = self._responses(requests, result)
        outputs: list[list[tuple[str, np.ndarray]] | None] = []
        errors: list[str | None] = []
        codes: list[int] = []  # each error's TritonError code: the client's status
        params: list[dict[str, Any] | None] = []  # each response's parameters, if any
        rescheduled = _rescheduled(requests)
        for index, (request, response) in enumerate(zip(requests, responses, strict=False)):
            if index in rescheduled:  # back to the batcher: no response (Triton's)
                errors.append(None)
                codes.append(1)
                outputs.append(None)
                params.append(None)
            elif response is None or response.has_error():
                err = response.error() if response is not None else None
                errors.append(err.message() if err else "the model sent no response")
                codes.append(_code(err))
                outputs.append(None)
                params.append(None)
            else:
                errors.append(None)
                codes.append(1)
                outputs.append(_requested(request, response))
                params.append(response._parameters or None)
        flat = [t for out in outputs if out for t in out]
        layout, fd = write_tensors(self.outputs, flat)
        per_request, i = [], 0
        for out in outputs:
            n = len(out) if out else 0
            per_request.append(layout[i : i + n])
            i += n
        reply: Message = {"shm_size": self.outputs.size, "outputs": per_request,
                          "errors": errors, "codes": codes, "fd": fd}  # fmt: skip
        if any(params):
            reply["params"] = params
        if rescheduled:
            reply["rescheduled"] = sorted(rescheduled)
        return reply

    def _execute_decoupled(self, requests: list[pb_utils.InferenceRequest],
                           serials: list[int]) -> Message:  # fmt: skip
        """A decoupled model answers through its requests' senders, each response sent to the
        worker as it comes, from any thread, during execute() or after it returned: the worker
        sends the next call meanwhile, as Triton does."""
        with self.send_lock:
            self.open.update(serials)
        for serial, request in zip(serials, requests, strict=True):
            request._emit = (lambda response, final, n=serial, r=request:
                             self._emit(n, response, final, r))  # fmt: skip
        result = self.model.execute(requests)
        if inspect.iscoroutine(result):  # runs on the model's loop; the next call may start
            import asyncio  # see call_loop

            future = asyncio.run_coroutine_threadsafe(result, self.async_loop())
            future.add_done_callback(lambda done: self._async_done(done, serials))
            result = None
        if result is not None:
            raise pb_utils.TritonModelException(_DECOUPLED_RETURNS_NONE)
        reply: Message = {"decoupled": True}
        rescheduled = _rescheduled(requests)
        if rescheduled:
            with self.send_lock:  # the next execution of each is a request of its own here
                rescheduled = {i for i in rescheduled if serials[i] in self.open}
                self.open.difference_update(serials[i] for i in rescheduled)
            reply["rescheduled"] = sorted(rescheduled)
        return reply

    def _async_done(self, done: concurrent.futures.Future[Any], serials: list[int]) -> None:
        """A decoupled model's async execute() ended. If it raised (or returned something),
        its traceback goes to the log, as Triton's; its requests still open are answered with
        that error here, so that no client waits for ever."""
        import concurrent.futures  # loaded already: asyncio, which ran this, imports it

        try:
            error = done.exception()
        except concurrent.futures.CancelledError:
            error = RuntimeError("the model's event loop stopped")
        if error is None and done.result() is not None:
            error = pb_utils.TritonModelException(_DECOUPLED_RETURNS_NONE)
        if error is None:
            return
        print("".join(traceback.format_exception(error)), file=sys.stderr, flush=True)
        with self.send_lock:
            still = [serial for serial in serials if serial in self.open]
            self.open.difference_update(still)
            for serial in still:
                try:
                    self.conn.send({"op": "response", "request": serial, "final": True,
                                    "error": f"{type(error).__name__}: {error}", "code": 1,
                                    "empty": False, "fd": False})  # fmt: skip
                except OSError:
                    return

    def _emit(self, serial: int, response: pb_utils.InferenceResponse | None, final: bool,
              request: pb_utils.InferenceRequest) -> None:
        """One response of request `serial`, sent now (any thread)."""
        fields: Message = {}
        fd = None
        error = None
        code = 1
        if response is not None:
            if response.has_error():
                err = response.error()
                error = err.message() if err is not None else "error"
                code = _code(err)
            else:
                fields, fd = pack_tensors(_requested(request, response))
                if response._parameters:
                    fields["params"] = response._parameters
        message = {"op": "response", "request": serial, "final": final, "error": error,
                   "code": code, "empty": response is None, "fd": fd is not None,
                   **fields}  # fmt: skip
        with self.send_lock:
            if serial not in self.open:
                if fd is not None:
                    os.close(fd)
                raise pb_utils.TritonModelException("this request was already completed")
            if final:
                self.open.discard(serial)
            self.conn.send(message)
            send_fd(self.sock, fd)

    def _request(self, spec: Message) -> pb_utils.InferenceRequest:
        # a decoupled model's request outlives its call, and the next call's inputs overwrite
        # the arena: its tensors are copies
        inputs = [
            pb_utils.Tensor(name, _owned(read_tensor(self.inputs, wire, shape, offset, size),
                                         self.decoupled))  # fmt: skip
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
    def _responses(requests: list[pb_utils.InferenceRequest],
                   result: Any) -> list[pb_utils.InferenceResponse | None]:  # fmt: skip
        if result is None:  # the model answered through response senders
            out: list[pb_utils.InferenceResponse | None] = []
            for request in requests:
                sender = request._sender
                out.append(sender.responses[0] if sender and len(sender.responses) == 1 else None)
            return out
        responses: list[pb_utils.InferenceResponse | None] = list(result)
        if len(responses) != len(requests):
            raise pb_utils.TritonModelException(
                f"execute() returned {len(responses)} responses for {len(requests)} requests"
            )
        return responses

    def op_finalize(self, message: Message) -> Message:
        if self._loop is not None:  # Triton's order: the model's loop stops, then finalize()
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self.model is not None and hasattr(self.model, "finalize"):
            self.model.finalize()
        return {"ok": True}


def die_with_worker(worker_pid: int) -> None:
    """Be SIGKILLed when the worker dies, however it dies.

    The kernel sends PR_SET_PDEATHSIG when the *thread* that forked us exits, so the worker forks
    every stub from one thread that lives as long as the worker (python.py's spawner). The ppid
    check covers a worker that died before prctl ran.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != worker_pid:
        os._exit(1)


def main() -> None:
    fd, worker_pid, bell_fd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    die_with_worker(worker_pid)
    # Ctrl-C reaches the terminal's whole process group: the worker decides when models finalize.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    conn = Connection(os.dup(fd))
    # Model output printed with print() must not corrupt anything: stdout goes to stderr.
    sys.stdout = sys.stderr
    bell = socket.socket(fileno=bell_fd)
    bell.setblocking(False)
    Stub(conn, sock, bell).serve()


_DECOUPLED_RETURNS_NONE = ("a decoupled model's execute() returns None and answers through "
                           "request.get_response_sender()")


def _rescheduled(requests: list[pb_utils.InferenceRequest]) -> set[int]:
    """The indexes of the requests execute() released with RELEASE_RESCHEDULE."""
    return {index for index, request in enumerate(requests)
            if request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE}


def _owned(array: np.ndarray, copy: bool) -> np.ndarray:
    return array.copy() if copy and array.base is not None else array


def _requested(request: pb_utils.InferenceRequest,
               response: pb_utils.InferenceResponse) -> list[tuple[str, np.ndarray]]:
    """The response's tensors that the request asked for (all the config's outputs when it named
    none), as Triton's python backend prunes them: a tensor the config does not declare is not
    sent."""
    wanted = request._requested
    return [(t.name(), t.as_numpy()) for t in response.output_tensors()
            if not wanted or t.name() in wanted]  # fmt: skip


if __name__ == "__main__":
    main()
