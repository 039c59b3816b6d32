"""Ensembles (issue 14): the seed's add_sub -> mul pipeline (blog post 004) served as Triton serves
it, its graph checked at load, its steps scheduled by readiness, its statistics as perf_analyzer
reads them."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import EXAMPLES, ROOT, start_worker
from tritonclient.utils import InferenceServerException

from analyzer.config.model_config import load_model_config, parse_model_config
from analyzer.worker.ensemble import check_graph
from analyzer.worker.errors import InferError

SEED = EXAMPLES.parent / "ensemble_repository"
PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"


def _python_model(repo: Path, name: str, code: str, config: str) -> None:
    """A python model folder: version 1's model.py and its config.pbtxt."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(config)


def _infer(module, url: str, model: str, a: np.ndarray, b: np.ndarray, outputs=("OUTPUT",)):
    with module.InferenceServerClient(url) as client:
        inputs = [module.InferInput(n, list(a.shape), "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        wanted = [module.InferRequestedOutput(n) for n in outputs]
        return client.infer(model, inputs, outputs=wanted)


@pytest.fixture(scope="module")
def seed_worker():
    served = start_worker(SEED)
    yield served
    assert served.stop() == 0, "".join(served.output)


@pytest.mark.parametrize("model", ["ensemble", "bls"])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_seed_pipeline_answers_add_sub_then_mul(seed_worker, module, model):
    """The seed's own files, unchanged: repeated input/output blocks, no max_batch_size, and a
    client that calls `ensemble` and reads OUTPUT = (a+b)*(a-b); a BLS model that calls the
    same two models answers the same."""
    rng = np.random.default_rng(0)
    a, b = rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)
    url = seed_worker.http if module is httpclient else seed_worker.grpc
    result = _infer(module, url, model, a, b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT"), (a + b) * (a - b), rtol=1e-6)


def test_the_ensemble_reports_itself_and_its_steps_as_triton_does(seed_worker):
    client = httpclient.InferenceServerClient(seed_worker.http)
    meta = client.get_model_metadata("ensemble")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    config = client.get_model_config("ensemble")
    assert config["platform"] == "ensemble" and config["backend"] == ""
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["add_sub", "mul"]
    before = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    ones = np.ones(4, np.float32)
    for _ in range(3):
        _infer(httpclient, seed_worker.http, "ensemble", ones, ones)
    after = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}

    def grew(name: str, key: str) -> int:
        get = (lambda s: s["inference_stats"][key]["count"]) if key != "execution_count" else (
            lambda s: s["execution_count"])  # fmt: skip
        return get(after[name]) - get(before[name])

    for name in ("ensemble", "add_sub", "mul"):
        assert grew(name, "success") == 3 and grew(name, "queue") == 3
        assert grew(name, "execution_count") == 3
    # the ensemble's durations are its steps' sums: compute no less than either step's
    spent = {n: after[n]["inference_stats"]["compute_infer"]["ns"]
             - before[n]["inference_stats"]["compute_infer"]["ns"] for n in after}  # fmt: skip
    assert spent["ensemble"] == spent["add_sub"] + spent["mul"]
    client.close()


@pytest.mark.parametrize("model", ["ensemble", "bls"])
def test_perf_analyzer_shows_the_composing_models(seed_worker, tmp_path: Path, model):
    """perf_analyzer reads the ensemble's steps from its config (a BLS model's from
    --bls-composing-models), asks every model's statistics, and prints each composing model's
    breakdown (it exits on statistics it cannot use)."""
    assert PERF_ANALYZER.exists(), "the set-up (make test) installs perf_analyzer into .venv"
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", seed_worker.grpc, "-i", "grpc",
           "--concurrency-range", "2", "-p", "500", "-s", "100", "-r", "30",
           "-f", str(tmp_path / "pa.csv")]  # fmt: skip
    if model == "bls":
        cmd += ["--bls-composing-models", "add_sub,mul"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Composing models:" in run.stdout, run.stdout
    assert re.search(r"add_sub, version: 1\s+Inference count: [1-9]", run.stdout), run.stdout
    assert re.search(r"mul, version: 1\s+Inference count: [1-9]", run.stdout), run.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_our_perf_shows_the_composing_models_too(seed_worker, protocol):
    url = seed_worker.http if protocol == "http" else seed_worker.grpc
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "perf", "-m", "ensemble", "-u", url, "-i", protocol,
         "--concurrency-range", "2", "-p", "300"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = run.stdout
    assert "Composing models:" in text, text
    for model in ("add_sub", "mul"):
        assert re.search(rf"  {model}, version: 1\n\s+Inference count: [1-9]", text), text


# ---- a repository of ensembles built from the seed's models --------------------------------

_STEP = """{{ model_name: "{model}" model_version: -1 {maps} }}"""


def _ensemble(name: str, steps: list[tuple[str, dict, dict]], outputs=("OUTPUT",),
              batch: int = 0) -> str:  # fmt: skip
    body = []
    for model, inputs, outs in steps:
        pairs = [("input_map", k, v) for k, v in inputs.items()]
        pairs += [("output_map", k, v) for k, v in outs.items()]
        maps = " ".join(f'{kind} {{ key: "{k}" value: "{v}" }}' for kind, k, v in pairs)
        body.append(_STEP.format(model=model, maps=maps))
    tensors = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ 4 ] }}' for o in outputs)
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {batch}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"output [ {tensors} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(body)} ] }}\n"
    )


