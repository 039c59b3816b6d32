"""`model-analyzer profile` end to end: real worker, real load, real files."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from analyzer.config.model_config import load_model_config
from analyzer.launch.cpus import parse_cpu_list

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
SEED = [
    "--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
    "--triton-launch-mode=local", "--output-model-repository-path", "OUT", "--export-path", "EXP",
    "--override-output-model-repository", "--run-config-search-max-concurrency", "2",
    "--run-config-search-max-model-batch-size", "2", "--run-config-search-max-instance-count", "2",
]  # fmt: skip
FAST = ["--measurement-interval", "300", "--max-trials", "3", "--final-rounds", "2"]


def profile(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip


def workers_serving(out: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and str(out) in cmd:
            found.append(proc)
    return found


def repo_with(tmp_path: Path, name: str, model_py: str) -> Path:
    """A repository with add_sub and `name`: add_sub's config with this model.py."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    shutil.copytree(EXAMPLES / "add_sub", repo / name)
    config = (repo / name / "config.pbtxt").read_text().replace('"add_sub"', f'"{name}"')
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(model_py)
    return repo


def results(exp: Path) -> dict:
    return json.loads((exp / "results" / "profile_results.json").read_text())


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_the_seed_command(tmp_path):
    run = profile(tmp_path, *SEED)
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())  # rich wraps long lines
    assert "Best config for add_sub: add_sub_config_" in text
    assert "x the default config's" in text
    out, exp = tmp_path / "OUT", tmp_path / "EXP"
    assert (out / "add_sub_config_default" / "config.pbtxt").exists()
    variants = sorted(p for p in out.iterdir()  # dot files: the tool's marker and lock
                      if p.name != "add_sub_config_default" and not p.name.startswith("."))
    assert len(variants) >= 2
    searched = set()
    for folder in variants:
        config = load_model_config(folder / "config.pbtxt")  # Triton's schema
        assert config.name == folder.name
        assert (folder / "1" / "model.py").exists()  # ready to serve
        searched.add((config.max_batch_size, config.instance_group[0].count,
                      config.dynamic_batching.max_queue_delay_microseconds))  # fmt: skip
    assert len(searched) == len(variants)  # each differs in the searched fields
    rows = read_csv(exp / "results" / "metrics-model-inference.csv")
    for column in ("Model", "Batch", "Concurrency", "Model Config Path", "Instance Group",
                   "Max Batch Size", "Satisfies Constraints", "Throughput (infer/sec)",
                   "p99 Latency (ms)", "Server Queue time (ms)",
                   "Server Compute Infer time (ms)"):  # fmt: skip
        assert column in rows[0]
    header = list(rows[0])  # ours come after MA's: the stability flag and its interval
    assert header.index("Stable") + 1 == header.index("Throughput 95% CI (+/- %)")
    assert all(float(r["Throughput 95% CI (+/- %)"]) > 0 for r in rows)
    assert {r["Concurrency"] for r in rows} == {"1", "2"}
    assert len(rows) == results(exp)["stats"]["measured"]
    gpu = (exp / "results" / "metrics-model-gpu.csv").read_text().splitlines()
    assert gpu[0].startswith("Model,GPU UUID,Batch,Concurrency")
    server = (exp / "results" / "metrics-server-only.csv").read_text().splitlines()
    assert server[0] == (
        "Model,GPU UUID,GPU Memory Usage (MB),GPU Utilization (%),GPU Power Usage (W)"
    )
    assert (exp / "logs" / "worker.log").exists()
    placement = results(exp)["cpu_placement"]
    starts = [line for line in (exp / "logs" / "worker.log").read_text().splitlines()
              if line.startswith("--- start")]  # fmt: skip
    if len(os.sched_getaffinity(0)) >= 2:  # disjoint by default: the worker was started pinned
        worker, client = placement["worker_cpus"], placement["client_cpus"]
        assert worker != "all" and client != "all"
        assert not parse_cpu_list(worker, "w") & parse_cpu_list(client, "c")
        assert all(f"taskset -c {worker} " in line for line in starts)
        assert f"load generator on CPUs {client}" in text
    else:
        assert placement["worker_cpus"] == placement["client_cpus"] == "all"
    assert not workers_serving(out)


