"""`profile --triton-launch-mode=docker`: the worker in a container of the image the set-up
builds from local files (scripts/build_worker_image.sh), on a dockerd started with no bridge and
no iptables rules (scripts/start_dockerd.sh)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_profile import EXAMPLES, FAST, ROOT, SEED, profile, read_csv

IMAGE = "model-analyzer-worker:test"


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
        if "serve" in cmd and "--exit-on-stdin-eof" in cmd:
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
