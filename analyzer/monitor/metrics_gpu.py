"""GPU sampler over a server's Prometheus metrics endpoint (remote mode: the GPUs are not ours).

Reads Triton's nv_gpu_* gauges (utilisation 0..1, memory used/total bytes, power W) per
gpu_uuid label -- what `model-analyzer serve` and a real Triton export -- and hands them to the
same window summaries as the NVML sampler. A server without GPU gauges gives "no GPU" and why.
"""

from __future__ import annotations

import re
import urllib.request

from analyzer.monitor.gpu import GpuReading, GpuSampler

_LINE = re.compile(r'^(nv_gpu_\w+)\{([^}]*)\}\s+(\S+)')
_UUID = re.compile(r'gpu_uuid="([^"]*)"')


def parse_gpu_metrics(text: str) -> list[GpuReading]:
    """One reading per GPU from a Prometheus text page (lines without gpu_uuid are skipped)."""
    by_gpu: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        uuid = _UUID.search(match.group(2))
        if uuid is None:
            continue
        try:
            by_gpu.setdefault(uuid.group(1), {})[match.group(1)] = float(match.group(3))
        except ValueError:
            continue
    readings = []
    for uuid, values in by_gpu.items():
        if "nv_gpu_memory_used_bytes" not in values:
            continue
        readings.append(GpuReading(
            uuid=uuid, name=uuid,
            memory_used_mb=values["nv_gpu_memory_used_bytes"] / 1e6,
            memory_total_mb=values.get("nv_gpu_memory_total_bytes", 0.0) / 1e6,
            utilization_pct=100.0 * values.get("nv_gpu_utilization", 0.0),
            power_w=values.get("nv_gpu_power_usage"),
        ))  # fmt: skip
    return readings


class MetricsGpuSampler(GpuSampler):
    name = "gpu"

    def __init__(self, metrics_url: str, gpus: list[str] | None = None,
                 interval_s: float = 0.1) -> None:  # fmt: skip
        self.metrics_url = metrics_url
        self.wanted = [g for g in (gpus or []) if g != "all"]
        super().__init__(None, max(interval_s, 0.5))  # the endpoint refreshes about every 1-2 s

    def _open(self, wanted: list[str]) -> None:
        first = self.sample()
        self._handles = [r.uuid for r in first or []]
        if not self._handles:
            self.reason = f"no GPU: the server's metrics at {self.metrics_url} have no nv_gpu_*"

    def sample(self) -> list[GpuReading] | None:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
                text = response.read().decode(errors="replace")
        except (OSError, ValueError):
            return None
        readings = parse_gpu_metrics(text)
        if self.wanted:
            readings = [r for r in readings if r.uuid in self.wanted]
        return readings or None

    def close(self) -> None:
        self._handles = []
