"""Report plots with matplotlib, as PNG data URIs (the reports are single self-contained files).

matplotlib, not plotly: static images embed in one HTML file without a JavaScript bundle, render
the same in a PDF, and need no network to view. Every axis names its unit; each series is labelled
on the plot where a legend would make the reader hunt.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

WINNER, DEFAULT, OTHER, FRONT = "#1a7f37", "#6e7781", "#c8ccd1", "#cf222e"
UNSTABLE = "#bc4c00"
STYLE = {"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9,
          "axes.spines.top": False, "axes.spines.right": False}  # fmt: skip


def png(fig) -> bytes:
    """The figure as PNG bytes (MA's plots/ files), closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def uri(data: bytes) -> str:
    """PNG bytes as a data URI: the reports are single self-contained files."""
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _uri(fig) -> str:
    return uri(png(fig))


def _points(config: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(config["measurements"], key=lambda m: (m["batch_size"], m["value"]))


def errors(pts: list[dict[str, Any]]) -> list[float]:
    """Each point's throughput error bar: its 95% CI half-width (window-to-window variation)."""
    return [m["metrics"]["perf_throughput"] * m["metrics"].get("perf_throughput_ci_pct", 0.0)
            / 100.0 for m in pts]  # fmt: skip


def _mark_unstable(ax, xs: list[float], ys: list[float], pts: list[dict[str, Any]]) -> bool:
    """Points that never settled within the stability band: an orange cross on the point."""
    bad = [(x, y) for x, y, m in zip(xs, ys, pts, strict=True) if not m.get("stable", True)]
    if bad:
        ax.scatter([b[0] for b in bad], [b[1] for b in bad], s=36, marker="x", color=UNSTABLE,
                   linewidths=1.4, zorder=6)  # fmt: skip
    return bool(bad)


def _unstable_note(ax) -> None:
    ax.annotate("x: point not stable within the band", (0.01, 0.98),
                xycoords="axes fraction", va="top", fontsize=7, color=UNSTABLE)  # fmt: skip


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(p99 latency, throughput) points no other point beats on both (lower latency, higher
    throughput), sorted by latency."""
    front: list[tuple[float, float]] = []
    for latency, throughput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or throughput > front[-1][1]:
            front.append((latency, throughput))
    return front


def throughput_vs_latency(configs: list[dict[str, Any]], winner: str, default: str,
                          budget: float | None) -> str:  # fmt: skip
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        everything = []
        unstable = False
        for config in configs:
            pts = _points(config)
            if not pts:
                continue
            xs = [m["metrics"]["perf_latency_p99"] for m in pts]
            ys = [m["metrics"]["perf_throughput"] for m in pts]
            everything += list(zip(xs, ys, strict=True))
            name = config["name"]
            color, width, z = (
                (WINNER, 2.2, 3) if name == winner else (DEFAULT, 1.8, 2) if name == default
                else (OTHER, 1.0, 1)
            )  # fmt: skip
            ax.plot(xs, ys, "-o", color=color, lw=width, ms=3, zorder=z)
            if name in (winner, default):
                ax.errorbar(xs, ys, yerr=errors(pts), fmt="none", ecolor=color, elinewidth=1,
                            capsize=2, zorder=z)  # fmt: skip
                ax.annotate(name, (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4),
                            color=color, fontsize=8)  # fmt: skip
                unstable |= _mark_unstable(ax, xs, ys, pts)
        if unstable:
            _unstable_note(ax)
        front = pareto_front(everything)
        if front:
            ax.plot([p[0] for p in front], [p[1] for p in front], "--", color=FRONT, lw=1,
                    zorder=4)  # fmt: skip
            ax.scatter([p[0] for p in front], [p[1] for p in front], s=28, facecolors="none",
                       edgecolors=FRONT, zorder=5)  # fmt: skip
            ax.annotate("Pareto front", front[0], textcoords="offset points", xytext=(4, -12),
                        color=FRONT, fontsize=8)  # fmt: skip
        if budget:
            widest = max((p[0] for p in everything), default=0.0)
            if budget <= 1.5 * widest:
                ax.axvline(budget, color=FRONT, lw=0.8, ls=":")
                ax.annotate(f"latency budget {budget:g} ms", (budget, ax.get_ylim()[0]),
                            rotation=90, va="bottom", ha="right", fontsize=7, color=FRONT)
            else:  # far right of every point: say so instead of squashing the data
                ax.annotate(f"latency budget {budget:g} ms (beyond every point)",
                            (0.99, 0.02), xycoords="axes fraction", ha="right", fontsize=7,
                            color=FRONT)
        ax.set_xlabel("p99 latency (ms)")
        ax.set_ylabel("throughput (infer/s)")
        ax.set_title("Throughput vs p99 latency over the load sweep (one line per config; "
                     "bars: 95% CI of each point)")
        return _uri(fig)


def throughput_vs_load(configs: list[dict[str, Any]], title: str) -> str:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        load = "concurrency"
        unstable = False
        for i, config in enumerate(configs):
            pts = _points(config)
            if not pts:
                continue
            load = pts[0]["load"]
            xs = [m["value"] for m in pts]
            ys = [m["metrics"]["perf_throughput"] for m in pts]
            color = WINNER if i == 0 else DEFAULT
            ax.errorbar(xs, ys, yerr=errors(pts), fmt="-o", color=color, ms=3, lw=2,
                        elinewidth=1, capsize=2)  # fmt: skip
            unstable |= _mark_unstable(ax, xs, ys, pts)
            ax.annotate(config["name"], (xs[-1], ys[-1]), textcoords="offset points",
                        xytext=(4, 4), color=color, fontsize=8)  # fmt: skip
        ax.set_xscale("log", base=2)
        ticks = sorted({m["value"] for c in configs for m in c["measurements"]})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)" if load == "concurrency"
                      else "request rate (requests/s)")  # fmt: skip
        ax.set_ylabel("throughput (infer/s)")
        ax.set_title(title + " (bars: 95% CI of each point)")
        if unstable:
            _unstable_note(ax)
        return _uri(fig)


def throughput_vs_batch_size(configs: list[dict[str, Any]]) -> str:
    """Each config's best throughput at each client batch size it was measured with (MA's
    offline plot); one batch size is one point, and the title says how to sweep more."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        sizes: set[int] = set()
        for i, config in enumerate(configs):
            best: dict[int, float] = {}
            for m in config["measurements"]:
                size = int(m["batch_size"])
                best[size] = max(best.get(size, 0.0), m["metrics"]["perf_throughput"])
            if not best:
                continue
            xs = sorted(best)
            sizes.update(xs)
            color = WINNER if i == 0 else DEFAULT
            ax.plot(xs, [best[x] for x in xs], "-o", color=color, ms=4, lw=2)
            ax.annotate(config["name"], (xs[-1], best[xs[-1]]), textcoords="offset points",
                        xytext=(4, 4), color=color, fontsize=8)  # fmt: skip
        ticks = sorted(sizes)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("client batch size")
        ax.set_ylabel("best throughput (infer/s)")
        ax.set_title("Throughput vs client batch size" + (
            " (one batch size measured: --batch-sizes sweeps more)" if len(ticks) < 2 else ""))
        return _uri(fig)


def final_comparison(configs: list[dict[str, Any]], comparison: dict[str, Any]) -> str:
    """The finalists' throughput and p99 over the final rounds, with 95% intervals: overlapping
    bars are what "tied within noise" looks like."""
    finals = [c for c in configs if c.get("final_comparison")]
    finals.sort(key=lambda c: -c["final_comparison"]["perf_throughput"]["estimate"])
    recommended = comparison.get("recommended", "")
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(7.5, 0.45 * len(finals) + 1.4), sharey=True)
        ys = list(range(len(finals)))[::-1]
        for ax, tag, label in ((axes[0], "perf_throughput", "throughput (infer/s)"),
                               (axes[1], "perf_latency_p99", "p99 latency (ms)")):  # fmt: skip
            for y, c in zip(ys, finals, strict=True):
                i = c["final_comparison"][tag]
                color = (WINNER if c["name"] == recommended else DEFAULT if c["is_default"]
                         else OTHER)  # fmt: skip
                ax.errorbar([i["estimate"]], [y], xerr=[[i["estimate"] - i["low"]],
                            [i["high"] - i["estimate"]]], fmt="o", color=color, ms=5,
                            elinewidth=2, capsize=3)  # fmt: skip
            ax.set_xlabel(label)
        labels = [c["name"] + (" (=)" if c["final_comparison"]["tied_with_leader"] else "")
                  for c in finals]  # fmt: skip
        axes[0].set_yticks(ys, labels)
        fig.suptitle(f"Final comparison: {comparison['rounds']} interleaved rounds, 95% "
                     "intervals ((=): tied with the leader within noise)", fontsize=9)  # fmt: skip
        return _uri(fig)


