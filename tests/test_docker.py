"""`profile --triton-launch-mode=docker`: the worker in a container of the image the set-up
builds from local files (scripts/build_worker_image.sh), on a dockerd with no iptables rules and
no IP forwarding (scripts/start_dockerd.sh). The worker runs as uid 1000, never root; on a
bridge its ports are published on 127.0.0.1 only; its repository API answers only the key."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_launch_safety import start_with_its_http_port_taken
from test_profile import EXAMPLES, FAST, ROOT, SEED, profile, read_csv
from tritonclient.utils import InferenceServerException

from analyzer.launch.base import LaunchSetupError
from analyzer.launch.docker import DockerLauncher

IMAGE = "model-analyzer-worker:test"
# pytest-timeout counts fixture setup: whichever test comes first also waits for the image fixture,
# whose steps have their own limits (120 + 900 s); a fresh clone's base image took 176 s there
# under three test processes, and with the seed test's 124 s passed the default 300 s
pytestmark = pytest.mark.timeout(300 + 120 + 900)


@pytest.fixture(scope="module")
def image():
    """dockerd running and the worker image built from this checkout (no registry pull)."""
    for script, timeout in (("start_dockerd.sh", 120), ("build_worker_image.sh", 900)):
        done = subprocess.run(["bash", str(ROOT / "scripts" / script), IMAGE],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "VENV": str(Path(sys.prefix))})  # fmt: skip
        assert done.returncode == 0, f"{script}: {done.stdout}{done.stderr}"
    return IMAGE


def _containers() -> list[str]:
    done = subprocess.run(["docker", "ps", "-aq", "--filter", "label=model-analyzer.worker"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done.stdout.split()


def _workers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--exit-on-stdin-eof" in cmd:  # the container's `tritonserver`: our worker
            found.append(proc)
    return found


def test_the_seed_command_in_docker_gives_what_local_mode_gives(image, tmp_path):
    rows = {}
    for mode in ("local", "docker"):
        folder = tmp_path / mode
        folder.mkdir()
        args = [a if a != "--triton-launch-mode=local" else f"--triton-launch-mode={mode}"
                for a in SEED]  # fmt: skip
        run = profile(folder, *args, "--triton-docker-image", image,
                      "--triton-docker-labels", "purpose=test", *FAST)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        text = " ".join(run.stdout.split())
        assert "Best config for add_sub: add_sub_config_" in text
        exp = folder / "EXP"
        for name in ("metrics-model-inference.csv", "metrics-model-gpu.csv",
                     "metrics-server-only.csv", "profile_results.json"):  # fmt: skip
            assert (exp / "results" / name).exists(), name
        assert (exp / "reports" / "summaries" / "add_sub" / "result_summary.html").exists()
        rows[mode] = read_csv(exp / "results" / "metrics-model-inference.csv")
        configs = sorted(p.name for p in (folder / "OUT").iterdir())
        rows[mode + "-configs"] = configs
    assert rows["docker-configs"] == rows["local-configs"]
    shape = lambda r: (r["Model Config Path"], r["Concurrency"], r["Instance Group"],  # noqa: E731
                       r["Max Batch Size"])
    assert sorted(map(shape, rows["docker"])) == sorted(map(shape, rows["local"]))
    assert all(float(r["RAM Usage (MB)"]) > 0 for r in rows["docker"])  # the container's worker
    log = (tmp_path / "docker" / "EXP" / "logs" / "worker.log").read_text()
    assert "model-analyzer serve ready" in log  # the container's output, captured
    assert not _containers()


def test_killing_the_analyzer_leaves_no_container_and_no_worker(image, tmp_path):
    args = [a if a != "--triton-launch-mode=local" else "--triton-launch-mode=docker"
            for a in SEED]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", "profile", *args, "--triton-docker-image", image,
         *FAST], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    checkpoint = tmp_path / "EXP" / "checkpoints" / "profile.ckpt.jsonl"
    deadline = time.monotonic() + 300
    while not (checkpoint.exists() and '"type": "point"' in checkpoint.read_text()):
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _containers() and _workers()  # mid-run: the worker's container is up
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    for _ in range(300):  # the worker sees its stdin close, exits; docker removes the container
        if not _containers() and not _workers():
            break
        time.sleep(0.1)
    assert not _containers()
    assert not _workers()


def test_a_missing_image_is_one_clear_error(image, tmp_path):
    run = profile(tmp_path, *SEED[:-6], "--triton-launch-mode", "docker",
                  "--triton-docker-image", "model-analyzer-worker:nosuch", *FAST)  # fmt: skip
    assert run.returncode == 2
    assert "docker image 'model-analyzer-worker:nosuch' is not on this machine" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_an_unreachable_daemon_is_one_clear_error(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no.sock'}", "COLUMNS": "160"}
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "--model-repository", str(EXAMPLES),
         "--profile-models", "add_sub", "--triton-launch-mode", "docker", *FAST],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert run.returncode == 2
    assert f"the Docker daemon at unix://{tmp_path / 'no.sock'} is unreachable" in run.stderr
    assert not (tmp_path / "output_models").exists()  # said before anything was written


def _uids(pid: int) -> set[int]:
    """Real, effective, saved and filesystem uids of a host process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return {int(uid) for uid in line.split()[1:]}
    raise AssertionError(f"no Uid line for {pid}")