ADD_SUB = ("add_sub", {"add_sub_input0": "INPUT0", "add_sub_input1": "INPUT1"},
           {"added_output": "added", "subbed_output": "subbed"})  # fmt: skip
MUL = ("mul", {"mul_input0": "added", "mul_input1": "subbed"}, {"mul_output": "OUTPUT"})

PICKY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "mul_input0").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("picky refuses negative numbers")))
            else:
                out.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("mul_output", x)]))
        return out
"""


PROBE = '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, tensors, outputs, **kw):
    return pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor(n, a) for n, a in tensors.items()],
        requested_output_names=outputs, **kw)


def value(response, name):
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy().tolist()


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            added, product = await asyncio.gather(
                call("add_sub", {"add_sub_input0": a, "add_sub_input1": b},
                     ["added_output"]).async_exec(),
                call("mul", {"mul_input0": a, "mul_input1": b}, ["mul_output"]).async_exec())
            missing = call("no_such_model", {"x": a}, ["y"]).exec()
            wrong = call("mul", {"mul_input0": a}, ["mul_output"]).exec()
            big = np.arange(200_000, dtype=np.float32)
            echo = call("identity", {"IN": big}, ["OUT"]).exec()
            report = {
                "added": value(added, "added_output"), "product": value(product, "mul_output"),
                "missing": missing.error().message() if missing.has_error() else None,
                "wrong": wrong.error().message() if wrong.has_error() else None,
                "echo": bool(np.array_equal(value(echo, "OUT"), big)),
            }
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)]))
        return out
'''

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''


def _batching(config: str, name: str) -> str:
    return (config.replace(f'name: "{name}"', f'name: "{name}_b"')
            .replace('backend: "python"', 'backend: "python"\nmax_batch_size: 8\n'
                     "dynamic_batching { max_queue_delay_microseconds: 2000 }"))  # fmt: skip


@pytest.fixture(scope="module")
def ensembles_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensembles")
    for model in ("add_sub", "mul"):
        shutil.copytree(SEED / model, repo / model)
        shutil.copytree(SEED / model, repo / f"{model}_b")
        config = (SEED / model / "config.pbtxt").read_text()
        (repo / f"{model}_b" / "config.pbtxt").write_text(_batching(config, model))
    mul = (SEED / "mul" / "config.pbtxt").read_text()
    _python_model(repo, "picky", PICKY, mul.replace('name: "mul"', 'name: "picky"'))
    for name, code, config in (
        ("probe", PROBE, 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
         ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]'
         ' output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]'),
        ("identity", IDENTITY, 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]'
         ' output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]'),
    ):  # fmt: skip
        _python_model(repo, name, code, f'name: "{name}" backend: "python" {config}')
    ensembles = {
        # listed mul first: a step runs when its inputs exist, not in list order
        "reversed": _ensemble("reversed", [MUL, ADD_SUB]),
        # two steps that need only the ensemble's inputs, and one that joins them
        "diamond": _ensemble("diamond", [
            ("mul", {"mul_input0": "INPUT0", "mul_input1": "INPUT1"}, {"mul_output": "PROD"}),
            ADD_SUB, MUL], outputs=("OUTPUT", "PROD")),
        "picky_pipe": _ensemble("picky_pipe", [
            ADD_SUB, ("picky", {"mul_input0": "subbed", "mul_input1": "added"},
                      {"mul_output": "OUTPUT"})]),
        "batched": _ensemble("batched", [
            ("add_sub_b", *ADD_SUB[1:]), ("mul_b", *MUL[1:])], batch=8),
        "too_big": _ensemble("too_big", [ADD_SUB, MUL], batch=8),
        "loop_a": _ensemble("loop_a", [("loop_b", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                                        {"OUTPUT": "OUTPUT"})]),
        "loop_b": _ensemble("loop_b", [("loop_a", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                                        {"OUTPUT": "OUTPUT"})]),
    }  # fmt: skip
    for name, text in ensembles.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    served = start_worker(repo, "--model-control-mode", "explicit")
    yield served
    assert served.stop() == 0, "".join(served.output)


def _states(client) -> dict[str, str]:
    return {row["name"]: row.get("state", "") for row in client.get_model_repository_index()}


def test_an_explicit_load_of_an_ensemble_loads_its_composing_models_first(ensembles_worker):
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    assert _states(client)["add_sub"] == ""
    client.load_model("reversed")
    states = _states(client)
    assert states["reversed"] == states["add_sub"] == states["mul"] == "READY"
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, np.float32)
    got = _infer(httpclient, ensembles_worker.http, "reversed", a, b).as_numpy("OUTPUT")
    np.testing.assert_allclose(got, (a + b) * (a - b))
    client.close()


def test_independent_steps_and_a_join(ensembles_worker):
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    client.load_model("diamond")
    a, b = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    result = _infer(grpcclient, ensembles_worker.grpc, "diamond", a, b, ("OUTPUT", "PROD"))
    np.testing.assert_allclose(result.as_numpy("OUTPUT"), (a + b) * (a - b))
    np.testing.assert_allclose(result.as_numpy("PROD"), a * b)
    only = _infer(httpclient, ensembles_worker.http, "diamond", a, b, ("PROD",))
    assert only.as_numpy("OUTPUT") is None  # only what was asked for comes back
    client.close()


def test_a_failing_step_fails_the_request_with_that_models_message(ensembles_worker):
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    client.load_model("picky_pipe")
    a, b = np.full(4, 3.0, np.float32), np.full(4, 1.0, np.float32)
    ok = _infer(httpclient, ensembles_worker.http, "picky_pipe", a, b).as_numpy("OUTPUT")
    np.testing.assert_allclose(ok, a - b)
    for module, url in ((httpclient, ensembles_worker.http), (grpcclient, ensembles_worker.grpc)):
        with pytest.raises(InferenceServerException, match="picky refuses negative numbers"):
            _infer(module, url, "picky_pipe", b, a)  # a - b < 0
    stats = client.get_inference_statistics("picky_pipe")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 2 and stats["success"]["count"] == 1
    client.close()


def test_a_batching_ensemble_hands_its_batch_to_batching_models(ensembles_worker):
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    client.load_model("batched")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), np.float32)
    got = _infer(grpcclient, ensembles_worker.grpc, "batched", a, b).as_numpy("OUTPUT")
    np.testing.assert_allclose(got, (a + b) * (a - b))
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["batched"]["inference_count"] == 3 and stats["mul_b"]["inference_count"] == 3
    with pytest.raises(InferenceServerException, match="max_batch_size is 8 but model 'add_sub'"):
        client.load_model("too_big")
    client.close()


def test_ensembles_that_call_each_other_are_refused(ensembles_worker):
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    cycle = "call each other in a cycle: loop_a -> loop_b -> loop_a"
    with pytest.raises(InferenceServerException, match=cycle):
        client.load_model("loop_a")
    assert _states(client)["loop_a"] == "UNAVAILABLE"
    client.close()


def test_a_reloaded_composing_model_serves_the_ensembles_next_request(ensembles_worker):
    """A profile loads variants of a composing model under its own name: the ensemble picks the
    new one up without being reloaded."""
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    client.load_model("reversed")
    config = client.get_model_config("mul")
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    client.load_model("mul", config=json.dumps(config))
    a, b = np.full(4, 5.0, np.float32), np.full(4, 2.0, np.float32)
    got = _infer(httpclient, ensembles_worker.http, "reversed", a, b).as_numpy("OUTPUT")
    np.testing.assert_allclose(got, (a + b) * (a - b))
    client.unload_model("mul")
    with pytest.raises(InferenceServerException, match="'mul'"):
        _infer(httpclient, ensembles_worker.http, "reversed", a, b)
    client.load_model("mul")
    client.close()


# ---- the graph checks, with Triton's rules, one sentence each -------------------------------


def _fake(text: str):
    config = parse_model_config(text)
    return SimpleNamespace(name=config.name, config=config)


_MODELS = {
    "add_sub": _fake((SEED / "add_sub" / "config.pbtxt").read_text()),
    "mul": _fake((SEED / "mul" / "config.pbtxt").read_text()),
    "half": _fake('name: "half" backend: "python" input [ { name: "mul_input0" data_type: '
                  "TYPE_FP16 dims: [ 4 ] } ] output [ { name: \"mul_output\" data_type: "
                  "TYPE_FP16 dims: [ 4 ] } ]"),
}  # fmt: skip


class _Manager:
    def get(self, name: str, version: str = ""):
        if name not in _MODELS:
            raise InferError(f"Request for unknown model: '{name}' is not found")
        return _MODELS[name]


@pytest.mark.parametrize(
    ("steps", "outputs", "message"),
    [
        ([ADD_SUB, MUL], ("OUTPUT",), None),
        ([ADD_SUB, ("mul", {"mul_in": "added", "mul_input1": "subbed"}, MUL[2])], ("OUTPUT",),
         "step 2: input_map key 'mul_in' is not an input of model 'mul'"),
        ([ADD_SUB, ("mul", {"mul_input0": "added"}, MUL[2])], ("OUTPUT",),
         "step 2: input_map gives no tensor for input(s) mul_input1 of model 'mul'"),
        ([ADD_SUB, ("mul", {"mul_input0": "added", "mul_input1": "nowhere"}, MUL[2])],
         ("OUTPUT",), "input_map value 'nowhere' is neither an ensemble input nor"),
        ([ADD_SUB, ("mul", MUL[1], {"mul_out": "OUTPUT"})], ("OUTPUT",),
         "output_map key 'mul_out' is not an output of model 'mul'"),
        ([ADD_SUB, ("mul", MUL[1], {"mul_output": "added"})], ("OUTPUT",),
         "tensor 'added' is already produced by step 1 ('add_sub')"),
        ([ADD_SUB, MUL], ("OUTPUT", "OTHER"), "output 'OTHER' is not produced by any step"),
        ([("mul", {"mul_input0": "OUTPUT", "mul_input1": "INPUT0"}, {"mul_output": "X"}),
          ("mul", {"mul_input0": "X", "mul_input1": "INPUT1"}, {"mul_output": "OUTPUT"})],
         ("OUTPUT",), "can never run: their inputs depend on each other in a cycle"),
        ([ADD_SUB, ("gone", MUL[1], MUL[2])], ("OUTPUT",),
         "step 2: composing model 'gone' is not available"),
        ([ADD_SUB, ("half", {"mul_input0": "added"}, {"mul_output": "OUTPUT"})], ("OUTPUT",),
         "tensor 'added' is FP32 but input 'mul_input0' of model 'half' is FP16"),
    ],
)  # fmt: skip
def test_the_graph_is_checked_at_load(steps, outputs, message):
    config = parse_model_config(_ensemble("pipe", steps, outputs))
    if message is None:
        assert [s.model for s in check_graph(config, _Manager())] == ["add_sub", "mul"]
        return
    with pytest.raises(ValueError, match=re.escape(message)):
        check_graph(config, _Manager())


def test_unload_dependents_unloads_the_composing_models_too(ensembles_worker):
    """...except those another loaded ensemble still calls."""
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    for name in ("reversed", "diamond"):
        client.load_model(name)
    client.unload_model("picky_pipe")  # it calls add_sub too
    with grpcclient.InferenceServerClient(ensembles_worker.grpc) as rpc:
        rpc.unload_model("reversed", unload_dependents=True)
        states = _states(client)
        assert states["reversed"] == "UNAVAILABLE"
        assert states["add_sub"] == states["mul"] == "READY"  # diamond calls them
        rpc.unload_model("diamond", unload_dependents=True)
    states = _states(client)
    assert states["diamond"] == states["add_sub"] == states["mul"] == "UNAVAILABLE"
    client.load_model("reversed")  # loads them again
    client.unload_model("reversed")  # without dependents: they stay
    states = _states(client)
    assert states["reversed"] == "UNAVAILABLE" and states["add_sub"] == states["mul"] == "READY"
    client.close()


def test_bls_calls_run_on_the_named_models_with_errors_as_responses(ensembles_worker):
    """async_exec() calls gathered, exec() to a model that does not exist and with an input
    missing (each an error response, not an exception), and a 800 KB tensor there and back."""
    client = httpclient.InferenceServerClient(ensembles_worker.http)
    for model in ("add_sub", "mul", "identity", "probe"):
        client.load_model(model)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    a, b = np.arange(4, dtype=np.float32), np.full(4, 3.0, np.float32)
    with httpclient.InferenceServerClient(ensembles_worker.http) as c:
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        report = json.loads(c.infer("probe", inputs).as_numpy("REPORT")[0])
    assert report["added"] == (a + b).tolist() and report["product"] == (a * b).tolist()
    assert "no_such_model" in report["missing"]
    assert "expected input 'mul_input1' for model 'mul'" in report["wrong"]
    assert report["echo"] is True
    after = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    assert after == before + 1  # the BLS call went through add_sub's own scheduling
    client.close()


# ---- profile --profile-models <ensemble> -----------------------------------------------------


def _profile(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "--model-repository", str(SEED),
         "--output-model-repository-path", "OUT", "--export-path", "EXP",
         # the seed command's caps (blog post 003)
         "--run-config-search-max-concurrency", "2", "--run-config-search-max-model-batch-size",
         "2", "--run-config-search-max-instance-count", "2",
         "--measurement-interval", "300", "--max-trials", "3", "--client-protocol", "http",
         *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_profiling_the_seed_ensemble_searches_its_composing_models(tmp_path: Path):
    """The seed's ensemble, profiled with the seed command's kind of caps: the search turns the
    composing models' instances; each ensemble variant's steps call its composing variants'
    folders, so the output repository serves them together as they are."""
    run = _profile(tmp_path, "--profile-models", "ensemble")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Best config for ensemble" in " ".join(run.stdout.split())
    document = json.loads((tmp_path / "EXP" / "results" / "profile_results.json").read_text())
    configs = [c for c in document["models"][0]["configs"] if c["measurements"]]
    assert len(configs) >= 2 and any(c["is_default"] for c in configs)
    counts = {json.dumps(c["params"], sort_keys=True) for c in configs}
    assert any('"instance_count": 2' in p for p in counts), counts  # a composing model moved
    texts = [c["description"]["instance_group"] for c in configs]
    assert len(set(texts)) == len(texts), texts  # no config measured twice under two names
    out = tmp_path / "OUT"
    for c in configs:
        steps = load_model_config(out / c["name"] / "config.pbtxt").ensemble_scheduling.step
        called = [s.model_name for s in steps]
        assert called == c["description"]["composing_configs"]
        assert all((out / name / "config.pbtxt").exists() for name in called)
    with open(tmp_path / "EXP" / "results" / "metrics-model-inference.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(re.fullmatch(r"ensemble_config_\w+: add_sub_config_\w+, mul_config_\w+",
                                     row["Model Config Path"]) for row in rows)  # fmt: skip
    # the winner's folders, served as written, answer the seed's client
    winner = min(configs, key=lambda c: c["rank"])["name"]
    served = start_worker(out, "--model-control-mode", "explicit", "--load-model", winner)
    try:
        a, b = np.full(4, 3.0, np.float32), np.arange(4, dtype=np.float32)
        got = _infer(httpclient, served.http, winner, a, b).as_numpy("OUTPUT")
        np.testing.assert_allclose(got, (a + b) * (a - b))
    finally:
        assert served.stop() == 0


def test_profiling_a_bls_model_with_its_composing_models(tmp_path: Path):
    """--bls-composing-models: the BLS model and the models it calls are searched together;
    the models it calls are served under their own names while it is measured, and the output
    repository ends serving the recommended variant with its composing configs."""
    run = _profile(tmp_path, "--profile-models", "bls", "--bls-composing-models", "add_sub,mul")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Best config for bls" in " ".join(run.stdout.split())
    document = json.loads((tmp_path / "EXP" / "results" / "profile_results.json").read_text())
    configs = [c for c in document["models"][0]["configs"] if c["measurements"]]
    assert len(configs) >= 2
    moved = {part for c in configs for part in c["params"]}
    assert moved <= {"bls", "add_sub", "mul"} and len(moved) >= 2, moved
    out = tmp_path / "OUT"
    best = min(configs, key=lambda c: c["rank"])
    for part, variant in zip(("add_sub", "mul"), best["description"]["composing_configs"],
                             strict=True):  # fmt: skip
        served = load_model_config(out / part / "config.pbtxt")
        chosen = load_model_config(out / variant / "config.pbtxt")
        served.name = chosen.name = ""
        assert served == chosen
    worker = start_worker(out, "--model-control-mode", "explicit", "--load-model", "add_sub",
                          "--load-model", "mul", "--load-model", best["name"])  # fmt: skip
    try:
        a, b = np.full(4, 2.0, np.float32), np.arange(4, dtype=np.float32)
        got = _infer(grpcclient, worker.grpc, best["name"], a, b).as_numpy("OUTPUT")
        np.testing.assert_allclose(got, (a + b) * (a - b))
    finally:
        assert worker.stop() == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--profile-models", "ensemble", "--bls-composing-models", "add_sub"],
     "--bls-composing-models is for a python model that calls others, but 'ensemble' is an "
     "ensemble"),
    (["--profile-models", "bls", "--bls-composing-models", "add_sub,nope"],
     "BLS model 'bls': model 'nope' is not in repository"),
])  # fmt: skip
def test_composing_models_that_cannot_be_used_are_one_clear_error(tmp_path, args, needle):
    run = _profile(tmp_path, *args)
    assert needle in " ".join((run.stdout + run.stderr).split())


# ---- decoupled python models ------------------------------------------------------------------

REPEAT = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's `repeat` example, in short: one response per element of IN, the first half sent
    during execute(), the rest by a thread after it returned, then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            half = len(values) // 2

            def send(items, sender=sender):
                for v in items:
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]))

            send(values[:half])

            def rest(values=values[half:], sender=sender, send=send):
                send(values)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=rest).start()
        return None
'''


FAN_IN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls `repeat` with exec(decoupled=True) and async_exec(decoupled=True): each answer is
    (sum of the values, number of responses with outputs, whether the last was empty)."""

    async def execute(self, requests):
        out = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = lambda: pb_utils.InferenceRequest(
                model_name="repeat", inputs=[pb_utils.Tensor("IN", values)],
                requested_output_names=["OUT"])
            seen = [r for r in call().exec(decoupled=True)]
            streamed = [r for r in await call().async_exec(decoupled=True)]  # Triton's form
            row = []
            for responses in (seen, streamed):
                assert not any(r.has_error() for r in responses)
                full = [r for r in responses if r.output_tensors()]
                row += [sum(int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0])
                            for r in full), len(full), int(not responses[-1].output_tensors())]
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUMMARY", np.array(row, dtype=np.int64))]))
        return out