def gpu_memory_vs_throughput(configs: list[dict[str, Any]], winner: str) -> str:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        for config in configs:
            pts = [m for m in _points(config) if "gpu_used_memory" in m["metrics"]]
            if not pts:
                continue
            color = WINNER if config["name"] == winner else OTHER
            ax.plot([m["metrics"]["perf_throughput"] for m in pts],
                    [m["metrics"]["gpu_used_memory"] for m in pts], "-o", ms=3, color=color)
        ax.set_xlabel("throughput (infer/s)")
        ax.set_ylabel("GPU memory used (MB)")
        ax.set_title("GPU memory vs throughput")
        return _uri(fig)


BREAKDOWN = (
    ("perf_server_queue", "server queue", "#8250df"),
    ("perf_server_compute_input", "compute input", "#bf8700"),
    ("perf_server_compute_infer", "compute infer", "#1a7f37"),
    ("perf_server_compute_output", "compute output", "#0969da"),
    ("network_other", "network + client", "#c8ccd1"),
)


def breakdown_rows(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Per point: the average latency split into server queue / compute parts / the rest."""
    rows = []
    for m in _points(config):
        metrics = m["metrics"]
        parts = {tag: metrics.get(tag, 0.0) for tag, _, _ in BREAKDOWN[:-1]}
        parts["network_other"] = max(0.0, metrics["perf_latency_avg"] - sum(parts.values()))
        rows.append({"measurement": m, "parts": parts})
    return rows


def latency_breakdown_png(config: dict[str, Any]) -> bytes:
    """One drawing serves both the detailed report (as a data URI) and MA's plots/ file."""
    return png(_latency_breakdown(config))


def _latency_breakdown(config: dict[str, Any]):
    rows = breakdown_rows(config)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        labels = [f"{r['measurement']['value']}" + (f"\nb={r['measurement']['batch_size']}"
                  if r["measurement"]["batch_size"] > 1 else "") for r in rows]  # fmt: skip
        bottom = [0.0] * len(rows)
        for tag, label, color in BREAKDOWN:
            values = [r["parts"][tag] for r in rows]
            ax.bar(labels, values, bottom=bottom, color=color, label=label, width=0.6)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        load = rows[0]["measurement"]["load"] if rows else "concurrency"
        ax.set_xlabel("concurrency" if load == "concurrency" else "request rate (requests/s)")
        ax.set_ylabel("average latency (ms)")
        ax.set_title("Where the time goes, per load point")
        ax.legend(loc="upper left", fontsize=7, frameon=False)
        return fig