def _listening(port: int) -> set[str]:
    """The host's addresses listening on `port` (gRPC's v4-mapped IPv6 socket counts as IPv4)."""
    return {c.laddr.ip.removeprefix("::ffff:") for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}  # fmt: skip


def _add_sub(grpc_url: str, http_url: str) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), dtype=np.float32)
    for module, url in ((grpcclient, grpc_url), (httpclient, http_url)):
        client = module.InferenceServerClient(url)
        inputs = [module.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)  # via /dev/shm
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.close()


@pytest.mark.parametrize("network", ["host", "bridge"])
def test_the_container_worker_is_not_root_keeps_its_api_and_listens_on_loopback_only(
    image, tmp_path, network
):
    launcher = DockerLauncher(image, EXAMPLES, EXAMPLES, tmp_path / "logs" / "worker.log",
                              run_args={"network_mode": network})  # fmt: skip
    try:
        launcher.start()
        info = launcher.client.api.inspect_container(launcher.container_id)
        assert info["Config"]["User"] == "1000:1000"
        assert info["HostConfig"]["NetworkMode"] == network
        assert info["Path"] == "tritonserver" and "--exit-on-stdin-eof" in info["Args"]
        assert launcher.repository_key not in " ".join(info["Args"])
        assert launcher.pid and _uids(launcher.pid) == {1000}
        if network == "bridge":
            published = info["NetworkSettings"]["Ports"]
            assert {b["HostIp"] for bound in published.values() for b in bound} == {"127.0.0.1"}
            assert len(published) == 3
        for port in launcher.ports.values():
            assert _listening(port) == {"127.0.0.1"}, port  # no port on any other address
        client = httpclient.InferenceServerClient(launcher.http_url)
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("add_sub")
        assert refused.value.status() == "403"
        launcher.load("add_sub")
        stubs = psutil.Process(launcher.pid).children(recursive=True)
        assert stubs and all(_uids(p.pid) == {1000} for p in stubs)
        _add_sub(launcher.grpc_url, launcher.http_url)
        client.close()
        assert stat.S_IMODE(launcher.log_path.stat().st_mode) == 0o600  # may carry model output
    finally:
        launcher.stop()
    assert not _containers()


