"""GPU sampler over NVML (nvidia-ml-py): memory, utilisation and power of the GPUs in use.

On a machine without a driver, library or device, the result says "no GPU" and why; nothing
raises, so the same measurement code runs on CPU-only machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyzer.monitor.base import Sampler
from analyzer.monitor.nvml import Device, Nvml


@dataclass
class GpuReading:
    uuid: str
    name: str
    memory_used_mb: float
    memory_total_mb: float
    utilization_pct: float
    power_w: float | None


@dataclass
class GpuStats:
    """One GPU over a window: means, and the peak memory (what limits packing models)."""

    uuid: str
    name: str
    memory_used_mb: float  # mean
    memory_used_max_mb: float
    memory_total_mb: float
    utilization_pct: float  # mean
    power_w: float | None  # mean, None when the board does not report it
    samples: int


@dataclass
class GpuSummary:
    available: bool
    reason: str = ""  # why there is no GPU data, when available is False
    gpus: list[GpuStats] = field(default_factory=list)

    @property
    def memory_used_mb(self) -> float:
        """Peak memory summed over the GPUs in use (MA's gpu_used_memory)."""
        return sum(g.memory_used_max_mb for g in self.gpus)

    @property
    def utilization_pct(self) -> float:
        return sum(g.utilization_pct for g in self.gpus) / len(self.gpus) if self.gpus else 0.0

    @property
    def power_w(self) -> float:
        return sum(g.power_w or 0.0 for g in self.gpus)


class GpuSampler(Sampler):
    """Samples the GPUs named by UUID or index (all GPUs when none are named)."""

    name = "gpu"

    def __init__(self, gpus: list[str] | None = None, interval_s: float = 0.1) -> None:
        super().__init__(interval_s)
        self._nvml = Nvml.open()
        self.reason = self._nvml.reason
        self._devices: list[Device] = []
        try:
            self._devices = self._nvml.pick(gpus or []) if self._nvml.devices else []
        except KeyError as missing:
            self.reason = f"no GPU: '{missing.args[0]}' is not a GPU index or UUID on this machine"

    def available(self) -> bool:
        return bool(self._devices)

    def sample(self) -> list[GpuReading] | None:
        nvml = self._nvml
        readings = []
        try:
            for device in self._devices:
                used, total = nvml.memory(device)
                try:
                    power: float | None = nvml.power_w(device)
                except Exception:  # not every board reports power
                    power = None
                readings.append(
                    GpuReading(
                        uuid=device.uuid,
                        name=device.name,
                        memory_used_mb=used / 1e6,
                        memory_total_mb=total / 1e6,
                        utilization_pct=nvml.utilization_pct(device),
                        power_w=power,
                    )
                )
        except Exception:  # a GPU fell off the bus mid-run: skip this sample
            return None
        return readings

    def summary(self, t0: int, t1: int) -> GpuSummary:
        if not self.available():
            return GpuSummary(False, self.reason)
        samples = self.window(t0, t1)
        if not samples:  # a window shorter than the interval: read once now
            now = self.sample()
            samples = [now] if now else []
        if not samples:
            return GpuSummary(False, "no GPU: NVML returned no readings in the window")
        gpus = []
        for index in range(len(samples[0])):
            column = [s[index] for s in samples if len(s) > index]
            powers = [r.power_w for r in column if r.power_w is not None]
            gpus.append(
                GpuStats(
                    uuid=column[0].uuid,
                    name=column[0].name,
                    memory_used_mb=sum(r.memory_used_mb for r in column) / len(column),
                    memory_used_max_mb=max(r.memory_used_mb for r in column),
                    memory_total_mb=column[0].memory_total_mb,
                    utilization_pct=sum(r.utilization_pct for r in column) / len(column),
                    power_w=sum(powers) / len(powers) if powers else None,
                    samples=len(column),
                )
            )
        return GpuSummary(True, "", gpus)

    def close(self) -> None:
        self._nvml.close()
        self._devices = []
