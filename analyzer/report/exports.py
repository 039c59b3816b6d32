"""The files a profile run leaves in EXPORT_PATH/results: MA's three CSVs and one results file.

CSV file and column names are NVIDIA Model Analyzer's (metrics-model-inference.csv,
metrics-model-gpu.csv, metrics-server-only.csv; "Throughput (infer/sec)", "p99 Latency (ms)", ...);
`*_output_fields` select columns by MA's tags. profile_results.json holds everything the reports
need, so they can be rebuilt without a model repository or a worker.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.fsutil import atomic_write_text
from analyzer.metrics import METRICS, OUTPUT_FIELDS
from analyzer.report.machine import machine_info
from analyzer.results.measurement import Measurement
from analyzer.results.ranking import ConfigResult, Ranker, top_across_models
from analyzer.search.ledger import redact_url

RESULTS_FILE = "profile_results.json"

Getter = Callable[[ConfigResult, Measurement, Ranker], Any]


def _config_path(r: ConfigResult) -> str:
    """The variant's name; an ensemble's lists its composing variants after it, as MA does
    (`ensemble_config_0: add_sub_config_1, mul_config_0`)."""
    composing = r.description.get("composing_configs")
    if not composing or r.name == ",".join(composing):  # models profiled together: a,b
        return r.name
    return f"{r.name}: {', '.join(composing)}"


def _metric(tag: str, digits: int = 3) -> Getter:
    def get(r: ConfigResult, m: Measurement, ranker: Ranker) -> Any:
        value = m.metric(tag)
        return "" if value is None else round(value, digits)

    return get


# MA's tag -> (header, value)
COLUMNS: dict[str, tuple[str, Getter]] = {
    "model_name": ("Model", lambda r, m, k: r.model),
    "batch_size": ("Batch", lambda r, m, k: m.batch_size),
    "concurrency": ("Concurrency", lambda r, m, k: m.value if m.load == "concurrency" else ""),
    "request_rate": ("Request Rate", lambda r, m, k: m.value if m.load == "request_rate" else ""),
    "model_config_path": ("Model Config Path", lambda r, m, k: _config_path(r)),
    "instance_group": ("Instance Group", lambda r, m, k: r.description["instance_group"]),
    "max_batch_size": ("Max Batch Size", lambda r, m, k: r.description.get(
        "max_batch_size_text", r.description["max_batch_size"])),
    "satisfies_constraints": (
        "Satisfies Constraints", lambda r, m, k: "No" if k.violations(m) else "Yes"),
    # ours, after MA's
    "max_queue_delay_microseconds": (
        "Max Queue Delay (us)", lambda r, m, k: r.description.get(
            "max_queue_delay_text", _or_blank(r.description["max_queue_delay_us"]))),
    "stable": ("Stable", lambda r, m, k: "Yes" if m.stable else "No"),
    "client_saturated": ("Client Saturated", lambda r, m, k: "Yes" if m.client_saturated else "No"),
    "client_bound": ("Client Bound", lambda r, m, k: "Yes" if m.client_bound else "No"),
}  # fmt: skip
COLUMNS.update({m.tag: (m.header, _metric(m.tag, m.digits)) for m in METRICS if m.header})

DEFAULT_INFERENCE_FIELDS = [
    "model_name", "batch_size", "concurrency", "model_config_path", "instance_group",
    "max_batch_size", "satisfies_constraints", "perf_throughput", "perf_latency_p99",
    "perf_latency_p95", "perf_latency_p90", "perf_latency_p50", "perf_latency_avg",
    "perf_server_queue", "perf_server_compute_input", "perf_server_compute_infer",
    "perf_server_compute_output", "perf_client_send_recv", "cpu_used_ram",
    "max_queue_delay_microseconds", "server_avg_batch", "cpu_utilization", "stable",
    "perf_throughput_ci_pct", "effective_concurrency", "client_cpu_pct", "client_bound",
]  # fmt: skip
GPU_HEADERS = {
    "model_name": "Model", "gpu_uuid": "GPU UUID", "batch_size": "Batch",
    "concurrency": "Concurrency", "request_rate": "Request Rate",
    "model_config_path": "Model Config Path", "instance_group": "Instance Group",
    "satisfies_constraints": "Satisfies Constraints",
    **{m.tag: m.header for m in METRICS if m.gpu_table},
}  # fmt: skip
DEFAULT_GPU_FIELDS = [
    "model_name", "gpu_uuid", "batch_size", "concurrency", "model_config_path", "instance_group",
    "satisfies_constraints", "gpu_used_memory", "gpu_utilization", "gpu_power_usage",
]  # fmt: skip
DEFAULT_SERVER_FIELDS = [
    "model_name", "gpu_uuid", "gpu_used_memory", "gpu_utilization", "gpu_power_usage",
]  # fmt: skip


def _or_blank(value: Any) -> Any:
    return "" if value is None else value


def _known(fields: list[str], key: str) -> list[str]:
    """The fields that are columns of the table; the others were noted when the settings were
    read (analyzer.config.profile_config) and are left out."""
    return [tag for tag in fields if tag in OUTPUT_FIELDS[key]]


def _rate_mode(fields: list[str], models) -> list[str]:
    """MA's request-rate tables put Request Rate where Concurrency was."""
    rate = any(m.load == "request_rate" for mo in models for r in mo.results
               for m in r.measurements)  # fmt: skip
    if not rate:
        return fields
    return ["request_rate" if f == "concurrency" else f for f in fields]