def test_a_repository_the_container_user_cannot_read_is_one_clear_error(image, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    os.chmod(repo, 0o700)  # root's own, as a repository under /root would be
    launcher = DockerLauncher(image, repo, repo, tmp_path / "worker.log")
    with pytest.raises(LaunchSetupError) as refused:
        launcher.start()
    assert str(refused.value).startswith(
        f"the docker worker runs as user 1000:1000 (not root) and cannot read {repo} (mode 0700")
    assert f"chmod -R o+rX {repo}" in str(refused.value)
    assert '--triton-docker-args {"user": "UID:GID"}' in str(refused.value)
    assert launcher.container_id is None and not _containers()
    os.chmod(repo, 0o755)
    model = repo / "add_sub" / "1" / "model.py"
    os.chmod(model, 0o600)
    with pytest.raises(LaunchSetupError, match=f"cannot read {model} \\(mode 0600, owner uid 0\\)"):
        launcher.load("add_sub")  # said before the worker fails on it
    launcher.user = "0"  # an explicit choice of root reads everything: no refusal
    launcher._check_readable(repo / "add_sub", walk=True)


def test_a_port_taken_before_the_container_binds_it_is_chosen_again(image, tmp_path):
    launcher = DockerLauncher(image, EXAMPLES, EXAMPLES, tmp_path / "logs" / "worker.log")
    try:
        start_with_its_http_port_taken(launcher)
    finally:
        launcher.stop()
    assert not _containers()


def test_an_image_that_is_not_ours_runs_as_triton_would(image, tmp_path):
    """Docker mode runs `tritonserver <flags>` as MA does, so a Triton image works unchanged. An
    image without our label (ours, relabelled: its `tritonserver` is our worker) gets Triton's
    command line only -- a bind address per protocol, no lifeline flag -- and is ready when its
    HTTP port says so, with no ready line of ours to wait for."""
    foreign = "model-analyzer-triton-like:test"
    done = subprocess.run(["docker", "build", "--network", "none", "-q", "-t", foreign, "-"],
                          input=f'FROM {image}\nLABEL model-analyzer.source=""\n',
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    launcher = DockerLauncher(foreign, EXAMPLES, EXAMPLES, tmp_path / "worker.log",
                              extra_flags={"log-verbose": 1})  # fmt: skip
    try:
        launcher.start()
        assert not launcher.ours
        info = launcher.client.api.inspect_container(launcher.container_id)
        assert info["Path"] == "tritonserver"
        assert "--exit-on-stdin-eof" not in info["Args"]
        for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                     "--metrics-address=127.0.0.1", "--model-control-mode=explicit",
                     "--log-verbose=1"):  # fmt: skip
            assert flag in info["Args"], info["Args"]
        launcher.load("add_sub")
        _add_sub(launcher.grpc_url, launcher.http_url)
    finally:
        launcher.stop()
        # this test made the image: left behind, it would keep a rebuilt worker's old base alive
        subprocess.run(["docker", "image", "rm", foreign], capture_output=True, timeout=120)
    assert not _containers()


# MA's whole profile, under ma_profile's own 900-s limit (test_ma_peer), and maybe the image
@pytest.mark.timeout(900 + 120 + 900)
def test_nvidia_ma_docker_mode_runs_our_image(image, tmp_path):
    """NVIDIA's MA 1.58 in its docker mode: it runs `bash -c "tritonserver <flags>"` in our image
    on a bridge network with its ports published, loads each variant with a config override and
    measures it with perf_analyzer. Our worker binds loopback unless told, so the MA file says
    `http-address: 0.0.0.0` in triton_server_flags (the container's own network); the variants
    MA writes link to the model files, so the repository is mounted at its own path."""
    from serving import free_port
    from test_ma_peer import MODELS, ma_profile, repository

    repo = repository(tmp_path)
    http, grpc, metrics = free_port(), free_port(), free_port()
    try:
        rows = ma_profile(tmp_path, repo, {
            "triton_launch_mode": "docker",
            "triton_docker_image": image,
            "triton_docker_mounts": [f"{repo}:{repo}:ro"],
            "triton_docker_args": {"user": "0:0"},  # pytest's folders are root's, mode 0700
            "triton_server_flags": {"http-address": "0.0.0.0"},
            "triton_output_path": str(tmp_path / "server.log"),
            "triton_http_endpoint": f"localhost:{http}",
            "triton_grpc_endpoint": f"localhost:{grpc}",
            "triton_metrics_url": f"http://localhost:{metrics}/metrics",
            "run_config_search_disable": True,
        })  # fmt: skip
        for model in MODELS:
            assert [row["Model Config Path"] for row in rows[model]] == [f"{model}_config_default"]
            assert float(rows[model][0]["Throughput (infer/sec)"]) > 0
        assert "model-analyzer serve ready" in (tmp_path / "server.log").read_text()
    finally:  # a container MA left (it failed or was stopped) is removed, then reported
        done = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={image}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        left = done.stdout.split()
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=120)
    assert not left  # MA stopped its container
