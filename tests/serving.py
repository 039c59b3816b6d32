"""Start a real `model-analyzer serve` process for a test and always stop it."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
_READY = re.compile(r"model-analyzer serve ready: (.*) models=")


@dataclass
class Served:
    process: subprocess.Popen
    ports: dict[str, int]
    output: list[str] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def python_models(repo: Path, models: dict[str, str], config: str) -> None:
    """One python model folder per name: version 1's model.py, and a config.pbtxt of `config`
    after `name: "<name>" backend: "python"`."""
    for name, code in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}" backend: "python" {config}')


def free_port() -> int:
    """A port free now on 127.0.0.1, for a server that takes its port from its config (MA's).

    Drawn below the kernel's ephemeral range: a port the kernel handed out here could be handed
    to any other bind to port 0 (a worker's, another test run's) before the server this port is
    meant for binds it.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    floor = max(1024, low - 12000)
    draw = random.Random()  # seeded by the OS: concurrent test runs draw apart
    for _ in range(100):
        port = draw.randrange(floor, low) if floor < low else 0  # 0: no room below the range
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port below the ephemeral range after 100 draws")


def start_worker(
    repository: Path,
    *args: str,
    timeout: float = 90,
    cpus: str | None = None,
    source_tree: Path | None = None,
) -> Served:
    """Launch the worker on free ports and wait for its ready line.

    `source_tree`: run the `analyzer` package of another checkout (benchmarks compare commits).
    """
    cmd = [
        sys.executable,
        "-m",
        "analyzer",
        "serve",
        "--model-repository",
        str(repository),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        *args,
    ]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=source_tree or ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1",
             **({"PYTHONPATH": os.pathsep.join(
                 p for p in (str(source_tree), os.environ.get("PYTHONPATH")) if p)}
                if source_tree else {})},
    )
    served = Served(process, {})
    ready = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            served.output.append(line)
            match = _READY.search(line)
            if match and not ready.is_set():
                for item in match.group(1).split():
                    name, _, addr = item.partition("=")
                    served.ports[name] = int(addr.rsplit(":", 1)[1])
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if process.poll() is not None or time.monotonic() > deadline:
            served.stop()
            raise RuntimeError("worker did not start:\n" + "".join(served.output))
    return served