'''


DOUBLE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
            for r in requests]
'''

THREADED_BLS = '''
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils


def double(value):
    request = pb_utils.InferenceRequest(
        model_name="double", inputs=[pb_utils.Tensor("IN", np.array([value], dtype=np.int32))],
        requested_output_names=["OUT"])
    response = request.exec()
    assert not response.has_error(), response.error().message()
    return int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])


class TritonPythonModel:
    """exec() from 8 threads at once, 5 times over: each answer is the doubled values."""

    def execute(self, requests):
        out = []
        for request in requests:
            values = [int(v) for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()]
            with ThreadPoolExecutor(8) as pool:
                for _ in range(5):
                    doubled = list(pool.map(double, values))
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array(doubled, dtype=np.int32))]))
        return out
'''

LATE_BLS = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: a thread started in execute() calls `double` by BLS for each value after
    execute() returned, sends each answer, then the final flag; one call of the `repeat`
    iterator is cancelled after its first response, and the channel goes on."""

    def execute(self, requests):
        for request in requests:
            values = [int(v) for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()]
            sender = request.get_response_sender()

            def work(values=values, sender=sender):
                stream = pb_utils.InferenceRequest(
                    model_name="repeat", inputs=[pb_utils.Tensor("IN", np.arange(1, 7,
                    dtype=np.int32))], requested_output_names=["OUT"]).exec(decoupled=True)
                first = next(stream)
                stream.cancel()
                assert list(stream) == [] and not first.has_error()
                for v in values:
                    response = pb_utils.InferenceRequest(
                        model_name="double", inputs=[pb_utils.Tensor(
                            "IN", np.array([v], dtype=np.int32))],
                        requested_output_names=["OUT"]).exec()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUT", pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy())]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=work).start()
        return None
'''


CANCELLABLE = '''
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: one response every 50 ms, up to 200, checking is_cancelled() before each;
    writes how it ended to the file the request's IN[0] numbers (MARKS/<n>)."""

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()

            def run(n=n, sender=sender, request=request):
                for step in range(200):
                    if request.is_cancelled() or sender.is_cancelled():
                        Path(MARKS, str(n)).write_text(f"cancelled at {step}")
                        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        return
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([step], dtype=np.int32))]))
                    time.sleep(0.05)
                Path(MARKS, str(n)).write_text("ran to the end")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=run).start()
        return None
