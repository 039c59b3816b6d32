"""`model-analyzer export`: a profile's winner as something to deploy.

`triton`: a model repository ready to upload -- each model's winning config under the model's
own name (`DIR/<model>/config.pbtxt` and its version folders, at the depth Triton reads; the
layout mistake of shared/seeds/000 cannot happen), the composing models an ensemble winner calls
beside it under their variant names. `kserve`: that repository, and next to it
`inferenceservice.yaml`, one `serving.kserve.io/v1beta1` InferenceService per model for KServe's
Triton runtime (`modelFormat: triton`, the storage URI the repository is uploaded to), with the
resources the profile measured for one worker and, after `model-analyzer plan`, the replicas the
plan found. Nothing existing is overwritten: DIR must be new or empty.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from analyzer.config.model_config import ConfigError, load_model_config, write_model_config
from analyzer.errors import AnalyzerError
from analyzer.report.html import load_results
from analyzer.results.plan import read_plan
from analyzer.results.together import SEPARATOR

FORMATS = ("triton", "kserve")
SERVICE_FILE = "inferenceservice.yaml"
# KServe's Triton ClusterServingRuntime serves gRPC on 9000 and HTTP on 8080
KSERVE_GRPC_PORT = 9000


class ExportError(AnalyzerError):
    """What to export, or where, cannot work; the message names the value."""


def export(export_path: Path, fmt: str, output: Path, models: list[str] | None = None,
           storage_uri: str | None = None) -> list[Path]:  # fmt: skip
    """Write the export; the paths written, the repository's model folders first."""
    if fmt not in FORMATS:
        raise ExportError(f"--format '{fmt}' must be one of {', '.join(FORMATS)}")
    if fmt == "kserve" and not storage_uri:
        raise ExportError("--format kserve needs --storage-uri: where the repository will be "
                          "uploaded (s3://..., gs://..., pvc://...)")  # fmt: skip
    if fmt != "kserve" and storage_uri:  # it would be written nowhere: the user meant kserve
        raise ExportError(f"--storage-uri '{storage_uri}' is for --format kserve (the "
                          "InferenceService's storageUri); --format triton writes the repository "
                          "only")  # fmt: skip
    results = load_results(export_path)
    chosen = _models(results, models, export_path)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(f"--output '{output}' exists and is not an empty folder; name a new "
                          "one (nothing is overwritten)")  # fmt: skip
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ExportError(f"--output '{output}' cannot be made: {err.strerror}") from None
    plan = _plan(export_path)
    written: list[Path] = []
    services = []
    for model in chosen:
        winner = _winner(model)
        parts = _together(model["name"], winner)
        if parts:  # models profiled together: each model's variant under its own name
            if fmt == "kserve":
                raise ExportError(f"'{model['name']}' was profiled together (run_config_profile_"
                                  "models_concurrently_enable): export it with --format triton, "
                                  "one repository serving every model")  # fmt: skip
            for name, variant in parts:
                written += _repository_entry(name, variant, output)
            continue
        written += _repository_entry(model["name"], winner, output)
        if fmt == "kserve":
            services.append(inference_service(model["name"], winner, results, storage_uri or "",
                                              plan.get(model["name"], {})))  # fmt: skip
    if services:
        path = output / SERVICE_FILE
        path.write_text(yaml.safe_dump_all(services, sort_keys=False))
        written.append(path)
    return written


def _models(results: dict[str, Any], names: list[str] | None, where: Path) -> list[dict]:
    profiled = {m["name"]: m for m in results["models"]}
    for name in names or []:
        if name not in profiled:
            raise ExportError(f"--model '{name}' was not profiled in '{where}' (profiled: "
                              f"{', '.join(profiled)})")  # fmt: skip
    return [profiled[n] for n in names] if names else list(profiled.values())


def _winner(model: dict[str, Any]) -> dict[str, Any]:
    measured = [c for c in model["configs"] if c["measurements"] and not c["error"]]
    if not measured:
        raise ExportError(f"model '{model['name']}' has no measured config to export"
                          + (f" ({model['error']})" if model.get("error") else ""))
    return min(measured, key=lambda c: c["rank"])


