"""NVIDIA's Model Analyzer 1.58 drives our worker (issue 15): the strongest test of compatibility
is the tool our users come from. The set-up installs it from PyPI into its own venv as a peer
(scripts/install_ma_peer.sh), as it installs perf_analyzer. In MA's local launch mode it starts
`model-analyzer-server` as its tritonserver, loads each variant with a config override and measures
it with perf_analyzer; in its remote mode it profiles a worker we started. Both must end with
result rows for a python model and a TorchScript model."""

from __future__ import annotations

import csv
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from serving import EXAMPLES, ROOT, free_port, start_worker

PEER = ROOT / ".venv" / "peers" / "model-analyzer" / "bin" / "model-analyzer"
SERVER = ROOT / ".venv" / "bin" / "model-analyzer-server"
PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"
MODELS = ("add_sub", "tiny_cnn")  # python backend, TorchScript

# MA runs a whole profile (73 s here, 163 s on a busier machine) under its own 900-s limit;
# pytest's 300-s default must not cut it first
pytestmark = pytest.mark.timeout(900)


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for model in MODELS:
        shutil.copytree(EXAMPLES / model, repo / model)
    return repo


def ma_profile(tmp_path: Path, repo: Path, settings: dict) -> dict[str, list[dict[str, str]]]:
    """One `model-analyzer profile -f` of NVIDIA's MA; its inference CSV's rows by model."""
    assert PEER.exists(), "the set-up (make test) installs NVIDIA's Model Analyzer into .venv/peers"
    config = tmp_path / "ma.yaml"
    config.write_text(yaml.safe_dump({
        "model_repository": str(repo),
        "output_model_repository_path": str(tmp_path / "out"),
        "override_output_model_repository": True,
        "export_path": str(tmp_path / "exp"),
        "checkpoint_directory": str(tmp_path / "ckpt"),
        "perf_analyzer_path": str(PERF_ANALYZER),
        "concurrency": [1],
        "profile_models": {model: {"cpu_only": True} for model in MODELS},
        # what is tested is MA driving our worker, not a quiet machine: perf_analyzer's
        # stability rule would retry windows (and MA double them) while other tests run
        "perf_analyzer_flags": {"stability-percentage": 100},
        **settings,
    }))  # fmt: skip
    done = subprocess.run([str(PEER), "profile", "-f", str(config)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows: dict[str, list[dict[str, str]]] = {}
    with open(tmp_path / "exp" / "results" / "metrics-model-inference.csv", newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["Model"], []).append(row)
    return rows


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_ma_local_mode_runs_our_worker_as_its_tritonserver(tmp_path):
    """`triton_server_path: model-analyzer-server`: MA starts and stops the worker with
    tritonserver's command line, loads the default and a searched variant of each model from its
    output repository (max_batch_size 1 with dynamic batching), and measures both."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = tmp_path / "server.log"
    rows = ma_profile(tmp_path, repository(tmp_path), {
        "triton_launch_mode": "local",
        "triton_server_path": str(SERVER),
        "triton_output_path": str(log),
        "triton_http_endpoint": f"localhost:{http}",
        "triton_grpc_endpoint": f"localhost:{grpc}",
        "triton_metrics_url": f"http://localhost:{metrics}/metrics",
        "run_config_search_max_instance_count": 1,
        "run_config_search_max_model_batch_size": 1,
    })  # fmt: skip
    for model in MODELS:
        configs = {row["Model Config Path"]: row for row in rows[model]}
        assert set(configs) == {f"{model}_config_default", f"{model}_config_0"}, rows
        assert configs[f"{model}_config_0"]["Max Batch Size"] == "1"
        assert all(float(row["Throughput (infer/sec)"]) > 0 for row in configs.values())
    assert f"grpc=127.0.0.1:{grpc}" in log.read_text()  # MA's ports, our ready line
    assert not any(listening(port) for port in (http, grpc, metrics))  # MA stopped it


def test_ma_remote_mode_profiles_a_worker_we_started(tmp_path):
    """`triton_launch_mode: remote` with `dcgm_disable`, as MA asks for a server it does not
    start: each model's default config, loaded through the repository API, measured."""
    repo = repository(tmp_path)
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "*")
    try:
        rows = ma_profile(tmp_path, repo, {
            "triton_launch_mode": "remote",
            "dcgm_disable": True,
            "triton_http_endpoint": served.http,
            "triton_grpc_endpoint": served.grpc,
            "triton_metrics_url": served.metrics,
            "run_config_search_disable": True,
        })  # fmt: skip
    finally:
        assert served.stop() == 0
    for model in MODELS:
        assert [row["Model Config Path"] for row in rows[model]] == [f"{model}_config_default"]
        assert float(rows[model][0]["Throughput (infer/sec)"]) > 0


# run by the peer's own interpreter: MA's keys and defaults, from its config classes
_MA_KEYS = """
import json
from model_analyzer.config.input.config_command_profile import ConfigCommandProfile
from model_analyzer.config.input.config_command_report import ConfigCommandReport

def plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return None

print(json.dumps({
    **{name: {key: plain(f.default_value()) for key, f in cls()._fields.items()}
       for name, cls in (("profile", ConfigCommandProfile), ("report", ConfigCommandReport))},
    "flags": {key: f.flags() for key, f in ConfigCommandProfile()._fields.items() if f.flags()},
}))
"""
SAMPLES = {  # keys whose MA default is None (or a path of MA's working folder), with a value
    "checkpoint_directory": "ckpt", "output_model_repository_path": "out", "export_path": "exp",
    "perf_analyzer_flags": {"percentile": 95}, "genai_perf_flags": {"streaming": True},
    "triton_server_flags": {"log-verbose": 1}, "triton_server_environment": {"OMP_NUM_THREADS": 2},
    "triton_docker_args": {"cpuset_cpus": "1"}, "constraints": {"perf_latency_p99": {"max": 50}},
    "weighting": 2, "concurrency": [1, 2], "request_rate": None, "cpu_only_composing_models": [],
    "perf_output_path": "pa.log", "triton_output_path": "server.log",
    "triton_docker_mounts": ["/tmp:/tmp:ro"], "triton_docker_labels": {"team": "a"},
    "triton_docker_shm_size": "1g", "latency_budget": 50, "min_throughput": 10,
}  # fmt: skip


FLAG_SAMPLES = {"concurrency": [1, 2], "request_rate": [16], "latency_budget": 50,
                "min_throughput": 10, "triton_output_path": "server.log",
                "perf_output_path": "pa.log", "triton_docker_mounts": ["/tmp:/tmp:ro"],
                "triton_docker_shm_size": "1g", "cpu_only_composing_models": ["add_sub"],
                "bls_composing_models": ["add_sub"], "ensemble_composing_models": ["add_sub"],
                "optuna_min_trials": 20}  # fmt: skip


def test_every_ma_key_is_accepted_and_listed_in_the_readme(tmp_path):
    """MA 1.58's own key list (from the peer): a YAML file with every profile key (MA's default,
    or a sample value) loads with no error, only notes; every flag of MA's profile command line
    is accepted; every report key is accepted by `report`; each profile key has its row in the
    README's table."""
    from analyzer.commands.report import REPORT_KEYS
    from analyzer.config.profile_config import load_profile_config

    python = PEER.parent / "python"
    assert python.exists(), "the set-up (make test) installs NVIDIA's MA into .venv/peers"
    done = subprocess.run([str(python), "-c", _MA_KEYS], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys = json.loads(done.stdout)
    assert len(keys["profile"]) >= 81 and len(keys["report"]) == 7
    settings = {key: SAMPLES.get(key, default) for key, default in keys["profile"].items()}
    settings.update(model_repository=str(EXAMPLES), profile_models={"add_sub": {
        "cpu_only": True, "weighting": 1, "triton_server_environment": {"A": "b"},
        "triton_docker_args": {"shm_size": "1g"}, "genai_perf_flags": {}}})  # fmt: skip
    settings = {k: v for k, v in settings.items() if v is not None and k != "config_file"}
    config = tmp_path / "all.yaml"
    config.write_text(yaml.safe_dump(settings))
    loaded = load_profile_config(["-f", str(config)], cwd=tmp_path)
    assert loaded.triton_server_environment == {"OMP_NUM_THREADS": "2"}
    assert loaded.models[0].triton_server_environment == {"A": "b"}
    assert set(keys["report"]) <= set(REPORT_KEYS)
    readme = (ROOT / "README.md").read_text()
    missing = [key for key in keys["profile"] if f"| `{key}` |" not in readme]
    assert not missing, f"README's MA key table lacks {missing}"
    # every flag of MA's profile command line, with MA's default (or a sample) as its value
    repo = ["-m", str(EXAMPLES), "--profile-models", "add_sub"]
    assert len(keys["flags"]) >= 70
    for key, flags in keys["flags"].items():
        if key in ("config_file", "model_repository", "profile_models"):
            continue
        value = FLAG_SAMPLES.get(key, keys["profile"][key])
        for flag in flags:
            if isinstance(value, bool):
                argv = [flag]
            else:
                argv = [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
            load_profile_config([*repo, *argv], cwd=tmp_path)  # raises on a refused flag


# run by the peer's interpreter: MA's own parser on a command line, its resulting settings
_MA_PARSE = """
import json, sys
from model_analyzer.cli.cli import CLI
from model_analyzer.config.input.config_command_profile import ConfigCommandProfile
from model_analyzer.config.input.config_command_report import ConfigCommandReport

config = ConfigCommandProfile()
cli = CLI()
cli.add_subcommand(cmd="profile", help="", config=config)
cli.add_subcommand(cmd="report", help="", config=ConfigCommandReport())
sys.argv = ["model-analyzer", "profile", *json.loads(sys.argv[1])]
_, config = cli.parse()
models = {m.model_name(): {"objectives": m.objectives(), "constraints": m.constraints() or {},
                           "parameters": m.parameters(),
                           "perf_analyzer_flags": m.perf_analyzer_flags() or {}}
          for m in config.profile_models}
values = {k: f.value() for k, f in config._fields.items() if k != "profile_models"}
print(json.dumps({"values": values, "models": models}, default=repr))
"""
MA_YAML = """
objectives: {perf_latency_p99: 10, perf_throughput: 5}
constraints: {perf_latency_p99: {max: 100}}
latency_budget: 200
num_configs_per_model: 2
perf_analyzer_flags: {max-trials: 7}
profile_models:
  add_sub:
    parameters: {concurrency: [1, 2, 4], batch_sizes: [1, 2]}
    perf_analyzer_flags: {percentile: 95, measurement-interval: 500}
  tiny_cnn:
    objectives: {perf_throughput: 10}
    constraints: {perf_throughput: {min: 50}}
"""
MA_LINES = [  # MA command lines as its users type them
    "--profile-models add_sub,tiny_cnn -b 1,2 -c 1,4 --latency-budget 50 --min-throughput 10 "
    "--run-config-search-max-concurrency 64",
    "--profile-models add_sub --run-config-search-mode quick --run-config-search-max-instance-count"
    " 3 --run-config-search-max-model-batch-size 16 --client-protocol http "
    "--num-configs-per-model 2",
    "--profile-models add_sub --request-rate-search-enable --run-config-search-max-request-rate 256"
    " --early-exit-enable --run-config-search-min-request-rate 32",
    "--profile-models add_sub --run-config-search-mode optuna --optuna-min-trials 10 "
    "--optuna-max-trials 30 --use-concurrency-formula --concurrency-sweep-disable "
    "--min-percentage-of-search-space 3",
    "-f {yaml}",
    "--profile-models add_sub --run-config-search-disable",
    "--profile-models add_sub --run-config-search-disable --request-rate-search-enable",
]


def _same(ma, ours) -> bool:
    """Equal as MA and we write them: numbers as numbers, flag values as text."""
    if isinstance(ma, dict) and isinstance(ours, dict):
        return set(ma) == set(ours) and all(_same(ma[k], ours[k]) for k in ma)
    if isinstance(ma, list) and isinstance(ours, list):
        return len(ma) == len(ours) and all(map(_same, ma, ours))
    if isinstance(ma, int | float) and isinstance(ours, int | float):
        return float(ma) == float(ours)
    return str(ma) == str(ours)


def test_ma_and_we_read_ma_command_lines_and_files_alike(tmp_path):
    """Issue 15's item 7: MA 1.58's own parser and ours on the same command lines and the same
    YAML file: every key given, and each model's objectives, constraints (latency_budget and
    min_throughput over a model's own, as MA applies them), load parameters and perf_analyzer
    flags (a model's own replacing the run's), come out the same."""
    import shlex

    from analyzer.config.profile_config import load_profile_config

    python = PEER.parent / "python"
    assert python.exists(), "the set-up (make test) installs NVIDIA's MA into .venv/peers"
    (tmp_path / "ma.yaml").write_text(MA_YAML)
    env = {"PATH": f"{PERF_ANALYZER.parent}:/usr/bin:/bin"}  # MA checks perf_analyzer is there
    for line in MA_LINES:
        argv = ["-m", str(EXAMPLES), *shlex.split(line.format(yaml=tmp_path / "ma.yaml"))]
        done = subprocess.run([str(python), "-c", _MA_PARSE, json.dumps(argv)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        ma = json.loads(done.stdout.splitlines()[-1])
        ours = load_profile_config(argv, cwd=tmp_path)
        given = [a[2:].replace("-", "_") for a in argv if a.startswith("--")]
        given += [k for k in yaml.safe_load(MA_YAML) if "-f" in argv]
        for key in given:
            if key in ("profile_models", "objectives", "constraints"):
                continue  # compared per model below
            key = {"b": "batch_sizes", "c": "concurrency"}.get(key, key)
            assert _same(ma["values"][key], getattr(ours, key)), (line, key)
        for spec in ours.models:
            theirs = ma["models"][spec.name]
            assert _same(theirs["objectives"], spec.objectives), (line, spec.name)
            constraints = theirs["constraints"]
            if isinstance(constraints, str):  # MA's constraints object, printed as a dict
                import ast

                constraints = ast.literal_eval(constraints)
            assert _same(constraints, spec.constraints), (line, spec.name)
            # MA's optuna mode leaves batch_sizes empty when not given: client batch 1
            theirs["parameters"]["batch_sizes"] = theirs["parameters"]["batch_sizes"] or [1]
            for key in ("batch_sizes", "concurrency", "request_rate"):
                assert _same(theirs["parameters"][key], getattr(spec, key)), (line, key)
            assert _same(theirs["perf_analyzer_flags"], spec.perf_analyzer_flags), line