def test_sigkill_then_rerun_resumes_without_measuring_twice(tmp_path):
    args = [*SEED[:-6], "--run-config-search-max-model-batch-size", "2",
            "--run-config-search-max-instance-count", "1", "-c", "1,2", *FAST]  # fmt: skip
    whole = tmp_path / "whole"
    whole.mkdir()
    run = profile(whole, *args)
    assert run.returncode == 0, run.stdout + run.stderr
    total = results(whole / "EXP")["stats"]["measured"]

    cut = tmp_path / "cut"
    cut.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", "profile", *args], cwd=cut,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    checkpoint = cut / "EXP" / "checkpoints" / "profile.ckpt.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = checkpoint.read_text() if checkpoint.exists() else ""
        if text.count('"type": "point"') >= 3:
            break
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    before = checkpoint.read_text().count('"type": "point"')
    assert 3 <= before < total
    for _ in range(100):  # the worker follows its parent (PR_SET_PDEATHSIG)
        if not workers_serving(cut / "OUT"):
            break
        time.sleep(0.1)
    assert not workers_serving(cut / "OUT")

    rerun = profile(cut, *args)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    stats = results(cut / "EXP")["stats"]
    assert stats["reused"] == before
    assert before + stats["measured"] == total
    points = [(c["name"], m["value"]) for c in results(cut / "EXP")["models"][0]["configs"]
              for m in c["measurements"]]  # fmt: skip
    assert len(points) == len(set(points)) == total


def test_latency_constraint_is_honoured_on_the_torchscript_example(tmp_path):
    """The budget lies between the fastest and the slowest p99 a first run measured, and the
    second run reuses that run's points: which points meet it does not depend on how busy this
    machine is (a fixed 10 ms budget failed on a loaded CI host). No final rounds: they would
    measure anew."""
    space = tmp_path / "space.yaml"
    space.write_text("dynamic_batching: {max_queue_delay_microseconds: [0]}\n")
    args = [
        "--model-repository", str(EXAMPLES), "--profile-models", "tiny_cnn",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
        "4", "-c", "1,32", "--search-space", str(space), "--client-protocol", "http",
        "--measurement-interval", "300", "--max-trials", "3", "--final-rounds", "0",
    ]  # fmt: skip
    first = profile(tmp_path, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    measured = results(tmp_path / "EXP")["models"][0]["configs"]
    p99s = [m["metrics"]["perf_latency_p99"] for c in measured for m in c["measurements"]]
    assert min(p99s) < max(p99s), p99s
    budget = math.sqrt(min(p99s) * max(p99s))

    run = profile(tmp_path, *args, "--latency-budget", repr(budget))
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())  # rich wraps long lines
    assert "Best config for tiny_cnn" in text and "x the default config's" in text
    document = results(tmp_path / "EXP")
    assert document["stats"]["measured"] == 0 and document["stats"]["reused"] == len(p99s)
    configs = [c for c in document["models"][0]["configs"] if c["measurements"]]
    winner = min(configs, key=lambda c: c["rank"])
    assert winner["satisfies_constraints"]
    assert winner["best"]["metrics"]["perf_latency_p99"] <= budget
    for config in configs:
        meets = any(m["metrics"]["perf_latency_p99"] <= budget for m in config["measurements"])
        assert config["satisfies_constraints"] == meets, config["name"]
    rows = read_csv(tmp_path / "EXP" / "results" / "metrics-model-inference.csv")
    assert len(rows) == len(p99s)
    for row in rows:
        expected = "Yes" if float(row["p99 Latency (ms)"]) <= budget else "No"
        assert row["Satisfies Constraints"] == expected
    assert {r["Satisfies Constraints"] for r in rows} == {"Yes", "No"}