'''


@pytest.fixture(scope="module")
def decoupled_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled")
    marks = tmp_path_factory.mktemp("marks")
    _python_model(repo, "cancellable", CANCELLABLE.replace("MARKS", repr(str(marks))),
                  'name: "cancellable" backend: "python" '
                  'model_transaction_policy { decoupled: true }\n'
                  'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')
    io = ('input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')
    _python_model(repo, "double", DOUBLE, 'name: "double" backend: "python"\n' + io)
    _python_model(repo, "threaded_bls", THREADED_BLS,
                  'name: "threaded_bls" backend: "python"\n' + io)
    _python_model(repo, "late_bls", LATE_BLS, 'name: "late_bls" backend: "python" '
                  'model_transaction_policy { decoupled: true }\n' + io)
    _python_model(repo, "repeat", REPEAT,
                  'name: "repeat" backend: "python" model_transaction_policy { decoupled: true }\n'
                  'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                  'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    _python_model(repo, "fan_in", FAN_IN,
                  'name: "fan_in" backend: "python"\n'
                  'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                  'output [ { name: "SUMMARY" data_type: TYPE_INT64 dims: [ 6 ] } ]\n')
    served = start_worker(repo)
    served.marks = marks
    yield served
    assert served.stop() == 0, "".join(served.output)


def _stream(url: str, values: list[list[int]], empty_final: bool,
            model: str = "repeat") -> dict[str, list]:  # fmt: skip
    """Each request's responses, in order, as (OUT or None, triton_final_response)."""
    import queue

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for n, items in enumerate(values):
        data = np.array(items, dtype=np.int32)
        tensor = grpcclient.InferInput("IN", [len(items)], "INT32")
        tensor.set_data_from_numpy(data)
        client.async_stream_infer(model, [tensor], request_id=f"r{n}",
                                  enable_empty_final_response=empty_final)  # fmt: skip
    out: dict[str, list] = {f"r{n}": [] for n in range(len(values))}
    open_requests = set(out)
    while open_requests:
        result, error = got.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        array = result.as_numpy("OUT")
        out[response.id].append((None if array is None else int(array[0]), final))
        expected = len(values[int(response.id[1:])])
        if final or (not empty_final and len(out[response.id]) == expected):
            open_requests.discard(response.id)
    client.stop_stream()
    client.close()
    return out


def test_a_decoupled_model_streams_n_responses(decoupled_worker):
    values = [[3, 1, 4, 1, 5], [9, 2], [6]]
    got = _stream(decoupled_worker.grpc, values, empty_final=True)
    for n, items in enumerate(values):
        answers = got[f"r{n}"]
        assert [v for v, _ in answers[:-1]] == items  # each as its own response, in order
        assert [f for _, f in answers] == [False] * len(items) + [True]
        assert answers[-1] == (None, True)  # the final flag alone: the empty response asked for
    got = _stream(decoupled_worker.grpc, [[7, 8, 9]], empty_final=False)
    assert got["r0"] == [(7, False), (8, False), (9, False)]  # no empty final unless asked


def test_bls_calls_from_several_threads_and_after_execute_returned(decoupled_worker):
    """exec() from a model's own threads at once broke the model's process (two threads read
    its channel: "UnpicklingError"), and a decoupled model's thread that called after execute()
    returned never got its reply (the stub dropped it). A decoupled BLS iterator can be
    cancelled (Triton's ResponseIterator.cancel())."""
    values = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int32)
    with grpcclient.InferenceServerClient(decoupled_worker.grpc) as client:
        for _ in range(3):
            tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
            tensor.set_data_from_numpy(values)
            result = client.infer("threaded_bls", [tensor], client_timeout=60)
            assert result.as_numpy("OUT").tolist() == (values * 2).tolist()
    got = _stream(decoupled_worker.grpc, [[7, 8, 9], [1]], empty_final=True, model="late_bls")
    assert got["r0"] == [(14, False), (16, False), (18, False), (None, True)]
    assert got["r1"] == [(2, False), (None, True)]
    with grpcclient.InferenceServerClient(decoupled_worker.grpc) as client:  # still coherent
        tensor = grpcclient.InferInput("IN", [2], "INT32")
        tensor.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
        assert client.infer("double", [tensor]).as_numpy("OUT").tolist() == [10, 12]


def test_a_model_sees_its_client_cancel(decoupled_worker):
    """request.is_cancelled() was always False: a model streaming to a client that had gone
    went on to the end. A stream closed with its requests cancelled is seen at the model's next
    check; one left open runs to the end."""
    import queue

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled_worker.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    client.async_stream_infer("cancellable", [tensor])
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None, error
    client.stop_stream(cancel_requests=True)
    client.close()
    mark = decoupled_worker.marks / "1"
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert time.monotonic() < deadline, "the model never ended its request"
        time.sleep(0.05)
    text = mark.read_text()
    assert text.startswith("cancelled at ") and int(text.split()[-1]) < 100, text


def test_a_decoupled_model_is_refused_over_http_and_unary_grpc(decoupled_worker):
    data = np.array([1, 2], dtype=np.int32)
    for module, url in ((httpclient, decoupled_worker.http), (grpcclient, decoupled_worker.grpc)):
        with module.InferenceServerClient(url) as client:
            tensor = module.InferInput("IN", [2], "INT32")
            tensor.set_data_from_numpy(data)
            with pytest.raises(InferenceServerException, match="is decoupled.*gRPC streaming"):
                client.infer("repeat", [tensor])


# ---- sequence batching ----------------------------------------------------------------------

ACCUMULATE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A running sum per sequence, kept in this instance: START resets it, END forgets it, and
    every request is answered with the sum so far, its READY flag and its CORRID."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            corrid = int(get("CORRID").reshape(-1)[0])
            if get("START").reshape(-1)[0]:
                self.sums[corrid] = 0
            self.sums[corrid] += int(get("INPUT").reshape(-1)[0])
            total = np.array([[self.sums[corrid], get("READY").reshape(-1)[0], corrid]],
                             dtype=np.int64)
            if get("END").reshape(-1)[0]:
                del self.sums[corrid]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total)]))
        return out
'''

