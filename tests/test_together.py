"""Models profiled together (MA's run_config_profile_models_concurrently_enable): one search over
both models' knobs, a variant of each loaded at once and driven by its own load at the same time,
ranked by each model's objectives weighted by its weighting."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_profile import EXAMPLES, profile, read_csv, results

from analyzer.config.profile_config import ModelSpec, ProfileConfigError, load_profile_config
from analyzer.results.measurement import Measurement
from analyzer.results.ranking import ConfigResult, Ranker
from analyzer.results.together import combine_parts, joint_spec, per_model

# each execution sleeps (whatever the batch) and logs when it ran, so the test can see that the
# two models were served at the same time
TIMED = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        time.sleep(SLEEP)
        with open(LOG, "a") as log:
            log.write(f"{start} {time.time()}\\n")
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return out
'''


def _repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name, sleep in (("fast", 0.004), ("slow", 0.012)):
        shutil.copytree(EXAMPLES / "add_sub", repo / name)
        config = (repo / name / "config.pbtxt").read_text().replace('"add_sub"', f'"{name}"')
        (repo / name / "config.pbtxt").write_text(config.replace("max_batch_size: 8",
                                                                 "max_batch_size: 1"))
        code = TIMED.replace("SLEEP", str(sleep)).replace("LOG", repr(str(tmp_path / name)))
        (repo / name / "1" / "model.py").write_text(code)
    return repo


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "160"})  # fmt: skip


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds during which executions of both models ran."""
    total = 0.0
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] < start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += max(0.0, min(end, b[k][1]) - max(start, b[k][0]))
            k += 1
    return total


def test_two_models_are_searched_loaded_and_measured_together(tmp_path):
    repo = _repository(tmp_path)
    (tmp_path / "SPACE").write_text("dynamic_batching: {max_queue_delay_microseconds: [0]}\n")
    run = profile(tmp_path, "--model-repository", str(repo), "--profile-models", "fast,slow",
                  "--run-config-profile-models-concurrently-enable",
                  "--output-model-repository-path", "OUT", "--export-path", "EXP",
                  "--search-space", "SPACE", "--run-config-search-max-concurrency", "2",
                  "--run-config-search-max-model-batch-size", "2",
                  "--run-config-search-max-instance-count", "2", "--num-configs-per-model", "1",
                  "--client-protocol", "http", "--measurement-interval", "300",
                  "--max-trials", "3", "--final-rounds", "2")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    document = results(tmp_path / "EXP")
    assert [m["name"] for m in document["models"]] == ["fast,slow"]
    model = document["models"][0]
    assert set(model["objectives"]) == {"fast:perf_throughput", "slow:perf_throughput"}
    measured = [c for c in model["configs"] if c["measurements"]]
    assert len(measured) >= 3
    for config in measured:
        fast, slow = config["name"].split(",")
        assert fast.startswith("fast_config_") and slow.startswith("slow_config_")
        assert config["description"]["composing_configs"] == [fast, slow]
        assert (tmp_path / "OUT" / fast / "config.pbtxt").exists()
        for m in config["measurements"]:
            each = m["metrics"]["fast:perf_throughput"], m["metrics"]["slow:perf_throughput"]
            assert min(each) > 0
            assert math.isclose(m["metrics"]["perf_throughput"], sum(each), rel_tol=1e-9)
    default = next(c for c in model["configs"] if c["is_default"])
    assert default["name"] == "fast_config_default,slow_config_default"
    # both models ran at the same time: their executions overlap for much of the run
    spans = {name: sorted(tuple(map(float, line.split()))
                          for line in (tmp_path / name).read_text().splitlines())
             for name in ("fast", "slow")}  # fmt: skip
    busy_slow = sum(end - start for start, end in spans["slow"])
    assert _overlap(spans["fast"], spans["slow"]) > 0.3 * busy_slow
    # MA's summary: the whole server's figure, each model's in parentheses
    words = " ".join(run.stdout.split())
    assert "infer/s at c=" in words and "(fast " in words and ", slow " in words
    rows = read_csv(tmp_path / "EXP" / "results" / "metrics-model-inference.csv")
    assert rows and {r["Model"] for r in rows} == {"fast,slow"}
    # the recommendation is ready to serve: each model's variant under its own name
    export = _command(tmp_path, "export", "-e", "EXP", "--format", "triton",
                             "--output", "DEPLOY")  # fmt: skip
    assert export.returncode == 0, export.stdout + export.stderr
    assert sorted(p.name for p in (tmp_path / "DEPLOY").iterdir()) == ["fast", "slow"]
    assert 'name: "fast"' in (tmp_path / "DEPLOY" / "fast" / "config.pbtxt").read_text()


