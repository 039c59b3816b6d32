"""What a measurement is asked for and what it yields: MeasureSettings (the stopping rule and its
limits), PerfPoint (one measured load level and how far to trust it) and MeasurementError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analyzer.loadgen.server_stats import ServerBreakdown


@dataclass
class MeasureSettings:
    mode: str = "adaptive"  # | time_windows | count_windows | fixed (one window, no rule)
    window_ms: int = 5000  # perf_analyzer's -p / --measurement-interval
    request_count: int = 50  # --measurement-request-count (count_windows)
    stability_pct: float = 10.0  # -s
    max_trials: int = 10  # -r
    percentile: int | None = None  # --percentile: stabilise and report on this latency
    warmup_ms: int = 250  # adaptive: load runs this long before the window opens
    min_window_ms: int = 1000  # adaptive: shortest window that may be declared stable
    check_ms: int = 250  # adaptive: how often the stopping rule is evaluated
    tick_ms: int = 50  # how often shards are drained
    saturation: float = 0.9  # client CPU share of one core above which it is the bottleneck
    min_in_flight: float = 0.9  # effective concurrency below this share of the asked: client-bound
    max_wait: float = 0.1  # client loop waiting for a CPU longer than this share: client-bound

    @property
    def max_time_ms(self) -> int:
        return self.window_ms * self.max_trials


@dataclass
class PerfPoint:
    """One measured load level: what perf_analyzer reports, plus how much to trust it."""

    mode: str  # concurrency | request_rate
    value: float  # the concurrency or the asked request rate
    batch_size: int
    throughput: float  # inferences/s (requests/s x batch size)
    request_count: int
    error_count: int
    latency_avg_us: float
    latency_std_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    client_send_us: float
    client_recv_us: float
    server: ServerBreakdown | None
    duration_s: float  # length of the window the figures come from
    wall_s: float  # time the point cost, warm-up and unstable windows included
    windows: int
    stable: bool
    sent_rate: float  # requests/s the client sent in the window
    client_cpu_pct: float  # busiest client process, % of one core
    client_processes: int
    client_saturated: bool  # the busiest client process used >= `saturation` of a core
    # mean requests in flight by the client's own clock (Little's law over the window)
    effective_concurrency: float = 0.0
    client_loop_pct: float = 0.0  # the busiest client event loop's time on a CPU, %
    client_wait_pct: float = 0.0  # the same loop's time runnable but waiting for a CPU, %
    client_turnaround_us: float | None = None  # response -> next send on a slot (concurrency)
    client_starved: bool = False  # its loop waited for a CPU more than `max_wait` of the window
    client_bound: bool = False  # saturated, starved of CPU, or < 90% of the asked concurrency
    percentile: int | None = None
    percentile_us: float | None = None
    ci_throughput_pct: float | None = None  # adaptive: 95% CI half-width, % of the mean
    ci_latency_pct: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    monitors: dict[str, Any] = field(default_factory=dict)

    @property
    def more_clients_help(self) -> bool:
        """Client-bound by its own work (not only by a neighbour's): another process can take
        some of it. A client that is only starved would compete with itself for the same CPU."""
        return self.client_saturated or (self.client_bound and not self.client_starved)

    @property
    def stability_latency_us(self) -> float:
        return self.percentile_us if self.percentile_us is not None else self.latency_avg_us

    @property
    def network_us(self) -> float:
        """perf_analyzer's "Network+Server Send/Recv": what the server breakdown leaves over."""
        s = self.server
        inside = 0.0
        if s is not None:
            inside = s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us
        return max(0.0, self.latency_avg_us - self.client_send_us - self.client_recv_us - inside)


class MeasurementError(RuntimeError):
    """The load could not produce a single successful request; the message says why."""
