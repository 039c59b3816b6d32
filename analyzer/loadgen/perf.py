"""A perf_analyzer-style sweep: connect, make the requests, measure each load level in turn.

The same LoadClient (its shard processes and connections) serves the whole sweep, so moving to the
next concurrency or rate costs a warm-up, not a process start.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from analyzer.errors import AnalyzerError
from analyzer.loadgen.client import LoadClient
from analyzer.loadgen.control import ServerError, control_client
from analyzer.loadgen.inputs import InputError, ModelIO, make_requests, model_io
from analyzer.loadgen.measure import Measurer, MeasureSettings, PerfPoint
from analyzer.loadgen.payload import (
    grpc_request,
    grpc_sequence_template,
    grpc_shm_request,
    http_request,
    http_sequence_template,
    http_shm_request,
)
from analyzer.loadgen.sequences import SequenceOptions
from analyzer.loadgen.server_stats import composing_models
from analyzer.loadgen.shm import DEFAULT_OUTPUT_SIZE, SharedTensors
from analyzer.monitor.base import Sampler
from analyzer.monitor.cpu import CpuSampler
from analyzer.monitor.gpu import GpuSampler
from analyzer.tls import ClientTls


@dataclass
class PerfOptions:
    model: str
    url: str = "localhost:8000"
    protocol: str = "http"
    version: str = ""
    concurrency: list[int] = field(default_factory=list)
    request_rates: list[float] = field(default_factory=list)
    distribution: str = "constant"
    batch_size: int = 1
    input_data: str = "random"
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    string_length: int = 128
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    latency_threshold_ms: float = 0.0  # stop the sweep once the (percentile) latency exceeds it
    client_processes: int = 0  # 0: start with one, add one when it saturates, up to the cores
    # perf_analyzer's --max-threads: the most load-generator processes that growing may reach
    # (each sends many requests at once, as each of perf_analyzer's async threads does)
    max_threads: int = 0

    def process_limit(self, cores: int) -> int:
        """How many processes the load generator may grow to on `cores` cores."""
        return min(cores, self.max_threads) if self.max_threads > 0 else cores
    server_pid: int | None = None  # sample this process tree's CPU and memory
    gpus: list[str] = field(default_factory=list)
    monitor_interval_s: float = 0.1
    seed: int = 0
    # how sequences are sent, used when the model has sequence_batching
    sequence: SequenceOptions = field(default_factory=SequenceOptions)
    streaming: bool = False  # gRPC ModelStreamInfer (perf_analyzer's --streaming)
    headers: tuple[tuple[str, str], ...] = ()  # -H: HTTP headers, or gRPC metadata
    ssl: ClientTls | None = None  # perf_analyzer's --ssl-* flags
    shared_memory: str = "none"  # perf_analyzer's --shared-memory: none | system | cuda
    output_shm_size: int = DEFAULT_OUTPUT_SIZE  # --output-shared-memory-size, bytes per output

    @property
    def tls(self) -> ClientTls | None:
        """TLS to the server: gRPC with --ssl-grpc-use-ssl, HTTP with an https:// URL."""
        if self.protocol == "grpc":
            return self.ssl if self.ssl is not None and self.ssl.grpc else None
        return (self.ssl or ClientTls()) if self.url.startswith("https://") else None

    @property
    def mode(self) -> str:
        return "request_rate" if self.request_rates else "concurrency"

    @property
    def values(self) -> list[float]:
        if self.request_rates:
            return list(self.request_rates)
        return [float(c) for c in self.concurrency]


def parse_range(flag: str, text: str, integer: bool) -> list:
    """perf_analyzer's `start[:end[:step]]`, inclusive, linear steps."""
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 3:
            raise ValueError
        kind = int if integer else float
        start = kind(parts[0])
        end = kind(parts[1]) if len(parts) > 1 else start
        step = kind(parts[2]) if len(parts) > 2 else 1
        if start <= 0 or end < start or step <= 0:
            raise ValueError
    except ValueError:
        raise AnalyzerError(
            f"{flag} '{text}' must be start[:end[:step]] with 0 < start <= end and step > 0"
        ) from None
    values, value = [], start
    while value <= end + 1e-9:
        values.append(value)
        value += step
    return values


def sequence_options(options: PerfOptions, config: dict) -> SequenceOptions | None:
    """The sequence settings when the served model's config has sequence_batching."""
    return options.sequence if "sequence_batching" in config else None


def stream_mode(options: PerfOptions, config: dict) -> str | None:
    """"decoupled" for a decoupled model (it answers only on a stream), "stream" when streaming
    is asked, None for unary calls; InputError when streaming is wanted over HTTP."""
    decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
    if not (decoupled or options.streaming):
        return None
    if options.protocol != "grpc":
        why = (f"model '{config.get('name', options.model)}' is decoupled (it may send any "
               "number of responses per request)" if decoupled else "--streaming")  # fmt: skip
        raise InputError(f"{why}: that needs gRPC streaming; use the grpc protocol (-i grpc, "
                         "or client_protocol: grpc)")  # fmt: skip
    return "decoupled" if decoupled else "stream"