def test_failures_are_recorded_and_the_run_goes_on(tmp_path):
    repo = repo_with(tmp_path, "broken", (
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('weights file is missing')\n"
    ))  # fmt: skip
    run = profile(
        tmp_path, "--model-repository", str(repo), "--profile-models", "broken,add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP", "-c", "1",
        "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
        "1", *FAST,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    document = {m["name"]: m for m in results(tmp_path / "EXP")["models"]}
    broken = document["broken"]["configs"]
    assert broken and all("weights file is missing" in c["error"] for c in broken)
    assert any(c["measurements"] for c in document["add_sub"]["configs"])
    assert "weights file is missing" in " ".join(run.stdout.split())


def test_a_load_that_hangs_fails_its_config_within_model_load_timeout(tmp_path):
    """Each config of a model whose initialize() never returns failed after the worker's fixed
    120 s; now the profile's model_load_timeout bounds it, and the reason names it."""
    repo = repo_with(tmp_path, "hangs", (
        "import time\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        time.sleep(3600)\n"
    ))  # fmt: skip
    run = profile(
        tmp_path, "--model-repository", str(repo), "--profile-models", "hangs",
        "--output-model-repository-path", "OUT", "--export-path", "EXP", "-c", "1",
        "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
        "1", "--model-load-timeout", "2", *FAST,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # no config could be measured
    configs = results(tmp_path / "EXP")["models"][0]["configs"]
    assert configs and all("did not finish loading within 2 s (model_load_timeout): instance "
                           in c["error"] for c in configs), configs  # fmt: skip
    assert "initialize() was still running" in " ".join(run.stdout.split())


def test_a_misspelt_model_is_refused_before_anything_is_emptied_or_rewritten(tmp_path):
    """It was a failed model at the end of the run, after --override-output-model-repository
    had emptied the output repository and with the results file rewritten to hold only it."""
    (tmp_path / "OUT").mkdir()
    (tmp_path / "OUT" / ".model-analyzer-output").write_text("made by model-analyzer\n")
    (tmp_path / "OUT" / "add_sub_config_1").mkdir()
    (tmp_path / "EXP" / "results").mkdir(parents=True)
    (tmp_path / "EXP" / "results" / "profile_results.json").write_text('{"models": []}')
    run = profile(tmp_path, "--model-repository", str(EXAMPLES), "--profile-models", "add_subb",
                  "--output-model-repository-path", "OUT", "--export-path", "EXP",
                  "--override-output-model-repository", *FAST)  # fmt: skip
    assert run.returncode != 0
    assert "profile_models names 'add_subb', which has no folder in" in run.stderr
    assert "did you mean 'add_sub'?" in run.stderr
    assert (tmp_path / "OUT" / "add_sub_config_1").is_dir()
    assert (tmp_path / "EXP" / "results" / "profile_results.json").read_text() == '{"models": []}'


def test_existing_output_repository_is_refused(tmp_path):
    (tmp_path / "OUT" / "keep").mkdir(parents=True)
    run = profile(tmp_path, *[a for a in SEED if a != "--override-output-model-repository"])
    assert run.returncode == 2
    assert "was not created by model-analyzer" in run.stderr  # so no flag lets it be deleted
    assert (tmp_path / "OUT" / "keep").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile-models", "add_sub", "--triton-launch-mode", "remote",
          "--triton-http-endpoint", "nonsense"],
         "triton_http_endpoint 'nonsense' is not host:port"),
        (["--profile-models", "add_sub", "--triton-docker-labels", "team"],
         "'triton_docker_labels' is 'team'; expected k=v pairs"),
        (["--profile-models", "add_sub", "--run-config-search-max-concurrency", "x"],
         "'run_config_search_max_concurrency' is 'x'"),
        (["--profile-models", "add_sub", "--worker-cpus", "1-x"],
         "'worker_cpus' is '1-x'; expected a CPU list"),
        (["--profile-models", "add_sub", "--client-cpus", "4096"],
         "'client_cpus' is '4096', but CPU 4096 is not one this process may use"),
        (["--profile-models", "add_sub", "--model-repository", "/no/such/repo"],
         "model repository '/no/such/repo' does not exist"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_error(tmp_path, args, needle):
    run = profile(tmp_path, "--model-repository", str(EXAMPLES), *args, timeout=60)
    assert run.returncode == 2
    assert needle in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_request_rate_search_with_a_memory_objective(tmp_path):
    (tmp_path / "c.yaml").write_text(
        f"model_repository: {EXAMPLES}\n"
        "profile_models: add_sub\n"
        "objectives: {perf_throughput: 1, cpu_used_ram: 1}\n"
        "request_rate_search_enable: true\n"
        "run_config_search_min_request_rate: 50\n"
        "run_config_search_max_request_rate: 100\n"
        "run_config_search_max_instance_count: 1\n"
        "run_config_search_max_model_batch_size: 1\n"
        "client_protocol: http\n"
    )
    run = profile(tmp_path, "-f", "c.yaml", "--output-model-repository-path", "OUT",
                  "--export-path", "EXP", *FAST)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    document = results(tmp_path / "EXP")
    configs = [c for c in document["models"][0]["configs"] if c["measurements"]]
    assert len(configs) == 2  # the default and max_batch_size 1
    assert document["stats"]["worker_starts"] == 2  # memory is ranked: a fresh worker each
    rows = read_csv(tmp_path / "EXP" / "results" / "metrics-model-inference.csv")
    assert "Request Rate" in rows[0] and "Concurrency" not in rows[0]
    assert sorted({r["Request Rate"] for r in rows}) == ["50", "64"]
    for row in rows:  # the schedule is kept (unpaced, add_sub serves thousands a second); a
        # 300 ms window holds only 15-19 requests, so one late answer moves it by 5-7%
        assert abs(float(row["Throughput (infer/sec)"]) / float(row["Request Rate"]) - 1) < 0.2
        assert float(row["RAM Usage (MB)"]) > 10


def _interruptible() -> None:
    """Ctrl-C as a terminal delivers it: a suite started in the background (`make test &`,
    nohup) hands its children SIGINT ignored, and a program rightly keeps that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_worker_and_keeps_the_points(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", "profile", *SEED, *FAST], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible,
    )  # fmt: skip
    checkpoint = tmp_path / "EXP" / "checkpoints" / "profile.ckpt.jsonl"
    deadline = time.monotonic() + 300
    while not (checkpoint.exists() and '"type": "point"' in checkpoint.read_text()):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "rerun the same command to resume" in err
    assert not workers_serving(tmp_path / "OUT")
    assert '"type": "point"' in checkpoint.read_text()


def test_a_config_that_crashes_the_worker_is_recorded_and_the_worker_restarted(tmp_path):
    repo = repo_with(tmp_path, "crasher", (
        "import os, signal\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        os.kill(os.getppid(), signal.SIGKILL)  # the stub's parent is the worker\n"
    ))  # fmt: skip
    run = profile(
        tmp_path, "--model-repository", str(repo), "--profile-models", "crasher,add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP", "-c", "1",
        "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
        "1", "--num-top-model-configs", "2", "--client-protocol", "http", *FAST,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    document = results(tmp_path / "EXP")
    models = {m["name"]: m for m in document["models"]}
    crashed = models["crasher"]["configs"]
    assert crashed and all("exited" in c["error"] for c in crashed)
    assert all(c["measurements"] for c in models["add_sub"]["configs"])
    assert document["stats"]["worker_starts"] >= 3  # one more after each crash
    assert len(document["top_across_models"]) == 2
    assert "Top 2 configs across models" in run.stdout
    across = "Best Configs Across All Models"  # MA's report key and folder name
    page = tmp_path / "EXP" / "reports" / "summaries" / across / "result_summary.html"
    assert all(name in page.read_text() for name in document["top_across_models"])
    plot = tmp_path / "EXP" / "plots" / "simple" / across / "throughput_v_latency.png"
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert not workers_serving(tmp_path / "OUT")


def test_dynamic_dims_need_a_shape(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 4 ]", "dims: [ -1 ]"))
    common = ["--model-repository", str(repo), "--profile-models", "add_sub",
              "--output-model-repository-path", "OUT", "--export-path", "EXP", "-c", "1",
              "--run-config-search-disable", "--client-protocol", "http",
              "--override-output-model-repository", *FAST]  # fmt: skip
    run = profile(tmp_path, *common)
    assert run.returncode == 1  # nothing could be profiled
    error = results(tmp_path / "EXP")["models"][0]["error"]
    assert "input 'INPUT0' has dynamic shape [-1]" in error and "--shape INPUT0:" in error
    run = profile(tmp_path, *common, "--shape", "INPUT0:6", "--shape", "INPUT1:6")
    assert run.returncode == 0, run.stdout + run.stderr
    configs = results(tmp_path / "EXP")["models"][0]["configs"]
    assert configs[0]["measurements"]


def test_quick_mode_end_to_end(tmp_path):
    run = profile(
        tmp_path, "--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-mode", "quick", "--run-config-search-max-concurrency", "8",
        "--run-config-search-max-model-batch-size", "4", "--run-config-search-max-instance-count",
        "2", "--num-configs-per-model", "2", "--client-protocol", "http",
        *FAST[: FAST.index("--final-rounds")],  # the rounds left to the A/A calibration
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())
    assert "Best config for add_sub" in text
    document = results(tmp_path / "EXP")
    comparison = document["models"][0]["final_comparison"]  # two configs at least: it runs
    calibration = document["models"][0]["calibration"]
    assert comparison["calibration"] == calibration
    assert len(calibration["throughputs"]) == 5 and calibration["noise_pct"] >= 0
    assert 3 <= comparison["rounds"] <= calibration["rounds"] <= 10
    assert "Rounds from an A/A calibration of the default config" in text
    checkpoint = (tmp_path / "EXP" / "checkpoints" / "profile.ckpt.jsonl").read_text()
    assert checkpoint.count('"type": "calibration"') == 5
    configs = [c for c in document["models"][0]["configs"] if c["measurements"]]
    points = [(c["name"], m["value"]) for c in configs for m in c["measurements"]]
    assert len(points) == len(set(points))  # no point measured twice
    assert configs and any(c["is_default"] for c in configs)
    # the winner and the default got the final concurrency sweep, outward from their best load:
    # at least one level next to it was measured
    winner = min(configs, key=lambda c: c["rank"])
    default = next(c for c in configs if c["is_default"])
    for config in (winner, default):
        assert len({m["value"] for m in config["measurements"]}) >= 2, config["name"]


def test_optuna_mode_end_to_end_and_resume(tmp_path):
    args = [
        "--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-mode", "optuna", "--run-config-search-max-concurrency", "8",
        "--run-config-search-max-model-batch-size", "4", "--run-config-search-max-instance-count",
        "2", "--optuna-min-trials", "5", "--optuna-max-trials", "6",
        "--max-percentage-of-search-space", "100", "--num-configs-per-model", "1",
        "--client-protocol", "http", "--override-output-model-repository", *FAST,
    ]  # fmt: skip
    run = profile(tmp_path, *args)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "EXP" / "checkpoints" / "optuna.db").exists()  # the study, beside the points
    document = results(tmp_path / "EXP")
    points = [(c["name"], m["value"]) for c in document["models"][0]["configs"]
              for m in c["measurements"]]  # fmt: skip
    assert len(points) == len(set(points)) == document["stats"]["measured"]
    rerun = profile(tmp_path, *args)  # same study, same checkpoint: nothing new to measure
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert results(tmp_path / "EXP")["stats"]["measured"] == 0


def test_optuna_multi_objective_puts_the_pareto_front_first(tmp_path):
    run = profile(
        tmp_path, "--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-mode", "optuna", "--optuna-objectives",
        "perf_throughput,perf_latency_p99", "--run-config-search-max-concurrency", "8",
        "--run-config-search-max-model-batch-size", "2", "--run-config-search-max-instance-count",
        "2", "--optuna-min-trials", "5", "--optuna-max-trials", "6", "--num-configs-per-model",
        "1", "--client-protocol", "http", *FAST,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())
    assert "on the Pareto front of perf_throughput, perf_latency_p99" in text
    model = results(tmp_path / "EXP")["models"][0]
    assert model["pareto_objectives"] == ["perf_throughput", "perf_latency_p99"]
    ranked = sorted((c for c in model["configs"] if c["measurements"]), key=lambda c: c["rank"])
    flags = [c["pareto_optimal"] for c in ranked]
    # the front first; only the final comparison's recommendation goes before it, when a search
    # point of another config dominates the mean of its rounds (no comparison: one finalist)
    recommended = (model["final_comparison"] or {}).get("recommended", ranked[0]["name"])
    assert flags[0] or ranked[0]["name"] == recommended
    rest = flags if flags[0] else flags[1:]
    assert rest == sorted(rest, reverse=True)

    def evidence(c: dict) -> list[tuple[float, float]]:  # a finalist: the mean of its rounds
        if c["final_comparison"]:
            f = c["final_comparison"]
            return [(f["perf_throughput"]["estimate"], f["perf_latency_p99"]["estimate"])]
        return [(m["metrics"]["perf_throughput"], m["metrics"]["perf_latency_p99"])
                for m in c["measurements"]]  # fmt: skip

    points = [p for c in ranked for p in evidence(c)]
    for c in ranked:  # a config is on the front iff some point of it is not dominated
        free = any(not any(t >= a and p <= b and (t, p) != (a, b) for t, p in points)
                   for a, b in evidence(c))  # fmt: skip
        assert free == c["pareto_optimal"], c["name"]
    finals = {c["name"]: evidence(c)[0] for c in ranked if c["final_comparison"]}
    if finals:  # no other finalist's rounds beat the recommendation on both objectives
        a, b = finals[recommended]
        assert not any(t >= a and p <= b and (t, p) != (a, b) for t, p in finals.values())
    page = (tmp_path / "EXP" / "reports" / "summaries" / "add_sub" / "result_summary.html")
    assert 'id="pareto"' in page.read_text()


def test_quiet_prints_nothing_and_verbose_prints_each_points_details(tmp_path):
    one = ["--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
           "--run-config-search-disable", "-c", "1", "--output-model-repository-path", "OUT",
           *FAST]  # fmt: skip
    quiet = profile(tmp_path, *one, "--export-path", "Q", "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr == ""
    assert results(tmp_path / "Q")["models"][0]["configs"]  # quiet, not idle
    verbose = profile(tmp_path, *one, "--export-path", "V", "--override-output-model-repository",
                      "--verbose")  # fmt: skip
    assert verbose.returncode == 0, verbose.stderr
    assert "server queue" in verbose.stdout and "compute" in verbose.stdout


def test_an_ma_config_with_tritonserver_flags_runs_with_notes(tmp_path):
    """Issue 15's first acceptance point: MA's tritonserver flags, environment and
    perf_analyzer flags in one file, with MA's flags on the command line. The model refuses to
    load unless triton_server_environment (with a $VAR, expanded as MA does) reached it."""
    check = ("import os\n"
             "if os.environ.get('MA_ENV_CHECK') != os.environ['HOME'] + '/mark':\n"
             "    raise RuntimeError('triton_server_environment did not reach the worker')\n")
    add_sub = (EXAMPLES / "add_sub" / "1" / "model.py").read_text()
    repo = repo_with(tmp_path, "envcheck", check + add_sub)
    (tmp_path / "cfg.yaml").write_text(
        f"model_repository: {repo}\n"
        "profile_models: envcheck\n"
        "run_config_search_disable: true\n"
        "concurrency: 1\n"
        "triton_server_flags:\n"
        "  strict-model-config: false\n"
        "  log-verbose: 1\n"
        "  backend-config: python,shm-default-byte-size=1048576\n"
        "triton_server_environment:\n"
        "  MA_ENV_CHECK: $HOME/mark\n"
        "perf_analyzer_flags:\n"
        "  latency-threshold: 100\n"
        "  max-threads: 4\n"
    )
    run = profile(tmp_path, "-f", "cfg.yaml", "-v", "--collect-cpu-metrics",
                  "--skip-detailed-reports", "--triton-output-path", "LOG",
                  "--perf-analyzer-path", "perf_analyzer", "--output-model-repository-path",
                  "OUT", "--export-path", "EXP", "--perf-output", "--perf-output-path", "PA",
                  *FAST)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "'collect_cpu_metrics' has no effect here" in run.stdout
    assert "'max-threads' has no effect" not in run.stdout  # honoured: the process cap
    assert "perf_analyzer_flags 'latency-threshold' has no effect here" in run.stdout
    assert results(tmp_path / "EXP")["models"][0]["configs"][0]["measurements"]
    assert not (tmp_path / "EXP" / "logs" / "worker.log").exists()
    log = (tmp_path / "LOG").read_text()  # --triton-output-path, as MA
    assert "--strict-model-config has no effect" not in log  # honoured: auto-complete stays on
    assert "note: --backend-config has no effect here" in log
    reports = (tmp_path / "PA").read_text()  # MA's perf_output: each point, as PA words it
    assert "*** envcheck_config_default: concurrency 1, batch size 1 ***" in reports
    assert "Throughput:" in reports and "p99 latency:" in reports
    reports = tmp_path / "EXP" / "reports"
    assert (reports / "summaries" / "envcheck" / "result_summary.html").exists()
    assert not (reports / "detailed").exists()  # --skip-detailed-reports, as MA