def _rows(models) -> list[tuple[ConfigResult, Measurement, Ranker]]:
    """Every measured point, each model's best first (passing points, then by score)."""
    rows = []
    for model in models:
        ranker = Ranker(model.spec.objectives, model.spec.constraints)
        points = [(r, m) for r in model.results for m in r.measurements]
        points.sort(key=lambda p: (bool(ranker.violations(p[1])), -ranker.score(p[1])))
        rows += [(r, m, ranker) for r, m in points]
    return rows


def write_csvs(outcome, results_dir: Path) -> dict[str, Path]:
    c = outcome.config
    results_dir.mkdir(parents=True, exist_ok=True)
    inference_fields = _rate_mode(_known(c.inference_output_fields or DEFAULT_INFERENCE_FIELDS,
                                         "inference_output_fields"), outcome.models)  # fmt: skip
    gpu_fields = _rate_mode(_known(c.gpu_output_fields or DEFAULT_GPU_FIELDS,
                                   "gpu_output_fields"), outcome.models)  # fmt: skip
    server_fields = _known(c.server_output_fields or DEFAULT_SERVER_FIELDS, "server_output_fields")
    rows = _rows(outcome.models)
    paths = {
        "inference": results_dir / c.filename_model_inference,
        "gpu": results_dir / c.filename_model_gpu,
        "server": results_dir / c.filename_server_only,
    }
    inference = [[COLUMNS[t][0] for t in inference_fields]]
    inference += [[COLUMNS[t][1](r, m, ranker) for t in inference_fields] for r, m, ranker in rows]
    gpu_rows = [[GPU_HEADERS[t] for t in gpu_fields]]
    for r, m, ranker in rows:
        for gpu in m.gpus:
            values = {"gpu_uuid": gpu["uuid"]} | {
                k: round(gpu[k], 1)
                for k in ("gpu_used_memory", "gpu_utilization", "gpu_power_usage")
            }
            gpu_rows.append([values[t] if t in values else COLUMNS[t][1](r, m, ranker)
                             for t in gpu_fields])  # fmt: skip
    server = [[GPU_HEADERS[t] for t in server_fields]]
    for gpu in outcome.server_only:
        values = {"model_name": "triton-server", **gpu}
        server.append([_or_blank(values.get(t)) for t in server_fields])
    for key, table in (("inference", inference), ("gpu", gpu_rows), ("server", server)):
        _write_csv(paths[key], table)
    return paths


def _write_csv(path: Path, rows: list[list[Any]]) -> None:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    atomic_write_text(path, text.getvalue())


def _settings(values: dict[str, Any]) -> dict[str, Any]:
    """The settings as stored: a storage URL without its password."""
    if values.get("storage"):
        return {**values, "storage": redact_url(values["storage"])}
    return values


def results_document(outcome) -> dict[str, Any]:
    c = outcome.config
    models = []
    for model in outcome.models:
        configs = []
        for r in model.results:
            configs.append({
                "name": r.name, "rank": r.rank, "is_default": r.is_default, "params": r.params,
                "description": r.description, "path": r.path, "error": r.error,
                "satisfies_constraints": r.satisfies, "violations": r.violations,
                "score": r.score, "pareto_optimal": r.pareto,
                "best": r.best.to_dict() if r.best else None,
                "final_comparison": r.final.to_dict() if r.final else None,
                "measurements": [m.to_dict() for m in r.measurements],
            })  # fmt: skip
        models.append({
            "name": model.spec.name, "error": model.error, "skipped": model.skipped,
            "objectives": model.spec.objectives, "constraints": model.spec.constraints,
            "study": model.study, "pareto_objectives": model.pareto,
            "top": [r.name for r in model.results if r.measurements][: c.num_configs_per_model],
            "final_comparison": model.comparison.to_dict() if model.comparison else None,
            "calibration": model.calibration.to_dict() if model.calibration else None,
            "configs": configs,
        })  # fmt: skip
    return {
        "format": "model-analyzer profile results",
        "version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": _settings(c.values),
        "machine": outcome.machine or machine_info(),
        "instance_kind": outcome.kind,
        "cpu_placement": outcome.placement,
        "stats": {"measured": outcome.measured, "reused": outcome.reused, "shared": outcome.shared,
                  "worker_starts": outcome.worker_starts, "wall_s": outcome.wall_s},
        "server_only": outcome.server_only,
        "top_across_models": [r.name for r in top_across_models(outcome)]
        if c.num_top_model_configs > 0 else [],
        "models": models,
    }  # fmt: skip


def write_results(outcome, results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / RESULTS_FILE
    atomic_write_text(path, json.dumps(results_document(outcome), indent=1, default=str))
    return path
