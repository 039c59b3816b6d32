"""The python backend: each instance is a child process running the model's TritonPythonModel.

Python models hold the GIL, so instances live in their own processes (`python_stub`). The runner
thread of an instance writes the batch's input tensors into a shared-memory file, sends a small
control message over a socketpair, and reads the outputs back from the child's shared memory:
tensors are never pickled. Python models receive the requests of a batch as a list, as in Triton.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Protocol

from analyzer.config.model_config import (
    ConfigError,
    model_config_from_json,
    model_config_to_dict,
)
from analyzer.repository.repository import ModelSource
from analyzer.worker import load_deadline, sched
from analyzer.worker.backends.base import Backend, BackendInstance, InstanceSpec, Result
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
from analyzer.worker.errors import InferError, Status
from analyzer.worker.request import BatchTiming, InferRequest, OnDone, OnResponse, Outputs

log = logging.getLogger(__name__)
FINALIZE_TIMEOUT_S = 10  # a model's finalize() gets this long before its process is killed
_LOCK_WAIT_S = 2  # a call still running after this long at stop is a hung execute


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

    def __init__(self, label: str):
        self.label = label
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            self.process = _spawner.popen(
                [sys.executable, "-m", "analyzer.worker.backends.python_stub",
                 str(child.fileno()), str(os.getpid())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),
                env=env,
            )  # fmt: skip
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
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
        # whether request i of the current call was cancelled by its client
        self.is_cancelled: Callable[[int], bool] | None = None
        with _live_lock:
            _live.add(self)

    def call(self, message: Message, timeout: float | None = None,
             fd: int | None = None) -> Message:  # fmt: skip
        """Send `message` (and `fd`, which is closed here); a reply's new arena fd is in 'fd'."""
        with self.lock:
            return self._call(message, timeout, fd)

    def _call(self, message: Message, timeout: float | None, fd: int | None) -> Message:
        try:
            message["fd"] = fd is not None
            with self.send_lock:
                self.conn.send(message)
                send_fd(self.sock, fd)
            fd = None
            while True:
                if timeout is not None and not self.conn.poll(timeout):
                    self.process.kill()
                    raise StubTimeout(f"{self.label} did not answer within {timeout:g} s",
                                      Status.INTERNAL)  # fmt: skip
                reply: Message = self.conn.recv()
                if reply.get("fd"):
                    reply["fd"] = recv_fd(self.sock)
                if not self._dispatch(reply):
                    break
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
        elif op == "response" and self.on_response is not None:
            self.on_response(message)
        elif op == "response":
            discard_fd(message)
        else:
            return False
        return True

    def pump(self) -> None:
        """Read and dispatch one message after a call's reply: a decoupled model's responses
        (or BLS requests) sent by its threads once execute() returned."""
        with self.lock:
            try:
                message = self.conn.recv()
                if message.get("fd"):
                    message["fd"] = recv_fd(self.sock)
            except (EOFError, OSError):
                raise InferError(f"{self.label} {self._stopped()} before its responses were "
                                 "complete", Status.INTERNAL) from None  # fmt: skip
            if not self._dispatch(message):
                raise InferError(f"{self.label} sent '{message.get('op')}' between calls",
                                 Status.INTERNAL)  # fmt: skip

    def _answer_cancelled(self, message: Message) -> None:
        """request.is_cancelled() in the model: whether that request of the call was cancelled
        by its client (`is_cancelled`, set by the instance for its call's batch)."""
        index = message.get("request")
        cancelled = self.is_cancelled(index) if self.is_cancelled is not None and isinstance(
            index, int) else False  # fmt: skip
        try:
            with self.send_lock:
                self.conn.send({"op": "bls_reply", "id": message.get("id"),
                                "cancelled": bool(cancelled), "fd": False})  # fmt: skip
        except OSError:
            pass

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


def model_error(message: Any, code: Any = 1) -> InferError:
    """A python model's error answer, with the status of its TritonError code."""
    return InferError(str(message), _STATUS_OF_CODE.get(code, Status.INTERNAL))


class Models(Protocol):
    """Where a BLS request finds its model: the worker's model manager."""

    def get(self, name: str, version: str = "") -> Any: ...


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
        stub = StubProcess(f"python model '{source.name}' (auto-complete)")
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
        self.stub = StubProcess(self.name)
        self.stub.is_cancelled = self._cancelled
        self.models = models
        if models is not None:
            self.stub.on_bls = self._bls
        self.decoupled = source.config.model_transaction_policy.decoupled
        # what a request that names no outputs asks for: all the config's, as Triton's core
        # fills them in, so the model sees them and returns no undeclared tensor
        self.output_names = [o.name for o in source.config.output]
        self._batch: list[InferRequest] = []  # the call's requests, for decoupled responses
        self._open: set[int] = set()
        if self.decoupled:
            self.stub.on_response = self._response
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

    def execute(self, requests: list[InferRequest], timing: BatchTiming) -> list[Result]:
        t0 = time.perf_counter_ns()
        arrays = [(name, arr) for r in requests for name, arr in r.inputs.items()]
        try:
            layout, fd = write_tensors(self.inputs, arrays)
        except ShmSpaceError as err:
            raise InferError(f"{self.name}: {err}", Status.UNAVAILABLE) from None
        specs, i = [], 0
        for r in requests:
            n = len(r.inputs)
            specs.append({
                "id": r.id, "correlation_id": r.correlation_id, "flags": r.flags,
                "timeout": r.timeout_us, "parameters": r.parameters,
                "requested": list(r.requested_outputs or self.output_names),
                "inputs": layout[i : i + n],
            })  # fmt: skip
            i += n
        t1 = time.perf_counter_ns()
        message = {"op": "execute", "shm_size": self.inputs.size,
                   "outputs_size": self.outputs.size, "requests": specs}  # fmt: skip
        self._batch = requests
        try:
            reply = self.stub.call(message, fd=fd)
        except InferError:
            if fd is not None:  # the child may not hold the new file: reserve a fresh one next time
                self.inputs.close()
            raise
        if reply.get("decoupled"):
            self._open = set(reply["open"])
            while self._open:  # the model's threads finish the requests
                self.stub.pump()
            self._batch = []
            timing.compute_input_ns = t1 - t0
            timing.compute_infer_ns = time.perf_counter_ns() - t1
            return [{} for _ in requests]  # complete: every response went out as it came
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
        for outputs, error, code in zip(reply["outputs"], reply["errors"], codes, strict=True):
            if error is not None:
                results.append(model_error(error, code))
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

    def _cancelled(self, index: int) -> bool:
        batch = self._batch
        return 0 <= index < len(batch) and batch[index].cancelled

    def _response(self, message: Message) -> None:
        """One response of a decoupled model, handed to its request's stream at once."""
        index = message.get("request")
        if not isinstance(index, int) or not 0 <= index < len(self._batch):
            discard_fd(message)
            return
        request = self._batch[index]
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
        final = bool(message.get("final"))
        if final:
            self._open.discard(index)
        if request.on_response is not None and not request.cancelled:
            request.on_response(outputs, error, final)

    def _bls(self, message: Message) -> None:
        """A BLS request of this model: an ordinary request to the named model (its batcher,
        instances and statistics), answered to the stub when it finishes, on whichever thread
        finishes it. Runs on this instance's runner thread, which waits for execute()."""
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
        self.stub.stop()
        self.inputs.close()
        self.outputs.close()
