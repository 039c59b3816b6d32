"""`model-analyzer plan` (replicas, resources and cost for a target load under a latency budget)
and `model-analyzer export` (the winner as a Triton repository, or with a KServe
InferenceService the `kserve` package's model class accepts), after a real profile."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from serving import EXAMPLES, start_worker

from analyzer.repository.doctor import check_repository
from analyzer.results.plan import PlanSettings, plan_model

ROOT = Path(__file__).resolve().parent.parent
KSERVE_PYTHON = ROOT / ".venv" / "peers" / "kserve" / "bin" / "python"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """A quick profile of tiny_cnn over gRPC: EXP holds its results, OUT its variants."""
    work = tmp_path_factory.mktemp("plan")
    run = _run("profile", "--model-repository", str(EXAMPLES), "--profile-models", "tiny_cnn",
               "--output-model-repository-path", "OUT", "--export-path", "EXP",
               "--run-config-search-mode", "quick", "--run-config-search-max-instance-count", "1",
               "--run-config-search-max-model-batch-size", "4",
               "--run-config-search-max-concurrency", "4", "--client-protocol", "grpc",
               "--measurement-interval", "300", "--max-trials", "3", "--final-rounds", "0",
               cwd=work)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return work


def _budget(profiled: Path, every_config: bool = False) -> float:
    """A p99 budget (ms) some configs meet and, where their lowest p99s differ, some do not
    (halfway between the lowest and the highest of them), or that every config meets: so that
    which configs are feasible does not depend on how busy this machine was (a fixed budget
    can fail on a loaded host)."""
    results = json.loads((profiled / "EXP" / "results" / "profile_results.json").read_text())
    lowest = [min(m["metrics"]["perf_latency_p99"] for m in c["measurements"])
              for c in results["models"][0]["configs"] if c["measurements"]]  # fmt: skip
    return max(lowest) if every_config else (min(lowest) + max(lowest)) / 2


def test_plan_prints_replicas_per_config(profiled: Path):
    budget = _budget(profiled)
    run = _run("plan", "-e", "EXP", "--target-qps", "20000", "--latency-budget", repr(budget),
               "--cost-per-cpu-hour", "0.05", cwd=profiled)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    plan = json.loads((profiled / "EXP" / "results" / "plan.json").read_text())
    rows = plan["models"]["tiny_cnn"]
    feasible = [r for r in rows if r["feasible"]]
    assert feasible and rows[: len(feasible)] == feasible  # the feasible first
    for row in rows:
        assert row["config"] in run.stdout
    for row in feasible:
        assert row["p99_ms"] <= budget
        assert row["replicas"] == math.ceil(20000 * 1.2 / row["throughput"])
        assert row["cost_per_hour"] == pytest.approx(row["cores"] * 0.05)
    for row in rows[len(feasible):]:
        assert f"no point within the {budget:g} ms budget" in row["note"], row
    assert [r["cost_per_hour"] for r in feasible] == sorted(r["cost_per_hour"] for r in feasible)
    assert f"tiny_cnn: {rows[0]['replicas']} replica(s) of {rows[0]['config']}" in run.stdout
    summary = profiled / "EXP" / "reports" / "summaries" / "tiny_cnn" / "result_summary.html"
    assert 'id="plan-table"' in summary.read_text()


def test_plan_says_how_far_short_a_target_falls(profiled: Path):
    run = _run("plan", "-e", "EXP", "--target-qps", "20000", "--max-replicas", "1",
               cwd=profiled)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no config reaches 20000 infer/s; the closest" in run.stdout
    assert "% short of 20000" in run.stdout
    bad = _run("plan", "-e", "EXP", "--target-qps", "0", cwd=profiled)
    assert bad.returncode == 2 and "--target-qps 0 must be more than 0" in bad.stderr


def test_plan_arithmetic_on_a_config_of_known_figures():
    point = {"load": "concurrency", "value": 8, "metrics": {
        "perf_throughput": 1000.0, "perf_latency_p99": 20.0, "cpu_utilization": 150.0,
        "cpu_used_ram": 512.0}, "gpus": [{"gpu_used_memory": 2048.0}]}  # fmt: skip
    slow = {**point, "metrics": {**point["metrics"], "perf_throughput": 3000.0,
                                 "perf_latency_p99": 80.0}}  # fmt: skip
    model = {"name": "m", "configs": [{
        "name": "m_config_1", "measurements": [point, slow], "best": None,
        "description": {"instance_group": "2:GPU", "instance_count": 2}}]}  # fmt: skip
    settings = PlanSettings(target_qps=5000, latency_budget_ms=50, headroom_pct=20,
                            cost_per_gpu_hour=2.0, cost_per_cpu_hour=0.1)  # fmt: skip
    (row,) = plan_model(model, settings, cores_default=4)
    assert row.throughput == 1000.0  # the faster point breaks the budget
    assert row.replicas == 6  # 5000 x 1.2 / 1000
    assert (row.instances, row.gpus, row.cores) == (12, 6, 12)  # 2 cores: 150% of one, rounded up
    assert row.memory_mb == 6 * 512 and row.gpu_memory_mb == 6 * 2048
    assert row.cost_per_hour == pytest.approx(6 * 2.0 + 12 * 0.1)
    assert row.cost_per_million == pytest.approx(row.cost_per_hour / (5000 * 3600) * 1e6)


def test_a_joint_plan_sizes_the_summed_throughput_and_says_in_what_mix():
    from analyzer.results.plan import mix_text

    point = {"load": "concurrency", "value": 4, "metrics": {
        "perf_throughput": 1000.0, "perf_latency_p99": 20.0, "cpu_utilization": 90.0,
        "a:perf_throughput": 750.0, "b:perf_throughput": 250.0}}  # fmt: skip
    model = {"name": "a,b", "configs": [{
        "name": "a_config_1,b_config_default", "measurements": [point], "best": None,
        "description": {"instance_group": "1:CPU", "instance_count": 1}}]}  # fmt: skip
    (row,) = plan_model(model, PlanSettings(target_qps=2000, headroom_pct=0), 1)
    assert row.replicas == 2 and row.mix == {"a": 0.75, "b": 0.25}
    text = mix_text([row.as_dict()])
    assert "each replica serves every model, its infer/s is their sum" in text
    assert "(a 75%, b 25% for a_config_1,b_config_default)" in text
    alone = {"name": "m", "configs": [{**model["configs"][0], "name": "m_config_1"}]}
    (single,) = plan_model(alone, PlanSettings(target_qps=2000), 1)
    assert single.mix == {} and mix_text([single.as_dict()]) == ""


def test_conservative_plan_sizes_finalists_by_their_intervals():
    point = {"load": "concurrency", "value": 8, "metrics": {
        "perf_throughput": 1000.0, "perf_latency_p99": 20.0, "cpu_utilization": 90.0}}  # fmt: skip
    finalist = {"name": "m_config_1", "measurements": [point], "best": point,
                "description": {"instance_group": "1:CPU", "instance_count": 1},
                "final_comparison": {"perf_throughput": {"estimate": 1000.0, "low": 800.0,
                                                         "high": 1200.0},
                                     "perf_latency_p99": {"estimate": 20.0, "low": 15.0,
                                                          "high": 45.0}}}  # fmt: skip
    lucky = {**finalist, "name": "m_config_2", "final_comparison": None,
             "measurements": [{**point, "metrics": {**point["metrics"],
                                                    "perf_throughput": 1100.0}}]}  # fmt: skip
    model = {"name": "m", "configs": [lucky, finalist]}
    plain = plan_model(model, PlanSettings(target_qps=4000, latency_budget_ms=40), 1)
    assert [(r.config, r.replicas) for r in plain] == [("m_config_1", 5), ("m_config_2", 5)]
    careful = plan_model(model, PlanSettings(target_qps=4000, latency_budget_ms=50,
                                             conservative=True), 1)  # fmt: skip
    first, second = careful
    assert (first.config, first.throughput, first.p99_ms, first.interval) == (
        "m_config_1", 800.0, 45.0, True)
    assert first.replicas == 6  # 4000 x 1.2 / 800, where the point estimate would give 5
    assert second.config == "m_config_2" and "no interval" in second.note  # ranks after
    strict = plan_model(model, PlanSettings(target_qps=4000, latency_budget_ms=40,
                                            conservative=True), 1)  # fmt: skip
    refused = next(r for r in strict if r.config == "m_config_1")
    assert not refused.feasible and "p99 interval reaches 45.0 ms" in refused.note


def test_export_triton_is_a_repository_ready_to_serve(profiled: Path, tmp_path: Path):
    out = tmp_path / "repo"
    run = _run("export", "-e", "EXP", "--format", "triton", "--output", str(out), cwd=profiled)
    assert run.returncode == 0, run.stdout + run.stderr
    config = (out / "tiny_cnn" / "config.pbtxt").read_text()
    assert 'name: "tiny_cnn"' in config
    model_file = out / "tiny_cnn" / "1" / "model.pt"
    assert model_file.is_file() and not model_file.is_symlink()  # real files, ready to upload
    assert check_repository(out) == []  # the doctor finds nothing to fix
    served = start_worker(out)
    try:
        x = np.zeros((1, 3, 32, 32), dtype=np.float32)
        with grpcclient.InferenceServerClient(served.grpc) as client:
            tensor = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            assert client.infer("tiny_cnn", [tensor]).as_numpy("OUTPUT__0").shape == (1, 10)
    finally:
        assert served.stop() == 0
    again = _run("export", "-e", "EXP", "--output", str(out), cwd=profiled)
    assert again.returncode == 2 and "exists and is not an empty folder" in again.stderr
    unused = _run("export", "-e", "EXP", "--output", str(tmp_path / "other"), "--storage-uri",
                  "s3://models/tiny", cwd=profiled)  # fmt: skip
    assert unused.returncode == 2  # it was ignored: the user meant --format kserve
    assert "--storage-uri 's3://models/tiny' is for --format kserve" in unused.stderr
    assert not (tmp_path / "other").exists()


def test_export_kserve_writes_an_inference_service_kserve_accepts(profiled: Path, tmp_path: Path):
    _run("plan", "-e", "EXP", "--target-qps", "20000", "--latency-budget",
         repr(_budget(profiled, every_config=True)), cwd=profiled)  # fmt: skip
    out = tmp_path / "kserve"
    run = _run("export", "-e", "EXP", "--format", "kserve", "--storage-uri",
               "s3://models/tiny", "--output", str(out), cwd=profiled)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "tiny_cnn" / "config.pbtxt").exists()  # the repository, next to the YAML
    service = yaml.safe_load((out / "inferenceservice.yaml").read_text())
    predictor = service["spec"]["predictor"]
    assert service["metadata"]["name"] == "tiny-cnn"
    assert predictor["model"]["modelFormat"] == {"name": "triton"}
    assert predictor["model"]["storageUri"] == "s3://models/tiny"
    assert predictor["model"]["protocolVersion"] == "grpc-v2"  # profiled over gRPC
    assert predictor["model"]["ports"] == [{"name": "h2c", "protocol": "TCP",
                                            "containerPort": 9000}]  # fmt: skip
    plan = json.loads((profiled / "EXP" / "results" / "plan.json").read_text())
    best = plan["models"]["tiny_cnn"]
    winner = service["metadata"]["annotations"]["model-analyzer/config"]
    replicas = next(r["replicas"] for r in best if r["config"] == winner)
    assert predictor["minReplicas"] == predictor["maxReplicas"] == replicas
    assert KSERVE_PYTHON.exists(), "the kserve test peer is missing: run make venv"
    check = subprocess.run([str(KSERVE_PYTHON), "-c", VALIDATE, str(out / SERVICE)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.split() == ["tiny-cnn", "triton", "s3://models/tiny", str(replicas)]


SERVICE = "inferenceservice.yaml"
# In the kserve peer: the YAML built into kserve's own V1beta1InferenceService, field by field
# through the generated classes' attribute maps and types (kserve's models, and kubernetes' for
# metadata, resources and ports). Their setters check required fields; an unknown key or a value
# of the wrong type is refused here too, which kserve's own client would drop without a word.
VALIDATE = """
import re, sys, yaml
import kserve.models as ks
import kubernetes.client.models as kube

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}

