"""`profile --triton-launch-mode=remote` against a separately started `model-analyzer serve
--model-control-mode explicit`: the same search and ranking as local mode, nothing written on the
server's side, every variant unloaded after."""

from __future__ import annotations

from pathlib import Path

from serving import start_worker
from test_profile import FAST, profile, repo_with, results

# Each execution sleeps 20 ms whatever the batch: capacity is (batch x instances) / 20 ms, so
# the ranking is decided by the config, not by the machine's noise.
SLEEPY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.02)
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return out
'''


def _args(repo: Path, *extra: str) -> list[str]:
    return [
        "--model-repository", str(repo), "--profile-models", "sleepy",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-max-concurrency", "8", "--run-config-search-max-model-batch-size",
        "4", "--run-config-search-max-instance-count", "2", "--search-space", "SPACE",
        "--client-protocol", "http", *FAST,
        # the search's ranking is what must match: the final comparison's ties at FAST's two
        # rounds are decided by noise, differently in each run
        "--final-rounds", "0", *extra,
    ]  # fmt: skip


def _ranking(folder: Path) -> tuple[list, set, set]:
    configs = [c for c in results(folder / "EXP")["models"][0]["configs"] if c["measurements"]]
    ranked = sorted(configs, key=lambda c: c["rank"])
    shape = lambda c: (c["description"]["instance_group"], c["description"]["max_batch_size"])  # noqa: E731
    points = {(shape(c), m["value"]) for c in configs for m in c["measurements"]}
    return [shape(c) for c in ranked], {shape(c) for c in configs}, points


def test_remote_mode_ranks_like_local_mode_against_a_separate_server(tmp_path):
    repo = repo_with(tmp_path, "sleepy", SLEEPY)
    config = repo / "sleepy" / "config.pbtxt"  # its own max_batch_size 2: a clear-cut winner
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 2"))
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    for mode in ("local", "remote"):
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "SPACE").write_text(
            "dynamic_batching: {max_queue_delay_microseconds: [0]}\n")
    local = profile(tmp_path / "local", *_args(repo))
    assert local.returncode == 0, local.stdout + local.stderr

    server = start_worker(repo, "--model-control-mode", "explicit")
    try:
        remote = profile(tmp_path / "remote", *_args(
            repo, "--triton-launch-mode", "remote", "--triton-http-endpoint", server.http,
            "--triton-grpc-endpoint", server.grpc, "--triton-metrics-url", server.metrics))
        assert remote.returncode == 0, remote.stdout + remote.stderr
        assert server.process.poll() is None  # the server is not ours to stop
        import urllib.request

        with urllib.request.urlopen(f"http://{server.http}/v2/repository/index",
                                    data=b"{}") as answer:  # fmt: skip
            index = answer.read().decode()
        assert '"READY"' not in index  # every variant unloaded after its measurement
    finally:
        assert server.stop() == 0, "".join(server.output)

    assert sorted(p.relative_to(repo) for p in repo.rglob("*")
                  if "__pycache__" not in p.parts) == [p for p in before
                                                       if "__pycache__" not in p.parts]
    local_rank, local_configs, local_points = _ranking(tmp_path / "local")
    remote_rank, remote_configs, remote_points = _ranking(tmp_path / "remote")
    assert remote_configs == local_configs and remote_points == local_points
    assert remote_rank[0] == local_rank[0]
    assert local_rank[0][1] == 4 and local_rank[0][0].startswith("2")  # 2 instances, batch 4
    # the winner's folder is a ready-to-serve config in remote mode too
    document = results(tmp_path / "remote" / "EXP")
    winner = min((c for c in document["models"][0]["configs"] if c["measurements"]),
                 key=lambda c: c["rank"])  # fmt: skip
    assert (Path(winner["path"]) / "config.pbtxt").exists()
