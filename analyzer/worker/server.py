"""`model-analyzer serve`: the worker process — HTTP, gRPC and metrics endpoints over one manager.

HTTP and gRPC (our own HTTP/2 transport, grpc_server.py) run on the main uvloop event loop,
metrics on their own thread (a scrape must not
wait behind inference work).
Model instances run on their own threads/processes. SIGINT/SIGTERM stop accepting work and
finalize every model, within `exit_timeout_s`: python model processes still busy after two thirds
of it are killed, and at the limit the process exits whatever is left.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import uvloop

from analyzer import __version__
from analyzer.repository.repository import RepositoryError
from analyzer.tls import ServerTls
from analyzer.worker import restrict, sched
from analyzer.worker.http import RestApi
from analyzer.worker.http_message import Handler
from analyzer.worker.http_server import start_http_server
from analyzer.worker.limits import Limits
from analyzer.worker.manager import ModelManager
from analyzer.worker.memory import tune_malloc
from analyzer.worker.metrics import HostMetrics, MetricsServer, render_metrics
from analyzer.worker.shm import SharedMemoryRegistry

if TYPE_CHECKING:
    from analyzer.worker.grpc_server import GrpcServer

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    model_repository: str | list[str]  # tritonserver's flag may be repeated
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    exit_on_error: bool = True
    exit_on_stdin_eof: bool = False  # a lifeline: the launcher holds stdin open while it lives
    limits: Limits = field(default_factory=Limits)
    # opt-in: 'file:' parameters of a load request become a model folder the worker runs
    allow_model_file_uploads: bool = False
    http_restricted_api: list[str] = field(default_factory=list)  # '<api,...>:<header>=<value>'
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    exit_timeout_s: float = 15.0  # Triton's --exit-timeout-secs: SIGTERM to exit, at most
    load_timeout_s: float = 0.0  # --model-load-timeout-secs: a model's load at most (0: no limit)
    # the event loop yields the core to model threads instead of preempting them (sched.py)
    loop_yields: bool = True
    auto_complete: bool = True  # Triton's auto-complete of a model's config by its backend
    # Triton's --allow-cpu-metrics / --allow-gpu-metrics / --metrics-interval-ms (0: each scrape)
    cpu_metrics: bool = True
    gpu_metrics: bool = True
    metrics_interval_ms: int = 0
    grpc_tls: ServerTls | None = None  # tritonserver's --grpc-use-ssl and its files
    strict_readiness: bool = True  # tritonserver's --strict-readiness
    repository_poll_secs: float = 15.0  # poll mode: seconds between looks at the repository


class StartupError(RuntimeError):
    """The worker could not start (bad repository, a model failed to load, a port is taken)."""


class Worker:
    def __init__(self, options: ServeOptions):
        self.options = options
        self.manager = ModelManager(
            options.model_repository,
            options.model_control_mode,
            allow_file_uploads=options.allow_model_file_uploads,
            max_instance_count=options.limits.max_instance_count,
            max_total_instances=options.limits.max_total_instances,
            max_queued_bytes=options.limits.max_queued_bytes,
            auto_complete=options.auto_complete,
            load_timeout_s=options.load_timeout_s,
        )
        self.servers: list[asyncio.AbstractServer] = []
        self.metrics: MetricsServer | None = None
        self.grpc: GrpcServer | None = None
        self.api: RestApi | None = None
        self.ports: dict[str, int] = {}
        self._poller: asyncio.Task[None] | None = None
        # Triton's system shared-memory regions, one registry for both protocols
        self.shm = SharedMemoryRegistry(max_read_bytes=options.limits.max_input_bytes)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.manager.bind_loop(loop)
        opts = self.options
        try:
            http_rules = restrict.build("--http-restricted-api", opts.http_restricted_api)
            grpc_rules = restrict.build("--grpc-restricted-protocol", opts.grpc_restricted_protocol)
        except restrict.RestrictionError as err:
            raise StartupError(str(err)) from None
        _warn_if_exposed(opts, http_rules, grpc_rules)
        try:
            errors = await loop.run_in_executor(None, self.manager.startup, opts.load_models)
        except RepositoryError as err:
            raise StartupError(str(err)) from None
        for line in errors:
            print(f"error: {line}", file=sys.stderr, flush=True)
        if errors and opts.exit_on_error:
            await loop.run_in_executor(None, self.manager.shutdown)
            raise StartupError(f"{len(errors)} model(s) failed to load")
        self.api = RestApi(self.manager, loop, __version__, restrictions=http_rules,
                           shm=self.shm)
        self.api.strict_readiness = opts.strict_readiness
        try:
            if opts.allow_http:
                await self._listen("http", self.api, opts.http_port)
            if opts.allow_metrics:
                host = HostMetrics(opts.cpu_metrics, opts.gpu_metrics, opts.metrics_interval_ms)
                self.metrics = MetricsServer(
                    lambda: render_metrics(self.manager.loaded(), host),
                    opts.host, opts.metrics_port, opts.limits,
                )  # fmt: skip
                self.ports["metrics"] = await loop.run_in_executor(None, self.metrics.start)
            if opts.allow_grpc:
                from analyzer.worker.grpc_server import GrpcServer

                self.grpc = GrpcServer(
                    self.manager, self.api, opts.host, opts.grpc_port,
                    limits=opts.limits, restrictions=grpc_rules,
                    tls=opts.grpc_tls.context() if opts.grpc_tls else None,
                )  # fmt: skip
                self.ports["grpc"] = await self.grpc.start()
        except OSError as err:
            await self.stop()
            raise StartupError(f"cannot listen on {opts.host}: {err.strerror or err}") from None
        if opts.loop_yields:
            sched.batch_policy()
        if opts.model_control_mode == "poll":
            self._poller = asyncio.create_task(self._poll())
        self.api.ready = True

    async def _poll(self) -> None:
        """Triton's poll mode: the repository is looked at every repository_poll_secs."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.options.repository_poll_secs)
            for line in await loop.run_in_executor(None, self.manager.poll):
                print(f"error: {line}", file=sys.stderr, flush=True)

    async def _listen(self, name: str, handler: Handler, port: int) -> None:
        server = await start_http_server(handler, self.options.host, port, self.options.limits)
        self.servers.append(server)
        self.ports[name] = server.sockets[0].getsockname()[1]

    def ready_line(self) -> str:
        models = ", ".join(
            f"{m.name}:{m.version}" for m in sorted(self.manager.loaded(), key=lambda m: m.name)
        )
        ports = " ".join(f"{k}={self.options.host}:{v}" for k, v in self.ports.items())
        return f"model-analyzer serve ready: {ports} models=[{models}]"

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self.api is not None:
            self.api.ready = False
        for server in self.servers:
            server.close()
        if self.metrics is not None:
            self.metrics.stop()
        if self.grpc is not None:
            await self.grpc.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.manager.shutdown)
        self.shm.close()
        for server in self.servers:
            await server.wait_closed()


def _warn_if_exposed(opts: ServeOptions, http_rules: restrict.Restrictions,
                     grpc_rules: restrict.Restrictions) -> None:  # fmt: skip
    """Explicit mode on a non-loopback address lets other machines load and unload models."""
    if opts.model_control_mode != "explicit" or _is_loopback(opts.host):
        return
    guarded = "model-repository" in http_rules.rules and "model-repository" in grpc_rules.rules
    print(
        f"warning: --model-control-mode explicit on {opts.host}: any host that reaches these "
        "ports can load and unload models"
        + ("" if guarded else "; restrict it with --http-restricted-api and "
           "--grpc-restricted-protocol model-repository:<header>=<value>")
        + (" and run uploaded model code (--allow-model-file-uploads=true)"
           if opts.allow_model_file_uploads else ""),
        file=sys.stderr,
        flush=True,
    )


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(options: ServeOptions) -> int:
    worker = Worker(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def request_stop() -> None:  # the deadline runs from here, even while models still load
        _deadline.arm(options.exit_timeout_s)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, request_stop)
    if options.exit_on_stdin_eof:
        def lifeline() -> None:  # returns when whoever holds our stdin is gone
            try:
                while os.read(0, 4096):  # not sys.stdin: its buffer lock breaks the exit
                    pass
            except OSError:  # no usable stdin: as good as closed
                pass
            loop.call_soon_threadsafe(request_stop)

        threading.Thread(target=lifeline, name="stdin-lifeline", daemon=True).start()
    try:
        await worker.start()
    except StartupError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    print(worker.ready_line(), flush=True)
    await stop.wait()
    print("model-analyzer serve: shutting down", flush=True)
    await worker.stop()
    return 0


class _ShutdownDeadline:
    """Bounds shutdown even when a model hangs: a watchdog thread, since the loop may be stuck.

    A hung python `execute` holds its runner, and unload waits on runners; killing the stubs
    ends those calls with an error, so the runners answer their requests and unload goes on.
    """

    def __init__(self) -> None:
        self.done = threading.Event()
        self.armed = False

    def arm(self, limit: float) -> None:
        """Start the clock; a second signal does not restart it."""
        if self.armed:
            return
        self.armed = True
        threading.Thread(
            target=self._run, args=(limit,), name="shutdown-deadline", daemon=True
        ).start()

    def disarm(self) -> None:
        self.done.set()

    def _run(self, limit: float) -> None:
        grace = limit * 2 / 3
        if self.done.wait(grace):
            return
        killed = _kill_stubs()
        if killed:
            print(
                f"model-analyzer serve: {killed} python model process(es) still busy after "
                f"{grace:.0f} s of shutdown were killed",
                file=sys.stderr,
                flush=True,
            )
        if self.done.wait(limit - grace):
            return
        _kill_stubs()
        print(
            f"model-analyzer serve: shutdown took longer than {limit:.0f} s; exiting now",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def _kill_stubs() -> int:
    # only a worker that loaded a python model has imported the backend (and has stubs)
    python = sys.modules.get("analyzer.worker.backends.python")
    return python.kill_all_stubs() if python is not None else 0


_deadline = _ShutdownDeadline()


def serve(options: ServeOptions) -> int:
    """Run the worker until SIGINT/SIGTERM; returns the process exit code."""
    tune_malloc()
    try:
        return uvloop.run(_serve(options))
    finally:
        _deadline.disarm()