SEQUENCE_CONFIG = """name: "accumulate"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT64 dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
sequence_batching {
  max_sequence_idle_microseconds: 300000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  STRATEGY
}
"""


@pytest.fixture(scope="module", params=["direct { }", "oldest { max_candidate_sequences: 4 "
                                        "max_queue_delay_microseconds: 1000 }"])  # fmt: skip
def sequence_worker(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequence")
    _python_model(repo, "accumulate", ACCUMULATE,
                  SEQUENCE_CONFIG.replace("STRATEGY", request.param))
    served = start_worker(repo)
    yield served
    assert served.stop() == 0, "".join(served.output)


def _step(module, url: str, corrid: int, value: int, start=False, end=False) -> list[int]:
    with module.InferenceServerClient(url) as client:
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer("accumulate", [tensor], sequence_id=corrid, sequence_start=start,
                              sequence_end=end)  # fmt: skip
        return [int(x) for x in result.as_numpy("OUTPUT")[0]]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_sequence_keeps_its_state_per_correlation_id(sequence_worker, module):
    url = sequence_worker.http if module is httpclient else sequence_worker.grpc
    a, b = 1001, 2002
    assert _step(module, url, a, 5, start=True) == [5, 1, a]
    assert _step(module, url, b, 100, start=True) == [100, 1, b]
    assert _step(module, url, a, 6) == [11, 1, a]  # interleaved sequences keep their own sums
    assert _step(module, url, b, 1) == [101, 1, b]
    assert _step(module, url, a, 1, end=True) == [12, 1, a]
    with pytest.raises(InferenceServerException, match=f"sequence {a} .*must specify the START"):
        _step(module, url, a, 1)  # ended: continuing it needs a new START
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        _step(module, url, 0, 1, start=True)
    time.sleep(0.5)  # longer than max_sequence_idle_microseconds: b was released
    with pytest.raises(InferenceServerException, match=f"sequence {b} .*must specify the START"):
        _step(module, url, b, 1)


def test_perf_analyzer_drives_sequences(sequence_worker, tmp_path: Path):
    """perf_analyzer's sequence mode: C sequences at a time, each of --sequence-length
    requests with START and END; a request the worker refused would make it fail."""
    cmd = [str(PERF_ANALYZER), "-m", "accumulate", "-u", sequence_worker.grpc, "-i", "grpc",
           "--concurrency-range", "4", "--sequence-length", "5", "--sequence-id-range",
           "1:1000", "-p", "500", "-s", "100", "-r", "30",
           "-f", str(tmp_path / "pa.csv")]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"Sequence count: [1-9]", run.stdout), run.stdout