def build(value, kind):
    if value is None:
        return None
    inner = re.fullmatch(r"(?:list|List)\\[(.*)\\]", kind)
    if inner:
        return [build(v, inner.group(1)) for v in value]
    inner = re.fullmatch(r"(?:dict\\(str, |Dict\\[str, )(.*)[\\)\\]]", kind)
    if inner:
        return {k: build(v, inner.group(1)) for k, v in value.items()}
    if kind in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[kind]) or (kind != "bool" and value is True):
            raise TypeError(f"{value!r} is not a {kind}")
        return value
    cls = getattr(ks, kind, None) or getattr(kube, kind, None)
    if cls is None:
        return value
    if not isinstance(value, dict):
        raise TypeError(f"{kind} expects a mapping, got {value!r}")
    names = {json: attr for attr, json in cls.attribute_map.items()}
    unknown = set(value) - set(names)
    if unknown:
        raise KeyError(f"{kind} has no field {sorted(unknown)}")
    return cls(**{names[k]: build(v, cls.openapi_types[names[k]]) for k, v in value.items()})

service = build(yaml.safe_load(open(sys.argv[1])), "V1beta1InferenceService")
assert isinstance(service, ks.V1beta1InferenceService)
model = service.spec.predictor.model
print(service.metadata.name, model.model_format.name, model.storage_uri,
      service.spec.predictor.min_replicas)
"""
