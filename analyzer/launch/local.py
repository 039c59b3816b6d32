"""Local launch: `model-analyzer serve` as a child process, in explicit model-control mode.

Ports are chosen once and kept across restarts, so load-generator connections simply reconnect;
only a start that lost a chosen port to another process (the gap between choosing and binding)
takes fresh ones and tries again, so `ports` may change at a start and callers re-read the URLs.
The worker's output goes to a log file (0600); readiness is its ready line there. The worker dies
with the analyzer: it is stopped on exit and Ctrl-C, and the kernel sends it SIGTERM if the
analyzer is killed outright (PR_SET_PDEATHSIG), so no orphan keeps a port or a GPU. The worker
leads its own process group, which holds its python-backend stubs too: stop() ends with SIGKILL
to the whole group, so a hung model or a worker that died by a signal leaves no stub behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from analyzer.launch.base import (
    PORT_ATTEMPTS,
    PORT_TAKEN,
    READY_LINE,
    Launcher,
    LaunchError,
    new_repository_key,
    open_log,
)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # pragma: no cover - not Linux
        pass


class LocalLauncher(Launcher):
    def __init__(
        self,
        repository: Path,
        log_path: Path,
        extra_flags: dict[str, object] | None = None,
        startup_timeout_s: float = 120.0,
        cpus: str = "",
        gpus: list[str] | None = None,
        stop_timeout_s: float = 30.0,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.repository = repository
        self.environment = dict(environment or {})  # MA's triton_server_environment
        self.log_path = log_path
        self.extra_flags = extra_flags or {}
        self.startup_timeout_s = startup_timeout_s
        self.cpus = cpus  # taskset CPU list for the worker ("" = inherit)
        self.gpus = [g for g in (gpus or []) if g != "all"]  # the worker sees only these
        self.choose_ports()
        self.stop_timeout_s = stop_timeout_s  # after SIGTERM, then SIGKILL to the group
        self.repository_key, self._key_env = new_repository_key()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def enforces_load_timeout(self) -> bool:
        return True

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "analyzer", "serve",
            "--model-repository", str(self.repository),
            "--model-control-mode", "explicit",
            "--host", "127.0.0.1",
            "--http-port", str(self.ports["http"]),
            "--grpc-port", str(self.ports["grpc"]),
            "--metrics-port", str(self.ports["metrics"]),
            f"--model-load-timeout-secs={self.load_timeout_s:g}",
        ]  # fmt: skip
        for key, value in self.extra_flags.items():
            cmd.append(f"--{str(key).replace('_', '-')}={value}")
        return ["taskset", "-c", self.cpus, *cmd] if self.cpus else cmd

    def start(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            exited = self._start_once()
            if exited is None:
                return
            status, output = exited
            if PORT_TAKEN not in output or attempt == PORT_ATTEMPTS - 1:
                raise LaunchError(self._start_failure(status, output))
            self.choose_ports()  # another process took a port between choice and bind

    def _start_once(self) -> tuple[str, str] | None:
        """None when the worker is ready; (its exit status, its output since this start) when it
        exited."""
        self.stop()  # a worker that died since: its group may still hold stubs
        with open_log(self.log_path) as log:
            log.write(f"--- start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            log.flush()
            offset = log.tell()
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                preexec_fn=_die_with_parent,
                start_new_session=True,  # Ctrl-C reaches the analyzer, which stops the worker
            )
        self.pid = self.process.pid
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            if READY_LINE in text:
                return None
            if self.process.poll() is not None:
                status = self.exit_status()
                self.stop()
                return status, self.log_path.read_bytes()[offset:].decode(errors="replace")
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(
                    f"the worker was not ready after {self.startup_timeout_s:.0f} s "
                    f"(log: {self.log_path})"
                )
            time.sleep(0.05)

    def _start_failure(self, status: str, output: str) -> str:
        """One line that says why (the worker's last line), then its last lines for detail."""
        lines = [line for line in output.strip().splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else "it printed nothing"
        detail = "\n".join(lines[-20:])
        return (f"the worker exited at start ({status}): {reason} (log: {self.log_path})"
                + (f"\n{detail}" if len(lines) > 1 else ""))

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **self.environment, "PYTHONUNBUFFERED": "1", **self._key_env}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)  # indices or UUIDs both work
        return env

    def exit_status(self) -> str:
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return ""
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the whole group after stop_timeout_s; leftovers killed too."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(process.pid)  # stubs of a worker that exited, hung or died by a signal
        process.wait(10)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: nothing was left behind
        pass