def test_bls_exec_decoupled_iterates_over_a_decoupled_models_responses(decoupled_worker):
    with httpclient.InferenceServerClient(decoupled_worker.http) as client:
        tensor = httpclient.InferInput("IN", [4], "INT32")
        tensor.set_data_from_numpy(np.array([1, 2, 3, 4], dtype=np.int32))
        summary = client.infer("fan_in", [tensor]).as_numpy("SUMMARY").tolist()
    # both ways: the four values, four responses with outputs, then the final flag alone
    assert summary == [10, 4, 1, 10, 4, 1]


def test_an_ensemble_of_ensembles_is_one_clear_error(tmp_path: Path):
    """Its variants were written without their steps, and profile then said the classifier was
    'not in repository' and the variant had no ensemble_scheduling."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES, repo)
    (repo / "outer" / "1").mkdir(parents=True)
    (repo / "outer" / "config.pbtxt").write_text(
        'name: "outer"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 32, 32, 3 ] } ]\n'
        'output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "classifier" model_version: -1 input_map '
        '{ key: "IMAGE" value: "IMAGE" } output_map { key: "SCORES" value: "SCORES" } } ] }\n')
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "--model-repository", str(repo),
         "--profile-models", "outer", "--output-model-repository-path", "OUT", "--export-path",
         "EXP", "--measurement-interval", "300"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    said = " ".join((run.stdout + run.stderr).split())
    assert "ensemble 'outer' calls ensemble 'classifier': an ensemble of ensembles is not " \
           "profiled with its composing models" in said, said  # fmt: skip
