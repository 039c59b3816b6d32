"""The python backend: each instance is a child process running the model's TritonPythonModel.

Python models hold the GIL, so instances live in their own processes (`python_stub`). The runner
thread of an instance writes the batch's input tensors into a shared-memory file, sends a small
control message over a socketpair, and reads the outputs back from the child's shared memory:
tensors are never pickled. Python models receive the requests of a batch as a list, as in Triton.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn, Protocol

from analyzer.config.model_config import (
    ConfigError,
    model_config_from_json,
    model_config_to_dict,
)
from analyzer.repository.repository import ModelSource
from analyzer.worker import load_deadline, sched
from analyzer.worker.backends.base import (
    DEFERRED,
    RESCHEDULED,
    Backend,
    BackendInstance,
    InstanceSpec,
    Result,
)
from analyzer.worker.backends.python_env import ExecutionEnv, execution_env
from analyzer.worker.backends.python_stub import (
    Message,
    ShmArena,
    ShmSpaceError,
    discard_fd,
    pack_tensors,
    read_tensor,
    recv_fd,
    send_fd,
    unpack_tensors,
    write_tensors,
)
from analyzer.worker.custom_metrics import REGISTRY, CustomMetricError
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import (
    Answer,
    BatchTiming,
    InferRequest,
    OnDone,
    OnResponse,
    Outputs,
    response_parameters,
)

log = logging.getLogger(__name__)
FINALIZE_TIMEOUT_S = 10  # a model's finalize() gets this long before its process is killed
_LOCK_WAIT_S = 2  # a call still running after this long at stop is a hung execute
# how long an unload waits for a decoupled model's open requests (their final flags) before
# it answers them with an error and finalizes the model
OPEN_REQUESTS_WAIT_S = 30.0
RING_PAUSE_S = 0.001  # the bell's reader rests this long after a ring
_CLOSED = object()  # the reader's mark, in the reply queue, that the channel closed


class _Spawner:
    """Forks every stub from one thread that lives as long as the worker.

    Stubs ask for PR_SET_PDEATHSIG, which fires when the forking *thread* exits; forking from
    short-lived executor or gRPC threads would kill healthy stubs, so all forks happen here.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        with self._lock:
            if self._pool is None:
                # stubs inherit the forking thread's policy: a model's, not the event loop's
                self._pool = ThreadPoolExecutor(
                    1, thread_name_prefix="python-stub-spawner", initializer=sched.normal_policy
                )
            pool = self._pool
        return pool.submit(subprocess.Popen, *args, **kwargs).result()


_spawner = _Spawner()
_live: set[StubProcess] = set()
_live_lock = threading.Lock()


def kill_all_stubs() -> int:
    """SIGKILL every stub still running (the worker's shutdown deadline); returns how many."""
    with _live_lock:
        stubs = list(_live)
    killed = 0
    for stub in stubs:
        if stub.process.poll() is None:
            stub.process.kill()
            killed += 1
    return killed


class StubTimeout(InferError):
    """A call the child did not answer in time; the child was stopped, since a late reply
    would be read as the next call's."""


