"""NVIDIA's Model Analyzer 1.58 drives our worker (issue 15): the strongest test of compatibility
is the tool our users come from. The set-up installs it from PyPI into its own venv as a peer
(scripts/install_ma_peer.sh), as it installs perf_analyzer. In MA's local launch mode it starts
`model-analyzer-server` as its tritonserver, loads each variant with a config override and measures
it with perf_analyzer; in its remote mode it profiles a worker we started. Both must end with
result rows for a python model and a TorchScript model."""

from __future__ import annotations

import csv
import shutil
import socket
import subprocess
from pathlib import Path

import yaml
from serving import EXAMPLES, ROOT, free_port, start_worker

PEER = ROOT / ".venv" / "peers" / "model-analyzer" / "bin" / "model-analyzer"
SERVER = ROOT / ".venv" / "bin" / "model-analyzer-server"
PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"
MODELS = ("add_sub", "tiny_cnn")  # python backend, TorchScript


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