def _point(name: str, fast: float, slow: float) -> ConfigResult:
    parts = {}
    for model, throughput in (("fast", fast), ("slow", slow)):
        parts[model] = Measurement(model, f"{model}_x", "concurrency", 4, 1,
                                   {"perf_throughput": throughput, "perf_latency_p99": 5.0})
    result = ConfigResult("fast,slow", name, {}, {}, "", "")
    result.measurements.append(combine_parts(parts, "fast,slow", name))
    return result


def test_the_joint_ranking_weighs_each_models_gain_not_the_total():
    """MA's multi-model comparison: each model's relative gain, weighted by its weighting. With
    equal weights, doubling the slow model beats 25% more of the fast one, although the total
    falls; weighted 10:1 for the fast model, the total's winner wins."""
    lopsided, balanced = _point("a", 1000, 10), _point("b", 800, 20)
    assert per_model(lopsided.measurements[0], "perf_throughput") == {"fast": 1000, "slow": 10}
    specs = [ModelSpec("fast", objectives={"perf_throughput": 1}),
             ModelSpec("slow", objectives={"perf_throughput": 1})]
    spec = joint_spec(specs)
    ranked = Ranker(spec.objectives, spec.constraints).rank([lopsided, balanced])
    assert [r.name for r in ranked] == ["b", "a"]
    specs[0].weighting = 10.0
    spec = joint_spec(specs)
    ranked = Ranker(spec.objectives, spec.constraints).rank([_point("a", 1000, 10),
                                                             _point("b", 800, 20)])
    assert [r.name for r in ranked] == ["a", "b"]
    # each model's constraints hold for it alone
    specs = [ModelSpec("fast", objectives={"perf_throughput": 1},
                       constraints={"perf_throughput": {"min": 900}}),
             ModelSpec("slow", objectives={"perf_throughput": 1})]
    spec = joint_spec(specs)
    ranked = Ranker(spec.objectives, spec.constraints).rank([_point("a", 1000, 10),
                                                             _point("b", 800, 20)])
    assert [r.name for r in ranked] == ["a", "b"]
    assert ranked[1].violations == ["fast:perf_throughput 800 infer/s < min 900"]


def test_the_settings_of_models_profiled_together(tmp_path):
    repo = ["-m", str(EXAMPLES), "--profile-models", "add_sub,tiny_cnn"]
    config = load_profile_config([*repo, "--run-config-profile-models-concurrently-enable",
                                  "--run-config-search-mode", "brute"], cwd=tmp_path)  # fmt: skip
    assert config.run_config_profile_models_concurrently_enable
    assert any("searched with the quick search" in note for note in config.notes)
    yaml_file = tmp_path / "cfg.yaml"
    yaml_file.write_text(json.dumps({
        "run_config_profile_models_concurrently_enable": True,
        "profile_models": {"add_sub": {"weighting": 3}, "tiny_cnn": {}}}))
    config = load_profile_config(["-m", str(EXAMPLES), "-f", str(yaml_file)], cwd=tmp_path)
    assert [m.weighting for m in config.models] == [3.0, 1.0]
    assert not any("weighting" in note for note in config.notes)
    yaml_file.write_text(json.dumps({"profile_models": {"add_sub": {"weighting": 0}}}))
    with pytest.raises(ProfileConfigError, match="add_sub.weighting is 0; expected a number > 0"):
        load_profile_config(["-m", str(EXAMPLES), "-f", str(yaml_file)], cwd=tmp_path)