class StubProcess:
    """One child process and its control channel; every call is a request/reply pair.

    The child stays in the worker's process group, so a launcher's killpg reaches it too.
    """

    def __init__(self, label: str, execution_env: ExecutionEnv | None = None):
        self.label = label
        parent, child = socket.socketpair()
        # the model rings this between the worker's calls when it sent something (start_bell)
        self.bell, child_bell = socket.socketpair()
        base = execution_env.environ if execution_env is not None else os.environ
        env = {**base, "PYTHONUNBUFFERED": "1"}
        python = execution_env.python if execution_env is not None else sys.executable
        try:
            self.process = _spawner.popen(
                [python, "-m", "analyzer.worker.backends.python_stub",
                 str(child.fileno()), str(os.getpid()), str(child_bell.fileno())],
                pass_fds=(child.fileno(), child_bell.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),
                env=env,
            )  # fmt: skip
        except BaseException:
            parent.close()
            self.bell.close()
            raise
        finally:
            child.close()
            child_bell.close()
        self.sock = parent  # for arena fds; the Connection below shares the channel
        self.conn = Connection(os.dup(parent.fileno()))
        self.lock = threading.Lock()  # one call at a time
        # a message and the fd after it go out together: BLS replies are sent from the threads
        # that finish them, while the call that asked waits in recv
        self.send_lock = threading.Lock()
        # what answers the model's BLS requests during a call (None: the model may send none)
        self.on_bls: Callable[[Message], None] | None = None
        # what takes a decoupled model's responses, during a call and after its reply
        self.on_response: Callable[[Message], None] | None = None
        # what answers pb_utils.load_model / unload_model / is_model_ready (None: refused)
        self.on_control: Callable[[Message], None] | None = None
        # whether request `serial` was cancelled by its client
        self.is_cancelled: Callable[[int], bool] | None = None
        # a reader thread (start_reader) reads every message and hands call replies over here
        self._reader: threading.Thread | None = None
        self._bell_thread: threading.Thread | None = None  # start_bell
        self._drainer: threading.Thread | None = None  # and what it wakes
        self._rung = threading.Event()
        self._stopping = False
        # the model's is_ready(), asked over the bell (probe_ready)
        self.has_is_ready = False
        self._ready_lock = threading.Lock()
        self._asking = False
        self._ready_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []
        self._replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # called on the reader thread once the channel closed (the stub ended)
        self.on_closed: Callable[[], None] | None = None
        # the custom metric families and metrics this model made: its own to use, released
        # when it ends
        self._families: set[int] = set()
        self._metrics: set[int] = set()
        with _live_lock:
            _live.add(self)

    def call(self, message: Message, timeout: float | None = None,
             fd: int | None = None) -> Message:  # fmt: skip
        """Send `message` (and `fd`, which is closed here); a reply's new arena fd is in 'fd'."""
        with self.lock:
            return self._call(message, timeout, fd)

    def start_reader(self) -> None:
        """Read the channel on a thread of its own from now on: a decoupled model sends
        responses, BLS requests and cancellation questions at any time, between calls too,
        and its instance must not wait for them (calls then take their replies from it)."""
        self._reader = threading.Thread(target=self._read_all, name=f"{self.label} reader",
                                        daemon=True)  # fmt: skip
        self._reader.start()

    def start_bell(self) -> None:
        """Read the bell: the answers of the model's is_ready(), and its rings. A model that
        is not decoupled rings when it sends something between calls (a metric's update or
        creation, a BLS call, the model loading API, from a thread of its own); this thread
        then reads the channel, which is otherwise read only while a call waits for its
        reply, so the hot path has no thread hop. (A decoupled model's channel has a reader
        at all times.)"""
        self._bell_thread = threading.Thread(target=self._answer_bell, daemon=True,
                                             name=f"{self.label} bell")  # fmt: skip
        self._bell_thread.start()
        if self._reader is None:  # a decoupled model's reader reads everything anyway
            self._drainer = threading.Thread(target=self._drain, daemon=True,
                                             name=f"{self.label} drain")  # fmt: skip
            self._drainer.start()

    def probe_ready(self) -> bool | asyncio.Future[bool]:
        """(On an event loop.) This instance's part of the model's readiness, as Triton's
        python backend checks it: its process is alive and, when the model defines
        is_ready(), what that returns. One question at a time goes to the model; checks that
        come meanwhile share its answer. The caller bounds the wait (READY_TIMEOUT_S)."""
        if self.process.poll() is not None:
            return False
        if not self.has_is_ready:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self._ready_lock:
            if self._bell_thread is None or not self._bell_thread.is_alive():
                return False
            # checks that gave up are dropped: a hung is_ready() must not collect them
            self._ready_waiters = [w for w in self._ready_waiters if not w[1].done()]
            self._ready_waiters.append((loop, future))
            ask = not self._asking
            self._asking = True
        if ask:
            try:
                self.bell.send(b"?")
            except OSError:
                self._readiness(False)
        return future

    def _readiness(self, ready: bool) -> None:
        """The model's answer to the question in flight, to everyone waiting for it."""
        with self._ready_lock:
            waiters, self._ready_waiters = self._ready_waiters, []
            self._asking = False
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_settle, future, ready)
            except RuntimeError:  # that loop has closed
                pass

    def _answer_bell(self) -> None:
        try:
            self._read_bell()
        finally:
            self._readiness(False)  # the process ended, or stop(): no answer is coming

    def _read_bell(self) -> None:
        while True:
            try:
                rings = self.bell.recv(4096)
            except OSError:
                return
            if not rings:
                return  # the model's process ended, or stop()
            if b"1" in rings or b"0" in rings:  # one question is in flight at a time
                self._readiness(rings.rfind(b"1") > rings.rfind(b"0"))
            if b"!" in rings:
                self._rung.set()
                # rings that come meanwhile are read together: a model updating a metric from
                # its own thread thousands of times a second wakes this thread and the drainer
                # at most ~1,000 times a second, not once per update
                time.sleep(RING_PAUSE_S)

    def _drain(self) -> None:
        """Read what the model sent between calls, once no call reads the channel (a call
        that starts meanwhile reads it before its reply, so waiting for the lock loses
        nothing; the bell's own thread never waits for it: readiness answers go on)."""
        while True:
            self._rung.wait()
            self._rung.clear()
            if self._stopping:
                return
            with self.lock:
                try:
                    while self.conn.poll(0):
                        message: Message = self.conn.recv()
                        if message.get("fd"):
                            message["fd"] = recv_fd(self.sock)
                        if not self._dispatch(message):  # no call is waiting for a reply
                            discard_fd(message)
                            log.warning("%s sent '%s' between calls; ignored", self.label,
                                        message.get("op"))  # fmt: skip
                except (EOFError, OSError):
                    return
                except Exception:  # noqa: BLE001 - one bad message must not stop the reading
                    log.exception("%s: handling a message sent between calls failed",
                                  self.label)  # fmt: skip

    def _read_all(self) -> None:
        while True:
            try:
                message: Message = self.conn.recv()
                if message.get("fd"):
                    message["fd"] = recv_fd(self.sock)
            except (EOFError, OSError):
                self._replies.put(_CLOSED)
                if self.on_closed is not None:
                    self.on_closed()
                return
            try:
                if not self._dispatch(message):
                    self._replies.put(message)
            except Exception:  # noqa: BLE001 - one bad message must not stop the reading
                log.exception("%s: handling its '%s' message failed", self.label,
                              message.get("op"))  # fmt: skip

    def _reply(self, timeout: float | None) -> Message:
        """The current call's reply: from the reader thread when there is one, else read here
        (dispatching what the model sends meanwhile)."""
        if self._reader is not None:
            try:
                reply = self._replies.get(timeout=timeout)
            except queue.Empty:
                self._timed_out(timeout)
            if reply is _CLOSED:
                self._replies.put(_CLOSED)  # for any later call too
                raise EOFError
            return reply  # type: ignore[no-any-return]
        while True:
            if timeout is not None and not self.conn.poll(timeout):
                self._timed_out(timeout)
            reply = self.conn.recv()
            if reply.get("fd"):
                reply["fd"] = recv_fd(self.sock)
            if not self._dispatch(reply):
                return reply  # type: ignore[no-any-return]

    def _timed_out(self, timeout: float | None) -> NoReturn:
        self.process.kill()
        raise StubTimeout(f"{self.label} did not answer within {timeout:g} s", Status.INTERNAL)

    def _call(self, message: Message, timeout: float | None, fd: int | None) -> Message:
        try:
            message["fd"] = fd is not None
            with self.send_lock:
                self.conn.send(message)
                send_fd(self.sock, fd)
            fd = None
            reply = self._reply(timeout)
        except (EOFError, OSError):
            raise InferError(f"{self.label} {self._stopped()}; see the worker's log",
                             Status.INTERNAL) from None  # fmt: skip
        finally:
            if fd is not None:
                os.close(fd)
        if "error" in reply:
            status = Status.UNAVAILABLE if reply.get("no_space") else Status.INTERNAL
            raise InferError(f"{self.label}: {reply['error']}", status)
        return reply

    def _stopped(self) -> str:
        """How the stub ended, once its connection closed: the pipe's end can arrive before the
        process is reaped, so its exit code is waited for a moment (it read None before)."""
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its connection but is still running"
        return f"stopped (exit code {code})"

    def _dispatch(self, message: Message) -> bool:
        """A message the model sent while a call runs (a BLS request, a decoupled response);
        False for the call's reply."""
        op = message.get("op")
        if op == "bls":
            self._bls(message)
        elif op == "is_cancelled":
            self._answer_cancelled(message)
        elif op in _METRIC_OPS:
            self._metric(message)
        elif op == "model_control":
            if self.on_control is not None:
                self.on_control(message)
            else:
                self.answer(message, {"error": "the model loading API is not supported in "
                                               "auto_complete_config()"})  # fmt: skip
        elif op == "response" and self.on_response is not None:
            self.on_response(message)
        elif op == "response":
            discard_fd(message)
        else:
            return False
        return True

    def _answer_cancelled(self, message: Message) -> None:
        """request.is_cancelled() in the model: whether that request was cancelled by its
        client (`is_cancelled`, set by the instance, which knows its requests by serial)."""
        serial = message.get("request")
        cancelled = self.is_cancelled(serial) if self.is_cancelled is not None and isinstance(
            serial, int) else False  # fmt: skip
        self.answer(message, {"cancelled": bool(cancelled)})

    def _metric(self, message: Message) -> None:
        """pb_utils.MetricFamily / Metric calls. A model acts only on the handles it was given;
        creations and value() are answered, the rest (checked in the model's process) not."""
        op, handle = message["op"], message.get("handle")
        answer: Message | None = None
        try:
            if op == "metric_family":
                handle = REGISTRY.family(message.get("name"), message.get("description"),
                                         message.get("kind"))  # fmt: skip
                self._families.add(handle)
                answer = {"handle": handle}
            elif op == "metric_new":
                family = message.get("family")
                if family not in self._families:
                    raise CustomMetricError("the metric's family was deleted")
                handle = REGISTRY.metric(family, message.get("labels"), message.get("buckets"))
                self._metrics.add(handle)
                answer = {"handle": handle}
            elif op == "metric_value":
                if handle not in self._metrics:
                    raise CustomMetricError("the metric was deleted")
                answer = {"value": REGISTRY.value(handle)}
            elif op == "metric_op" and handle in self._metrics:
                value = message.get("value")
                if isinstance(value, float | int):
                    REGISTRY.apply(handle, str(message.get("kind")), float(value))
            elif op == "metric_delete" and handle in self._metrics:
                self._metrics.discard(handle)
                REGISTRY.release_metric(handle)
            elif op == "family_delete" and handle in self._families:
                self._families.discard(handle)
                REGISTRY.release_family(handle)
        except CustomMetricError as err:
            answer = {"error": str(err)}
        if answer is not None:
            self.answer(message, answer)

    def answer(self, message: Message, fields: Message) -> None:
        """Answer a question of the model's (`id`), from any thread; a stub that is gone is not
        an error."""
        if "id" not in message:
            return
        try:
            with self.send_lock:
                self.conn.send({"op": "bls_reply", "id": message["id"], "plain": True,
                                "fd": False, **fields})  # fmt: skip
        except OSError:
            pass

    def _release_metrics(self) -> None:
        for handle in self._metrics:
            REGISTRY.release_metric(handle)
        for handle in self._families:
            REGISTRY.release_family(handle)
        self._metrics.clear()
        self._families.clear()

    def _bls(self, message: Message) -> None:
        if self.on_bls is None:
            discard_fd(message)
            self.reply_bls(message["id"], None, InferError(
                "BLS requests can be sent only from execute()", Status.UNSUPPORTED))  # fmt: skip
            return
        self.on_bls(message)

    def reply_bls(self, number: int, outputs: Outputs | None, error: Exception | None,
                  final: bool = True) -> None:  # fmt: skip
        """Answer BLS request `number` (from any thread); a stub that is gone is not an error.
        `final` False: one response of a decoupled call, more to come."""
        if error is None and outputs is not None:
            try:
                fields, fd = pack_tensors(list(outputs.items()))
            except (ShmSpaceError, OSError, ValueError) as err:
                fields, fd, error = {}, None, InferError(f"BLS outputs cannot be sent: {err}")
            params = response_parameters(outputs)
            if params:
                fields["params"] = params
        else:
            fields, fd = {}, None
        message = {"op": "bls_reply", "id": number, "fd": fd is not None, "final": final,
                   **fields}  # fmt: skip
        if error is not None:
            message["error"] = str(error)
            status = getattr(error, "status", None)
            message["code"] = _TRITON_CODES.get(status, 1) if isinstance(status, Status) else 1
        try:
            with self.send_lock:
                self.conn.send(message)
                send_fd(self.sock, fd)
                fd = None
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)

    def stop(self) -> None:
        """Finalize the model if the child answers in time, else kill it; never blocks for long.

        A hung execute holds the lock in a recv that only the child's death ends: killing the
        child answers that call with an error, and its runner then answers its requests.
        """
        finalized = False
        if self.process.poll() is None and self.lock.acquire(timeout=_LOCK_WAIT_S):
            try:
                self._call({"op": "finalize"}, FINALIZE_TIMEOUT_S, None)
                finalized = True
            except InferError:
                pass
            finally:
                self.lock.release()
        try:
            self.process.wait(FINALIZE_TIMEOUT_S if finalized else 0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            try:
                self.process.wait(FINALIZE_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # stuck in the kernel; its fds go with it
                log.warning("%s (pid %d) did not exit after SIGKILL", self.label, self.process.pid)
        with _live_lock:
            _live.discard(self)
        try:  # the bell's reader ends at the bell's end
            self.bell.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._stopping = True
        self._rung.set()
        for thread in (self._bell_thread, self._drainer):
            if thread is not None:
                thread.join(FINALIZE_TIMEOUT_S)
        self.bell.close()
        if self._reader is not None:  # it ends at the channel's end; then its fds may close
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._reader.join(FINALIZE_TIMEOUT_S)
        self._release_metrics()  # the model's process is gone, its messages read: so are they
        if self.lock.acquire(timeout=_LOCK_WAIT_S):  # no call is inside recv on these fds
            try:
                self.conn.close()
                self.sock.close()
            finally:
                self.lock.release()


# TritonError's codes for the worker's statuses (INTERNAL otherwise), and back: a model's
# TritonError(message, code) reaches its client with that code's HTTP status and gRPC code
_TRITON_CODES = {Status.UNKNOWN: 0, Status.INTERNAL: 1, Status.NOT_FOUND: 2,
                 Status.INVALID_ARG: 3, Status.UNAVAILABLE: 4, Status.UNSUPPORTED: 5,
                 Status.ALREADY_EXISTS: 6, Status.CANCELLED: 7}  # fmt: skip
_STATUS_OF_CODE = {code: status for status, code in _TRITON_CODES.items()}
_METRIC_OPS = frozenset(("metric_family", "metric_new", "metric_value", "metric_op",
                         "metric_delete", "family_delete"))  # fmt: skip


def model_error(message: Any, code: Any = 1) -> InferError:
    """A python model's error answer, with the status of its TritonError code."""
    return InferError(str(message), _STATUS_OF_CODE.get(code, Status.INTERNAL))


class Models(Protocol):
    """Where a BLS request finds its model, and what pb_utils.load_model and the like call: the
    worker's model manager."""

    def get(self, name: str, version: str = "") -> Any: ...

    def load(self, name: str, config_json: str | None = None,
             files: Mapping[str, object] | None = None) -> None: ...  # fmt: skip

    def unload(self, name: str, dependents: bool = False) -> None: ...

    def is_ready(self, name: str, version: str = "") -> bool: ...

    def ask_ready(self, name: str, version: str, done: Callable[[bool], None]) -> None: ...

    def require_explicit(self) -> None: ...


class PythonBackend(Backend):
    name = "python"

    def __init__(self, models: Models | None = None) -> None:
        self.models = models

    def auto_complete(self, source: ModelSource, version: int) -> None:
        config = source.config
        model_file = source.model_file(version)
        if not model_file.exists():
            raise ValueError(
                f"model '{source.name}' version {version}: {model_file} does not exist"
            )
        stub = StubProcess(f"python model '{source.name}' (auto-complete)",
                           execution_env(source.config, source.path))
        try:  # as long as it takes (Triton's), unless the load has a deadline
            reply = stub.call(
                {"op": "auto_complete", "model_file": str(model_file),
                 "config": json.dumps(model_config_to_dict(config))},
                timeout=load_deadline.remaining(),
            )  # fmt: skip
        except StubTimeout:
            raise load_deadline.expired(
                f"python model '{source.name}': auto_complete_config() (or model.py's import) "
                "was still running; its process was stopped") from None
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
        return PythonInstance(source, version, spec, self.models)


class PythonInstance(BackendInstance):
    def __init__(self, source: ModelSource, version: int, spec: InstanceSpec,
                 models: Models | None = None):  # fmt: skip
        self.name = f"python model '{source.name}' instance {spec.name}"
        self.stub = StubProcess(self.name, execution_env(source.config, source.path))
        self.stub.is_cancelled = self._cancelled
        self.models = models
        if models is not None:
            self.stub.on_bls = self._bls
            self.stub.on_control = self._control
        self._finalizing = False  # the model loading API is refused from finalize(), as Triton's
        self.decoupled = source.config.model_transaction_policy.decoupled
        # what a request that names no outputs asks for: all the config's, as Triton's core
        # fills them in, so the model sees them and returns no undeclared tensor
        self.output_names = [o.name for o in source.config.output]
        # the model knows a request by its serial: its index in the call, or for a decoupled
        # model a number of its own, since its requests outlive the call
        self._batch: list[InferRequest] = []  # the call's requests (not decoupled)
        self._serials = itertools.count()
        self._next_serial = 0  # a model that is not decoupled: the next call's first serial
        self._base = 0  # and the current call's
        self._open: dict[int, _OpenRequest] = {}  # a decoupled model's requests not yet final
        self._open_lock = threading.Condition()
        if self.decoupled:
            self.stub.on_response = self._response
            self.stub.on_closed = self._closed
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
                timeout=load_deadline.remaining(),  # None: as long as it takes (Triton's)
            )
        except StubTimeout:
            self.finalize()
            raise load_deadline.expired(f"instance {spec.name}'s initialize() was still running; "
                                        "its process was stopped") from None
        except InferError as err:
            self.finalize()
            raise ValueError(f"initialize failed: {err}") from None
        self.pid = reply["pid"]
        self.stub.has_is_ready = bool(reply.get("is_ready"))
        if self.decoupled:
            self.stub.start_reader()
        self.stub.start_bell()

    def probe_ready(self) -> bool | asyncio.Future[bool]:
        return self.stub.probe_ready()

    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        t0 = time.perf_counter_ns()
        arrays = [(name, arr) for r in requests for name, arr in r.inputs.items()]
        try:
            layout, fd = write_tensors(self.inputs, arrays)
        except ShmSpaceError as err:
            raise InferError(f"{self.name}: {err}", Status.UNAVAILABLE) from None
        specs, i = [], 0
        if self.decoupled:
            serials: Sequence[int] = self._register(requests)
        else:  # numbered on from the last call's: a request kept past its call is not another's
            base = self._base = self._next_serial
            self._next_serial = base + len(requests)
            serials = range(base, base + len(requests))
        for r, serial in zip(requests, serials, strict=True):
            n = len(r.inputs)
            specs.append({
                "serial": serial, "id": r.id, "correlation_id": r.correlation_id, "flags": r.flags,
                "timeout": r.timeout_us, "parameters": r.parameters,
                "requested": list(r.requested_outputs or self.output_names),
                "inputs": layout[i : i + n],
            })  # fmt: skip
            i += n
        t1 = time.perf_counter_ns()
        message = {"op": "execute", "shm_size": self.inputs.size,
                   "outputs_size": self.outputs.size, "requests": specs}  # fmt: skip
        if not self.decoupled:
            self._batch = requests
        try:
            reply = self.stub.call(message, fd=fd)
        except InferError:
            if fd is not None:  # the child may not hold the new file: reserve a fresh one next time
                self.inputs.close()
            if self.decoupled:  # the runner answers the batch with the error
                self._unregister(serials)
            raise
        finally:
            self._batch = []  # asked about during the call only; its tensors are not kept
        if self.decoupled:
            timing.compute_input_ns = t1 - t0
            timing.compute_infer_ns = time.perf_counter_ns() - t1
            return self._defer(serials, reply.get("rescheduled") or ())
        t2 = time.perf_counter_ns()
        if reply["fd"] is not False:
            try:
                self.outputs.adopt(reply["fd"], reply["shm_size"])
            except OSError as err:  # our stale outputs_size makes the child send a new file
                raise InferError(
                    f"{self.name}: cannot map its outputs: {err}", Status.INTERNAL
                ) from None
        results: list[Result] = []
        codes = reply.get("codes") or [1] * len(reply["errors"])
        rescheduled = set(reply.get("rescheduled") or ())
        for index, (outputs, error, code) in enumerate(
                zip(reply["outputs"], reply["errors"], codes, strict=True)):  # fmt: skip
            if index in rescheduled:
                results.append(RESCHEDULED)
                continue
            if error is not None:
                results.append(model_error(error, code))
                continue
            results.append({
                name: read_tensor(self.outputs, wire, shape, offset, size).copy()
                for name, wire, shape, offset, size in outputs
            })  # fmt: skip
        if "params" in reply:  # InferenceResponse(parameters=...): sent with the outputs
            for index, params in enumerate(reply["params"]):
                result = results[index]
                if params and isinstance(result, dict):
                    results[index] = Answer(result, params)
        t3 = time.perf_counter_ns()
        timing.compute_input_ns = t1 - t0
        timing.compute_infer_ns = t2 - t1
        timing.compute_output_ns = t3 - t2
        return results

    # ---- a decoupled model's requests, answered when their final flag comes -------------------
    def _register(self, requests: list[InferRequest]) -> list[int]:
        """Serials for a decoupled call's requests, open from now until their final flag."""
        with self._open_lock:
            serials = []
            for request in requests:
                serial = next(self._serials)
                self._open[serial] = _OpenRequest(request)
                serials.append(serial)
            return serials

    def _unregister(self, serials: Sequence[int]) -> None:
        with self._open_lock:
            for serial in serials:
                self._open.pop(serial, None)
            self._open_lock.notify_all()

    def _defer(self, serials: Sequence[int], rescheduled: Sequence[int] = ()) -> list[Result]:
        """execute() returned: the requests still open are answered at their final flag, by
        the channel's reader, while this instance takes its next batch (Triton's rule); those
        released with RELEASE_RESCHEDULE go back to the batcher, their next execution a
        request of its own here (the runner refuses it where the config has no iterative
        sequences)."""
        results: list[Result] = []
        again = {serials[index] for index in rescheduled if 0 <= index < len(serials)}
        with self._open_lock:
            for serial in serials:
                entry = self._open.get(serial)
                if entry is not None and serial in again:
                    del self._open[serial]
                    self._open_lock.notify_all()
                    results.append(RESCHEDULED)
                elif entry is None:  # final during execute(): the runner answers it now
                    results.append({})
                else:
                    entry.deferred = True
                    results.append(DEFERRED)
        return results

    def _cancelled(self, serial: int) -> bool:
        if self.decoupled:
            entry = self._open.get(serial)
            return entry is not None and entry.request.cancelled
        batch, index = self._batch, serial - self._base
        return 0 <= index < len(batch) and batch[index].cancelled

    def _response(self, message: Message) -> None:
        """One response of a decoupled model, handed to its request's stream at once (on the
        channel's reader thread); after the final one a deferred request is complete."""
        serial = message.get("request")
        outputs, error = None, None
        if message.get("error") is not None:
            discard_fd(message)
            error = model_error(message["error"], message.get("code", 1))
        elif not message.get("empty"):
            try:
                outputs = unpack_tensors(message)
            except (OSError, ValueError) as err:
                error = InferError(f"{self.name}: a response cannot be read: {err}",
                                   Status.INTERNAL)  # fmt: skip
            if outputs is not None and message.get("params"):
                outputs = Answer(outputs, message["params"])
        final = bool(message.get("final"))
        # under the lock: the runner's own answer (on_done) of a request that ended during its
        # call must not overtake that request's last response
        with self._open_lock:
            entry = self._open.get(serial) if isinstance(serial, int) else None
            if entry is None:
                return
            request = entry.request
            if final:
                del self._open[serial]  # type: ignore[arg-type]
                self._open_lock.notify_all()
            if request.on_response is not None and not request.cancelled:
                request.on_response(outputs, error, final)
            if final and entry.deferred and self.complete is not None:
                self.complete(request, {}, None)

    def _closed(self) -> None:
        """The model's process ended: its deferred requests are answered with the error (those
        of a call in progress are answered by their runner, whose call fails)."""
        error = InferError(f"{self.name} stopped before sending every final response; see the "
                           "worker's log", Status.INTERNAL)  # fmt: skip
        with self._open_lock:
            gone = [(serial, entry) for serial, entry in self._open.items() if entry.deferred]
            for serial, _ in gone:
                del self._open[serial]
            self._open_lock.notify_all()
            if self.complete is not None:
                for _, entry in gone:
                    self.complete(entry.request, None, error)

    def forget(self, requests: list[InferRequest]) -> None:
        if not self.decoupled:
            return
        answered = {id(request) for request in requests}
        with self._open_lock:
            for serial in [s for s, e in self._open.items() if id(e.request) in answered]:
                del self._open[serial]
            self._open_lock.notify_all()

    def _bls(self, message: Message) -> None:
        """A BLS request of this model: an ordinary request to the named model (its batcher,
        instances and statistics), answered to the stub when it finishes, on whichever thread
        finishes it. Runs on whichever thread reads the stub's channel: this instance's runner
        during execute(), or a decoupled model's reader thread."""
        number = message["id"]
        try:
            try:
                inputs = unpack_tensors(message)
            except (OSError, ValueError) as err:
                raise InferError(f"the BLS request's tensors cannot be read: {err}") from None
            name = message["model"]
            if not isinstance(name, str) or not name:
                raise InferError("a BLS request needs model_name")
            version = message["version"]
            assert self.models is not None
            model = self.models.get(name, "" if version < 0 else str(version))
            parameters = message["parameters"]
            now = time.perf_counter_ns()
            on_done, on_response = self._bls_answers(number, bool(message.get("decoupled")))
            request = InferRequest(
                model_name=name, inputs=inputs,
                wire_types={t[0]: t[1] for t in message["tensors"]},
                requested_outputs=list(message["requested"]) or None,
                on_done=on_done, on_response=on_response,
                id=str(message["request_id"]),
                parameters=json.loads(parameters) if isinstance(parameters, str) else {},
                timeout_us=int(message["timeout"]), arrival_ns=now, queue_start_ns=now,
                correlation_id=message["correlation_id"], flags=int(message["flags"]),
            )  # fmt: skip
            model.submit(request)
        except InferError as err:
            self.stub.reply_bls(number, None, err)
        except Exception as err:  # a malformed request must not stop the call that sent it
            self.stub.reply_bls(number, None, InferError(f"{type(err).__name__}: {err}"))

    def _control(self, message: Message) -> None:
        """pb_utils.load_model / unload_model / is_model_ready, as Triton's: a load is answered
        when it ends (on a thread of its own: this one reads the model's channel), an unload
        once it has started, as TRITONSERVER_ServerUnloadModel does, so a model may unload
        itself from execute()."""
        models = self.models
        assert models is not None
        action, name = message.get("action"), message.get("model_name")
        try:
            if self._finalizing:
                raise InferError("the model loading API is not supported in finalize()")
            if not isinstance(name, str) or not name:
                raise InferError("a model name is needed")
            if action == "is_ready":
                version = message.get("model_version")
                models.ask_ready(name, version if isinstance(version, str) else "",
                                 lambda ready: self.stub.answer(message, {"ready": ready}))
                return
            models.require_explicit()
            if action == "load":
                config, files = message.get("config") or None, message.get("files") or None
                if config is not None and not isinstance(config, str):
                    raise InferError("config must be a JSON string")
                if files is not None and not isinstance(files, dict):
                    raise InferError("files must be a dictionary of 'file:<path>' to bytes")
                _background(f"load of '{name}' for {self.name}", lambda: models.load(
                    name, config, files), lambda error: self.stub.answer(message, error))
            elif action == "unload":
                dependents = bool(message.get("unload_dependents"))
                _background(f"unload of '{name}' for {self.name}",
                            lambda: models.unload(name, dependents), lambda error: None)
                self.stub.answer(message, {})
            else:
                raise InferError(f"unknown model control action {action!r}")
        except InferError as err:
            self.stub.answer(message, {"error": str(err)})

    def _bls_answers(self, number: int, decoupled: bool) -> tuple[OnDone, OnResponse | None]:
        """(on_done, on_response) of a BLS request: one reply; or, for exec(decoupled=True),
        one reply per response, the last flagged final (a model that is not decoupled answers
        once, final)."""
        reply = self.stub.reply_bls
        if not decoupled:
            return (lambda outputs, error: reply(number, outputs, error)), None
        ended = [False]

        def on_response(outputs: Outputs | None, error: Exception | None, final: bool) -> None:
            ended[0] = ended[0] or final
            reply(number, outputs, error, final=final)

        def on_done(outputs: Outputs | None, error: Exception | None) -> None:
            if not ended[0]:  # a model that is not decoupled, or a failure: the last answer
                ended[0] = True
                reply(number, outputs or None, error, final=True)

        return on_done, on_response

    def finalize(self) -> None:
        """A decoupled model first gets time to finish its open requests (Triton waits for
        them too); those still open when its process ends are answered with an error."""
        self._finalizing = True
        if self.decoupled:
            with self._open_lock:
                if not self._open_lock.wait_for(lambda: not self._open, OPEN_REQUESTS_WAIT_S):
                    log.warning("%s: %d request(s) still open after %g s; stopping it",
                                self.name, len(self._open), OPEN_REQUESTS_WAIT_S)  # fmt: skip
        self.stub.stop()
        self.inputs.close()
        self.outputs.close()


def _settle(future: asyncio.Future[bool], ready: bool) -> None:
    if not future.done():  # a check that timed out cancelled it
        future.set_result(ready)


def _background(what: str, work: Callable[[], None],
                done: Callable[[Message], None]) -> None:
    """Run `work` on a thread of its own, then `done({})` or `done({"error": ...})`."""

    def run() -> None:
        try:
            work()
        except InferError as err:
            done({"error": str(err)})
        except Exception as err:  # noqa: BLE001 - the model gets the sentence, the log the rest
            log.exception("%s failed", what)
            done({"error": f"{type(err).__name__}: {err}"})
        else:
            done({})

    threading.Thread(target=run, name=what, daemon=True).start()


@dataclass(slots=True)
class _OpenRequest:
    """A decoupled model's request that has not sent its final flag."""

    request: InferRequest
    deferred: bool = False  # execute() returned: the channel's reader answers it at the end