def _together(name: str, winner: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A joint winner of models profiled together: (model, its variant as a winner) for each;
    empty for one model's winner."""
    folders = winner["description"].get("composing_configs") or []
    names = name.split(SEPARATOR)
    if len(names) < 2 or len(names) != len(folders):
        return []
    root = Path(winner["path"])
    return [(model, {"name": folder, "path": str(root / folder)})
            for model, folder in zip(names, folders, strict=True)]  # fmt: skip


def _repository_entry(name: str, winner: dict[str, Any], output: Path) -> list[Path]:
    """DIR/<name>: the winner's folder (its files, links followed) with config name = name; an
    ensemble's composing variants beside it."""
    source = Path(winner["path"])
    try:
        config = load_model_config(source / "config.pbtxt")
    except ConfigError:
        raise ExportError(f"the winner of '{name}', {winner['name']}, is no longer at "
                          f"'{source}' (the output model repository was moved or deleted): "
                          "profile again, or export from where it is") from None  # fmt: skip
    written = []
    steps = [s.model_name for s in config.ensemble_scheduling.step]
    for step in dict.fromkeys(steps):
        part = source.parent / step
        if part.is_dir() and not (output / step).exists():
            _copy(part, output / step)
            written.append(output / step)
    target = output / name
    _copy(source, target, skip_config=True)
    config.name = name
    write_model_config(config, target / "config.pbtxt")
    return [target, *written]


def _copy(source: Path, target: Path, skip_config: bool = False) -> None:
    ignore = ["__pycache__", *(["config.pbtxt"] if skip_config else [])]
    shutil.copytree(source, target, symlinks=False, ignore=shutil.ignore_patterns(*ignore))


def _plan(export_path: Path) -> dict[str, dict[str, Any]]:
    """The plan's rows by model and config (`model-analyzer plan`), when one was made."""
    document = read_plan(export_path)
    if document is None:
        return {}
    target = (document.get("settings") or {}).get("target_qps")
    return {model: {r["config"]: {**r, "target_qps": target} for r in rows}
            for model, rows in (document.get("models") or {}).items()}  # fmt: skip


def inference_service(name: str, winner: dict[str, Any], results: dict[str, Any],
                      storage_uri: str, plan: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A serving.kserve.io/v1beta1 InferenceService for KServe's Triton runtime."""
    best = winner["best"]
    metrics = best["metrics"]
    row = plan.get(winner["name"]) or {}
    per = row.get("per_replica") or {}
    used = metrics.get("cpu_utilization") or 100.0  # % of one core
    cores = int(per.get("cores") or max(1, math.ceil(used / 100)))
    memory_mb = per.get("memory_mb") or metrics.get("cpu_used_ram") or 512.0
    # a quarter above what one worker held when measured, in whole 64 MiB steps
    memory = f"{int(math.ceil(memory_mb * 1.25 / 64) * 64)}Mi"
    resources: dict[str, Any] = {"requests": {"cpu": str(cores), "memory": memory},
                                 "limits": {"cpu": str(cores), "memory": memory}}  # fmt: skip
    if "GPU" in str(winner["description"].get("instance_group", "")):
        gpus = str(int(per.get("gpus") or max(len(best.get("gpus") or []), 1)))
        resources["requests"]["nvidia.com/gpu"] = gpus
        resources["limits"]["nvidia.com/gpu"] = gpus
    model: dict[str, Any] = {"modelFormat": {"name": "triton"}, "storageUri": storage_uri,
                             "resources": resources}  # fmt: skip
    if results["settings"].get("client_protocol") == "grpc":
        model["protocolVersion"] = "grpc-v2"
        model["ports"] = [{"name": "h2c", "protocol": "TCP", "containerPort": KSERVE_GRPC_PORT}]
    else:
        model["protocolVersion"] = "v2"
    replicas = int(row["replicas"]) if row.get("feasible") else 1
    annotations = {
        "model-analyzer/config": winner["name"],
        "model-analyzer/throughput": f"{metrics['perf_throughput']:.1f}",
        "model-analyzer/latency-p99-ms": f"{metrics['perf_latency_p99']:.2f}",
    }
    if row.get("feasible"):
        target = row["target_qps"]
        annotations["model-analyzer/plan"] = f"{replicas} replicas for {target:g} infer/s"
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": dns_name(name), "annotations": annotations},
        "spec": {"predictor": {"minReplicas": replicas, "maxReplicas": replicas,
                               "model": model}},  # fmt: skip
    }


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label) from a model name: tiny_cnn -> tiny-cnn."""
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return text or "model"
