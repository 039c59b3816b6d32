"""NVML in one place: open it (or say in one phrase why there is none), list the GPUs by index
and UUID, read one of them. Every GPU reader of the project (the profile's sampler, the worker's
Prometheus metrics, the machine description, the worker's GPU count) goes through here, so a
machine without a GPU, a driver or nvidia-ml-py answers the same way everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Device:
    index: int
    uuid: str
    name: str
    handle: Any


class Nvml:
    """An NVML session: `devices` is empty and `reason` says why when there is no usable GPU."""

    def __init__(self) -> None:
        self.lib: Any = None
        self.reason = ""
        self.devices: list[Device] = []

    @classmethod
    def open(cls) -> Nvml:
        nvml = cls()
        try:
            import pynvml
        except ImportError:
            nvml.reason = "no GPU: nvidia-ml-py (pynvml) is not installed"
            return nvml
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            nvml.reason = f"no GPU: NVML is not available ({exc})"
            return nvml
        nvml.lib = pynvml
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                nvml.devices.append(Device(index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                                           _text(pynvml.nvmlDeviceGetName(handle)), handle))
        except Exception as exc:  # noqa: BLE001 - a driver that cannot list its devices
            nvml.reason = f"no GPU: NVML could not list devices ({exc})"
            nvml.devices = []
        if not nvml.devices and not nvml.reason:
            nvml.reason = "no GPU: NVML found no devices"
        return nvml

    def pick(self, wanted: list[str]) -> list[Device]:
        """The devices named by index or UUID, in that order (all for [] or ['all']); raises
        KeyError with the name that matches none."""
        if not wanted or wanted == ["all"]:
            return list(self.devices)
        picked = []
        for key in wanted:
            match = next((d for d in self.devices if key in (str(d.index), d.uuid)), None)
            if match is None:
                raise KeyError(key)
            picked.append(match)
        return picked

    def driver_version(self) -> str:
        return _text(self.lib.nvmlSystemGetDriverVersion()) if self.lib is not None else ""

    # ---- readings of one device (bytes, percent, watts, joules); errors are the caller's --------
    def memory(self, device: Device) -> tuple[int, int]:
        """(used, total) in bytes."""
        info = self.lib.nvmlDeviceGetMemoryInfo(device.handle)
        return int(info.used), int(info.total)

    def utilization_pct(self, device: Device) -> float:
        return float(self.lib.nvmlDeviceGetUtilizationRates(device.handle).gpu)

    def power_w(self, device: Device) -> float:
        return self.lib.nvmlDeviceGetPowerUsage(device.handle) / 1000.0

    def power_limit_w(self, device: Device) -> float:
        return self.lib.nvmlDeviceGetEnforcedPowerLimit(device.handle) / 1000.0

    def energy_j(self, device: Device) -> float:
        return self.lib.nvmlDeviceGetTotalEnergyConsumption(device.handle) / 1000.0

    def close(self) -> None:
        if self.lib is not None:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down: nothing left to do about it
                pass
            self.lib = None
            self.devices = []

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