def encode_payloads(
    options: PerfOptions, io: ModelIO, sequences: bool = False, decoupled: bool = False
) -> list:
    """The requests, encoded once; for a sequence model, templates each step fills in."""
    requests = make_requests(
        io, options.batch_size, options.input_data, options.shapes, options.string_length,
        options.seed,
    )
    datatypes = {spec.name: spec.datatype for spec in io.inputs}
    if options.protocol == "grpc":
        grpc = grpc_sequence_template if sequences else grpc_request
        return [grpc(io.name, options.version, r, datatypes, decoupled) for r in requests]
    host = options.url.split("://", 1)[-1]
    http = http_sequence_template if sequences else http_request
    return [http(host, io.name, options.version, r, datatypes, options.headers)
            for r in requests]  # fmt: skip


def encode(options: PerfOptions, io: ModelIO, sequence: SequenceOptions | None,
           stream: str | None) -> tuple[list, SharedTensors | None]:  # fmt: skip
    """The requests as the load generator sends them; with --shared-memory system their tensors
    in regions registered with the server (the SharedTensors returned: close it after the load)."""
    decoupled = stream == "decoupled"
    if options.shared_memory == "none":
        return encode_payloads(options, io, sequence is not None, decoupled), None
    if options.shared_memory != "system":
        raise InputError(f"--shared-memory {options.shared_memory}: this load generator makes "
                         "system shared memory only (CUDA shared memory needs a GPU build); use "
                         "system or none")  # fmt: skip
    if options.output_shm_size < 1:
        raise InputError(f"--output-shared-memory-size {options.output_shm_size} must be positive")
    requests = make_requests(io, options.batch_size, options.input_data, options.shapes,
                             options.string_length, options.seed)  # fmt: skip
    datatypes = {spec.name: spec.datatype for spec in io.inputs}
    control = control_client(options.protocol, options.url, io.name, options.version,
                             options.headers, options.tls)  # fmt: skip
    shared = SharedTensors(control, requests, datatypes, io.outputs, options.output_shm_size)
    # a sequence model's steps differ only in their sequence parameters: templates, as without
    # shared memory, whose tensors name the regions
    payloads: list
    if options.protocol == "grpc":
        grpc = grpc_sequence_template if sequence is not None else grpc_shm_request
        payloads = [grpc(io.name, options.version, r, datatypes, decoupled=decoupled,
                         placed=shared.inputs[i], outputs=shared.outputs)
                    for i, r in enumerate(requests)]  # fmt: skip
    else:
        host = options.url.split("://", 1)[-1]
        http = http_sequence_template if sequence is not None else http_shm_request
        payloads = [http(host, io.name, options.version, r, datatypes, headers=options.headers,
                         placed=shared.inputs[i], outputs=shared.outputs)
                    for i, r in enumerate(requests)]  # fmt: skip
    return payloads, shared


def make_samplers(options: PerfOptions) -> dict[str, Sampler]:
    samplers: dict[str, Sampler] = {
        "gpu": GpuSampler(options.gpus or None, options.monitor_interval_s)
    }
    if options.server_pid:
        samplers["cpu"] = CpuSampler(options.server_pid, options.monitor_interval_s)
    return samplers


def run_perf(
    options: PerfOptions, on_start: Callable[[ModelIO, dict], None] | None = None
) -> Iterator[PerfPoint]:
    """Yield one PerfPoint per load level; stops early past the latency threshold."""
    control = control_client(options.protocol, options.url, options.model, options.version,
                             options.headers, options.tls)  # fmt: skip
    samplers: dict[str, Sampler] = {}
    shared: SharedTensors | None = None
    try:
        server = control.server_metadata()
        config = control.model_config()
        io = model_io(control.model_metadata(), config)
        sequence = sequence_options(options, config)
        stream = stream_mode(options, config)
        payloads, shared = encode(options, io, sequence, stream)
        use_stats = "statistics" in server.get("extensions", [])
        if on_start is not None:
            on_start(io, server)
        samplers = make_samplers(options)
        for sampler in samplers.values():
            sampler.start()
        cores = len(os.sched_getaffinity(0))
        auto = options.client_processes <= 0
        with LoadClient(
            options.protocol, options.url, payloads, max(1, options.client_processes),
            options.seed, sequence, stream, options.headers, options.tls,
        ) as client:  # fmt: skip
            measurer = Measurer(
                client, control, io.name, options.version, options.batch_size, options.settings,
                samplers, use_stats, composing_models(config),
            )
            for value in options.values:
                point = measurer.measure(options.mode, value, options.distribution)
                while (auto and point.more_clients_help
                       and len(client.shards) < options.process_limit(cores)):  # fmt: skip
                    client.add_process()
                    point = measurer.measure(options.mode, value, options.distribution)
                yield point
                limit = options.latency_threshold_ms * 1000.0
                if limit and point.stability_latency_us > limit:
                    break
            client.set_idle()
    finally:
        for sampler in samplers.values():
            sampler.stop()
        if shared is not None:
            shared.close()
        control.close()


__all__ = ["PerfOptions", "ServerError", "parse_range", "run_perf"]
