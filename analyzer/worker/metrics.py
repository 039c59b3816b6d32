"""Prometheus text on the metrics port, with Triton's metric names and label sets.

Written by hand rather than with prometheus_client: perf_analyzer's `--collect-metrics` parser wants
plain decimal numbers and Triton's exact names (no `_total`/`_created` suffixes). The endpoint runs
on its own thread and event loop, so a scrape never waits behind inference work and a slow scrape
(NVML can take milliseconds per GPU) never delays a response.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import psutil

from analyzer.monitor.nvml import Nvml
from analyzer.worker.custom_metrics import REGISTRY, escape_label
from analyzer.worker.http_message import HttpRequest, HttpResponse, Respond, error_response
from analyzer.worker.http_server import start_http_server
from analyzer.worker.limits import Limits
from analyzer.worker.model import ModelVersion

if TYPE_CHECKING:
    from analyzer.worker.ensemble import EnsembleVersion

log = logging.getLogger(__name__)

# Triton's metric families, one a line: name, type, help; each group in the order a scrape writes it
_FAMILY_TABLE = """
nv_inference_request_success counter Number of successful inference requests
nv_inference_request_failure counter Number of failed inference requests
nv_inference_count counter Number of inferences performed
nv_inference_exec_count counter Number of model executions
nv_inference_request_duration_us counter Cumulative request duration in microseconds
nv_inference_queue_duration_us counter Cumulative queuing duration in microseconds
nv_inference_compute_input_duration_us counter Cumulative compute input duration in microseconds
nv_inference_compute_infer_duration_us counter Cumulative compute infer duration in microseconds
nv_inference_compute_output_duration_us counter Cumulative compute output duration in microseconds
nv_inference_pending_request_count gauge Pending requests awaiting execution per model
nv_cpu_utilization gauge CPU utilization rate [0.0 - 1.0]
nv_cpu_memory_total_bytes gauge CPU total memory (RAM), in bytes
nv_cpu_memory_used_bytes gauge CPU used memory (RAM), in bytes
nv_gpu_utilization gauge GPU utilization rate [0.0 - 1.0)
nv_gpu_memory_total_bytes gauge GPU total memory, in bytes
nv_gpu_memory_used_bytes gauge GPU used memory, in bytes
nv_gpu_power_usage gauge GPU power usage in watts
nv_gpu_power_limit gauge GPU power management limit in watts
nv_energy_consumption counter GPU energy consumption in joules since the server started
"""
_FAMILIES = {
    name: (kind, help_text)
    for name, kind, help_text in (line.split(" ", 2) for line in _FAMILY_TABLE.split("\n") if line)
}
# the values of _model_values and of _gpu_lines' rows are in these orders
_MODEL_FAMILIES = [name for name in _FAMILIES if name.startswith("nv_inference_")]
_GPU_FAMILIES = [name for name in _FAMILIES if name.startswith(("nv_gpu_", "nv_energy_"))]


def _family(name: str, samples: Iterable[str]) -> list[str]:
    """One family in the text format: its HELP and TYPE lines, then `name` + each sample."""
    kind, help_text = _FAMILIES[name]
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *(name + s for s in samples)]


def _model_values(model: ModelVersion | EnsembleVersion) -> list[int]:
    s = model.stats.as_dict()
    d = s["inference_stats"]
    return [
        d["success"]["count"],
        d["fail"]["count"],
        s["inference_count"],
        s["execution_count"],
        (d["success"]["ns"] + d["fail"]["ns"]) // 1000,
        d["queue"]["ns"] // 1000,
        d["compute_input"]["ns"] // 1000,
        d["compute_infer"]["ns"] // 1000,
        d["compute_output"]["ns"] // 1000,
        model.pending,
    ]


class HostMetrics:
    """The CPU and GPU families, as Triton's --allow-cpu-metrics / --allow-gpu-metrics and
    --metrics-interval-ms ask: each family on or off, and read at most once an interval (the
    last reading served between; 0, the default here: read at every scrape)."""

    def __init__(self, cpu: bool = True, gpu: bool = True, interval_ms: int = 0) -> None:
        self.cpu, self.gpu, self.interval_ns = cpu, gpu, interval_ms * 1_000_000
        self._lines: list[str] = []
        self._at = -1
        self._lock = threading.Lock()

    def lines(self) -> list[str]:
        with self._lock:
            now = time.monotonic_ns()
            if self._at < 0 or not self.interval_ns or now - self._at >= self.interval_ns:
                self._lines = (_cpu_lines() if self.cpu else []) + (
                    _gpu_lines() if self.gpu else [])
                self._at = now
            return self._lines


def render_metrics(models: Sequence[ModelVersion | EnsembleVersion],
                   host: HostMetrics | None = None) -> str:  # fmt: skip
    lines: list[str] = []
    rows = [
        (f'{{model="{escape_label(m.name)}",version="{m.version}"}} ', _model_values(m))
        for m in models
    ]
    for i, name in enumerate(_MODEL_FAMILIES):
        lines += _family(name, [labels + str(values[i]) for labels, values in rows])
    lines.extend((host or _ALL).lines())
    lines.extend(REGISTRY.lines())  # the python models' own families
    return "\n".join(lines) + "\n"


def _cpu_lines() -> list[str]:
    mem = psutil.virtual_memory()
    util = psutil.cpu_percent(interval=None) / 100.0
    return [
        *_family("nv_cpu_utilization", [f" {util:.6f}"]),
        *_family("nv_cpu_memory_total_bytes", [f" {mem.total}"]),
        *_family("nv_cpu_memory_used_bytes", [f" {mem.total - mem.available}"]),
    ]


class _Nvml:
    """NVML, opened once per process on the first scrape; no GPU or no driver: no lines."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nvml: Nvml | None = None

    def start(self) -> Nvml | None:
        with self.lock:
            if self.nvml is None:
                self.nvml = Nvml.open()
                if not self.nvml.devices:
                    log.info("no GPU metrics: %s", self.nvml.reason)
                    self.nvml.close()
        return self.nvml if self.nvml.devices else None


