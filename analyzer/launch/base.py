"""The Launcher interface: how the profiler gets a serving worker, wherever it runs.

Lifecycle: `start()` once (raises LaunchError with the worker's own words when it cannot start),
then any number of `load(name)` / `unload(name)` through the repository API, `alive()` between
measurements (the profiler starts a new worker after a crash), and `stop()` always -- also on
Ctrl-C and on errors (use the launcher as a context manager). Local, docker and remote
launchers implement the same calls.

The workers that a launcher starts itself keep their repository API (load/unload) for the
profiler: the launcher makes a random key per run and hands it to the worker in the environment
(never argv, which `ps` shows to every user); `_repository_call` sends it as a header.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import socket
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO
from urllib.parse import quote

from analyzer.errors import AnalyzerError
from analyzer.worker.load_deadline import FLAG as LOAD_TIMEOUT_FLAG
from analyzer.worker.restrict import KEY_HEADER, REPOSITORY_KEY_ENV

READY_LINE = "model-analyzer serve ready:"  # the worker's first line once it serves
PORT_TAKEN = "address already in use"  # the worker's words when a chosen port was taken
PORT_ATTEMPTS = 3  # a start that lost a port to another process tries again with new ones
LOAD_ANSWER_MARGIN_S = 30.0  # a worker that stops a load at its timeout answers within this


def load_timeout_text(name: str, seconds: float) -> str:
    return (f"model '{name}' did not finish loading within {seconds:g} s (model_load_timeout; "
            "raise it for a model whose initialize() takes longer)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LaunchError(RuntimeError):
    """The worker could not be started or reached; the message carries its last words."""


class LoadTimeoutError(LaunchError):
    """A model's load got no answer within the profile's model_load_timeout: the worker holds a
    load in an unknown state, so a worker of ours is restarted before the next config."""


class LaunchSetupError(LaunchError, AnalyzerError):
    """No worker can run at all here (no Docker daemon, no image, no server at the endpoint, a
    bad launch setting): the run ends with this one message instead of failing every config."""


class Launcher(ABC):
    http_url: str = ""  # host:port
    grpc_url: str = ""
    metrics_url: str = ""
    pid: int | None = None  # the worker's process, when it runs on this machine
    remote = False  # True: a server we do not own (variants are loaded by config, by model name)
    log_path: Path | None = None
    repository_key = ""  # sent as KEY_HEADER on repository calls; "" for a server we do not own
    # a model's load at most (the profile's model_load_timeout): a worker of ours stops a longer
    # load itself (--model-load-timeout-secs) and answers; a server we do not own is waited for
    load_timeout_s = 600.0

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def alive(self) -> bool: ...

    def choose_ports(self) -> None:
        """Free ports for a worker this launcher starts on this machine, and the URLs to them:
        another process may take one before the worker binds it, so a start may choose again."""
        self.ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
        self.http_url = f"127.0.0.1:{self.ports['http']}"
        self.grpc_url = f"127.0.0.1:{self.ports['grpc']}"
        self.metrics_url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def exit_status(self) -> str:
        """How the worker ended, in words ('' while it runs or when unknown)."""
        return ""

    def last_words(self, lines: int = 20) -> str:
        """The end of the worker's log: what to show when it failed."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])

    def enforces_load_timeout(self) -> bool:
        """Whether the server stops a load longer than load_timeout_s itself (our worker,
        started with --model-load-timeout-secs)."""
        return False

    def load_wait_s(self) -> float:
        """How long to wait for a load's answer: a worker that enforces the timeout is given a
        margin to stop the model's processes and answer with the reason."""
        return self.load_timeout_s + (LOAD_ANSWER_MARGIN_S if self.enforces_load_timeout() else 0)

    # ---- repository API (KServe v2 / Triton) --------------------------------------------------
    def load(self, name: str) -> None:
        """Load `name` from the worker's repository; LaunchError with the worker's reason,
        LoadTimeoutError when no answer came in time."""
        try:
            path = f"/v2/repository/models/{quote(name, safe='')}/load"
            self._repository_call(path, self.load_wait_s(),
                                  timed_out=load_timeout_text(name, self.load_timeout_s))
        except LoadTimeoutError:
            raise
        except LaunchError as err:  # the worker's words name its flag: say the profile's setting
            text = str(err)
            if self.enforces_load_timeout() and LOAD_TIMEOUT_FLAG in text:
                raise LaunchError(text.replace(LOAD_TIMEOUT_FLAG, "model_load_timeout")) from None
            raise

    def check(self) -> None:  # noqa: B027 - a local worker needs nothing checked beforehand
        """LaunchSetupError when no worker can run at all (no daemon, no image, no server)."""

    def load_variant(self, name: str, config_text: str) -> None:
        """Load a variant the profiler wrote (`config_text` is its config.pbtxt): a local or docker
        worker reads it from the output repository it serves; a remote server gets the config."""
        self.load(name)

    def unload(self, name: str, timeout_s: float = 120.0) -> None:
        """Unload `name`, and the composing models of an ensemble variant with it (those no
        other loaded ensemble calls): Triton's unload_dependents, a no-op for other models."""
        self._repository_call(f"/v2/repository/models/{quote(name, safe='')}/unload", timeout_s,
                              {"parameters": {"unload_dependents": True}})  # fmt: skip

    def _repository_call(self, path: str, timeout_s: float, body: dict | None = None,
                         timed_out: str = "") -> None:  # fmt: skip
        """POST to the repository API; LaunchError with the worker's reason, LoadTimeoutError
        (`timed_out`'s words) when given and no answer came within timeout_s."""
        host, _, port = self.http_url.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        headers = {"Content-Type": "application/json"}
        if self.repository_key:
            headers[KEY_HEADER] = self.repository_key
        try:
            conn.request("POST", path, body=json.dumps(body or {}).encode(), headers=headers)
            response = conn.getresponse()
            answer = response.read()
        except TimeoutError as err:
            if timed_out:
                raise LoadTimeoutError(timed_out) from None
            raise LaunchError(f"worker at {self.http_url} did not answer {path}: {err}") from None
        except OSError as err:
            raise LaunchError(f"worker at {self.http_url} did not answer {path}: {err}") from None
        finally:
            conn.close()
        if response.status != 200:
            try:
                message = json.loads(answer).get("error", "")
            except (ValueError, AttributeError):
                message = answer.decode(errors="replace")
            raise LaunchError(message or f"HTTP {response.status} for {path}")


def new_repository_key() -> tuple[str, dict[str, str]]:
    """A fresh per-run key and the environment entry that hands it to the worker."""
    key = secrets.token_urlsafe(32)
    return key, {REPOSITORY_KEY_ENV: key}


def open_log(path: Path) -> IO[bytes]:
    """Append to the worker's log, created 0600: it may carry model inputs and outputs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077 and os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o600)  # an older log from before this rule
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise
