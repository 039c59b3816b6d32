"""NVIDIA Model Analyzer's `plots/` folder, written beside our reports: the same plots as PNG
files, named and laid out as MA lays them out, so the scripts and dashboards of MA users that
collect `EXPORT_PATH/plots/...` keep working.

- `plots/simple/<model>/<plot>.png`: the summary's plots, one line per top config (and the
  default); MA's preset per `-m/--mode` (online: throughput vs p99 and GPU memory vs p99, the
  memory plot as RAM vs p99 when no GPU was sampled; offline: throughput vs client batch size).
- `plots/simple/Best Configs Across All Models/`: the same over `num_top_model_configs`.
- `plots/detailed/<config>/latency_breakdown.png` for each config given a detailed report, and
  `plots/simple/<config>/<plot>.png`: the report's `plots` (MA's report keys `plots` and
  `report_model_configs: {<config>: {plots: ...}}`), GPU plots left out where no GPU was sampled.

The names, titles and axes of the presets are MA 1.58's (`config_defaults.py`); the drawing is
ours, with a 95% interval on throughput as everywhere in our reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import AnalyzerError
from analyzer.fsutil import atomic_write_bytes
from analyzer.metrics import BY_TAG
from analyzer.report import plots

TOP_ACROSS_MODELS = "Best Configs Across All Models"  # MA's folder name for num_top_model_configs


class PlotSpecError(AnalyzerError):
    """A `plots` entry that cannot be drawn; the message names the plot, the field and value."""


@dataclass(frozen=True)
class PlotSpec:
    """One of MA's plot entries: `<name>: {title, x_axis, y_axis, monotonic}`; monotonic keeps
    only the points that improve on every point left of them (a throughput-latency curve)."""

    name: str
    title: str
    x_axis: str
    y_axis: str
    monotonic: bool = False


_P99 = "perf_latency_p99"
SUMMARY_PLOTS = {
    "online": (PlotSpec("throughput_v_latency", "Throughput vs. Latency", _P99,
                        "perf_throughput", True),
               PlotSpec("gpu_mem_v_latency", "GPU Memory vs. Latency", _P99, "gpu_used_memory")),
    "offline": (PlotSpec("through_v_batch_size", "Throughput vs. Batch Size", "batch_size",
                         "perf_throughput"),),
}  # fmt: skip
CPU_MEMORY_PLOT = PlotSpec("cpu_mem_v_latency", "CPU Memory vs. Latency", _P99, "cpu_used_ram")
REPORT_PLOTS = {
    "online": (PlotSpec("gpu_mem_v_latency", "GPU Memory vs. Latency", _P99, "gpu_used_memory"),
               PlotSpec("gpu_util_v_latency", "GPU Utilization vs. Latency", _P99,
                        "gpu_utilization"),
               PlotSpec("cpu_mem_v_latency", "RAM Usage vs. Latency", _P99, "cpu_used_ram"),
               PlotSpec("gpu_power_v_latency", "GPU Power vs. Latency", _P99, "gpu_power_usage")),
    "offline": (PlotSpec("throughput_v_batch_size", "Throughput vs. Batch Size", "batch_size",
                         "perf_throughput"),
                PlotSpec("latency_v_batch_size", "p99 Latency vs. Batch Size", "batch_size",
                         _P99)),
}  # fmt: skip

# perf_analyzer keys MA plots by (its spelling with "_"), and what a measurement calls them
LOAD_AXES = {"batch_size": "batch_size", "concurrency_range": "concurrency",
             "request_rate_range": "request_rate"}  # fmt: skip
_FIELDS = ("title", "x_axis", "y_axis", "monotonic")


def axes() -> list[str]:
    """Every name a plot axis may have: the metrics with a column header, and MA's load keys."""
    return sorted([*LOAD_AXES, *(t for t, m in BY_TAG.items() if m.header)])


def parse_plots(value: Any, where: str) -> tuple[PlotSpec, ...]:
    """MA's `plots` value (a mapping of plot names, or a list of such mappings), checked whole
    before anything is drawn."""
    entries: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list) and all(isinstance(item, dict) for item in value):
        entries = [pair for item in value for pair in item.items()]
    elif value is not None:
        raise PlotSpecError(f"{where}: 'plots' must map plot names to {{title, x_axis, y_axis, "
                            f"monotonic}}, got {value!r}")  # fmt: skip
    known = axes()
    specs = []
    for name, fields in entries:
        if not isinstance(fields, dict):
            raise PlotSpecError(f"{where}: plot '{name}' must be a mapping of "
                                f"{', '.join(_FIELDS)}, got {fields!r}")  # fmt: skip
        extra = [k for k in fields if k not in _FIELDS]
        if extra:
            raise PlotSpecError(f"{where}: plot '{name}' has unknown field '{extra[0]}' "
                                f"(fields: {', '.join(_FIELDS)})")  # fmt: skip
        for field in ("x_axis", "y_axis"):
            axis = fields.get(field)
            if axis not in known:
                raise PlotSpecError(f"{where}: plot '{name}' {field} '{axis}' is not a metric "
                                    f"or load key (known: {', '.join(known)})")  # fmt: skip
        monotonic = fields.get("monotonic", False)
        if not isinstance(monotonic, bool):
            raise PlotSpecError(f"{where}: plot '{name}' monotonic must be true or false, "
                                f"got {monotonic!r}")  # fmt: skip
        specs.append(PlotSpec(str(name), str(fields.get("title") or name), fields["x_axis"],
                              fields["y_axis"], monotonic))  # fmt: skip
    return tuple(specs)


def _value(point: dict[str, Any], axis: str) -> float | None:
    load = LOAD_AXES.get(axis)
    if load == "batch_size":
        return float(point["batch_size"])
    if load is not None:
        return float(point["value"]) if point["load"] == load else None
    value = point["metrics"].get(axis)
    return None if value is None else float(value)


def _header(axis: str) -> str:
    return axis.replace("_", " ").title() if axis in LOAD_AXES else BY_TAG[axis].header


def _gpu_sampled(configs: list[dict[str, Any]]) -> bool:
    return any("gpu_used_memory" in m["metrics"] for c in configs for m in c["measurements"])


def _for_machine(specs: tuple[PlotSpec, ...], configs: list[dict[str, Any]],
                 swap: bool) -> list[PlotSpec]:  # fmt: skip
    """MA's rule for runs without a GPU: the summary's GPU memory plot becomes RAM vs p99
    (`swap`), a detailed report's GPU plots are left out."""
    if _gpu_sampled(configs):
        return list(specs)
    out: list[PlotSpec] = []
    for spec in specs:
        gpu = spec.x_axis.startswith("gpu_") or spec.y_axis.startswith("gpu_")
        if not gpu:
            out.append(spec)
        elif swap and spec.y_axis == "gpu_used_memory" and CPU_MEMORY_PLOT not in out:
            out.append(CPU_MEMORY_PLOT)
    return out


def simple_plot(spec: PlotSpec, configs: list[dict[str, Any]],
                constraints: dict[str, dict[str, float]]) -> bytes:  # fmt: skip
    """One line per config over its measured points, sorted by x; a dashed line per constraint
    on either axis; throughput's 95% interval as error bars."""
    plt = plots.plt
    with plt.rc_context(plots.STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for config in configs:
            pairs = [(x, y, m) for m in config["measurements"]
                     if (x := _value(m, spec.x_axis)) is not None
                     and (y := _value(m, spec.y_axis)) is not None]  # fmt: skip
            pairs.sort(key=lambda p: (p[0], p[1]))
            if spec.monotonic:
                kept = pairs[:1]
                for pair in pairs[1:]:
                    if pair[1] > kept[-1][1]:
                        kept.append(pair)
                pairs = kept
            if not pairs:
                continue
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            errors = plots.errors([p[2] for p in pairs]) if spec.y_axis == "perf_throughput" \
                else None  # fmt: skip
            ax.errorbar(xs, ys, yerr=errors, fmt="-o", ms=3, lw=1.5, elinewidth=1, capsize=2,
                        label=config["name"])  # fmt: skip
        for axis, draw in ((spec.x_axis, ax.axvline), (spec.y_axis, ax.axhline)):
            for bound in constraints.get(axis, {}).values():
                draw(bound, ls="--", lw=1, color=plots.FRONT,
                     label=f"Target {_header(axis).rsplit(' ', 1)[0]}")
        ax.set_xlabel(_header(spec.x_axis))
        ax.set_ylabel(_header(spec.y_axis))
        ax.set_title(spec.title + (" (bars: 95% CI)" if spec.y_axis == "perf_throughput" else ""))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, frameon=False)
        return plots.png(fig)


def _write(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    atomic_write_bytes(path, data)
    return path


def write_summary_plots(export_path: Path, key: str, configs: list[dict[str, Any]],
                        constraints: dict[str, dict[str, float]],
                        mode: str) -> list[Path]:  # fmt: skip
    """`plots/simple/<key>/`: the mode's preset over the summary's configs."""
    folder = export_path / "plots" / "simple" / key
    return [_write(folder, spec.name, simple_plot(spec, configs, constraints))
            for spec in _for_machine(SUMMARY_PLOTS[mode], configs, swap=True)]  # fmt: skip


def write_detailed_plots(export_path: Path, config: dict[str, Any],
                         specs: tuple[PlotSpec, ...], breakdown: bytes) -> list[Path]:  # fmt: skip
    """`plots/detailed/<config>/latency_breakdown.png` (`breakdown`, drawn once for it and the
    detailed report) and `plots/simple/<config>/<plot>.png`."""
    name = config["name"]
    written = [_write(export_path / "plots" / "detailed" / name, "latency_breakdown", breakdown)]
    for spec in _for_machine(specs, [config], swap=False):
        written.append(_write(export_path / "plots" / "simple" / name, spec.name,
                              simple_plot(spec, [config], {})))  # fmt: skip
    return written