_nvml = _Nvml()
_ALL = HostMetrics()


def _gpu_lines() -> list[str]:
    """nv_gpu_* per GPU through NVML; nothing at all on a machine without one."""
    nv = _nvml.start()
    if nv is None:
        return []
    rows = []
    for d in nv.devices:
        mem = _try_obj(partial(nv.memory, d))  # each called here, with this d
        util = _try(partial(nv.utilization_pct, d)) / 100.0
        power = _try(partial(nv.power_w, d))
        limit = _try(partial(nv.power_limit_w, d))
        energy = _try(partial(nv.energy_j, d))
        used, total = mem if mem is not None else (0, 0)
        rows.append((escape_label(d.uuid), [util, total, used, power, limit, energy]))
    lines = []
    for i, name in enumerate(_GPU_FAMILIES):
        lines += _family(name, [f'{{gpu_uuid="{uuid}"}} {vals[i]:.6f}' for uuid, vals in rows])
    return lines


def _try_obj(fn: Callable[[], tuple[int, int]]) -> tuple[int, int] | None:
    try:
        return fn()
    except Exception:
        return None


def _try(fn: Callable[[], float]) -> float:
    try:
        return float(fn())
    except Exception:
        return 0.0


class MetricsServer:
    """The metrics endpoint on its own thread and event loop, off the inference loop."""

    def __init__(
        self, render: Callable[[], str], host: str, port: int, limits: Limits | None = None
    ):
        self.render = render
        self.host, self.port, self.limits = host, port, limits
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.AbstractServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> int:
        """Listen and serve; returns the bound port. Raises OSError if the port is taken."""
        started: dict[str, Any] = {}
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(started, ready), name="metrics", daemon=True
        )
        self.thread.start()
        ready.wait()
        if "error" in started:
            self.thread.join()
            raise started["error"]
        return int(started["port"])

    def _run(self, started: dict[str, Any], ready: threading.Event) -> None:
        loop = self.loop = asyncio.new_event_loop()
        try:
            self.server = loop.run_until_complete(
                start_http_server(self._handle, self.host, self.port, self.limits)
            )
        except OSError as err:
            started["error"] = err
            ready.set()
            loop.close()
            return
        started["port"] = self.server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:  # open scrape connections go with the loop (wait_closed would wait on them)
            self.server.close()
            loop.close()

    def _handle(self, request: HttpRequest, respond: Respond) -> None:
        if request.path.rstrip("/") != "/metrics":
            respond(error_response(404, "only /metrics is served here"))
            return
        text = self.render()
        respond(HttpResponse(200, [text.encode()], content_type="text/plain; version=0.0.4"))

    def stop(self) -> None:
        if self.thread is None or not self.thread.is_alive() or self.loop is None:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
