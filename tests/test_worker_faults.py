"""Faults in python models against a real worker: hangs, kills, a full tmpfs; the metrics port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from serving import start_worker
from tritonclient.utils import InferenceServerException

from analyzer.worker.limits import Limits
from analyzer.worker.metrics import MetricsServer, escape_label

EXIT_TIMEOUT_S = 15  # ServeOptions.exit_timeout_s
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
# X[0] seconds of sleep (after touching MARK), then Y = zeros(X[1]) when X has two elements.
MODEL = """
import time
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            Path({mark!r}).touch()
            time.sleep(float(x[0]))
            y = np.zeros(int(x[1]), np.float32) if len(x) == 2 else x
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""


def python_repo(tmp_path: Path, name: str = "slow") -> tuple[Path, Path]:
    """A repository with one python model (see MODEL); returns it and the model's marker file."""
    repo, mark = tmp_path / "repo", tmp_path / "executing"
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(MODEL.format(mark=str(mark)))
    return repo, mark


def infer(url: str, x: np.ndarray, timeout: float = 120) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=timeout)
    try:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x.astype(np.float32))
        return client.infer("slow", [tensor]).as_numpy("Y")
    finally:
        client.close()


def infer_in_background(url: str, x: np.ndarray) -> tuple[threading.Thread, list]:
    """Send one request from a thread; the list gets its result or the exception it raised."""
    outcome: list = []

    def send() -> None:
        try:
            outcome.append(infer(url, x))
        except Exception as err:  # an error answer or a closed connection, both recorded
            outcome.append(err)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, outcome


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stubs_of(worker: subprocess.Popen) -> list[psutil.Process]:
    children = psutil.Process(worker.pid).children(recursive=True)
    return [p for p in children if "analyzer.worker.backends.python_stub" in p.cmdline()]


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def shm_dir(monkeypatch):
    """A private folder on /dev/shm for the worker's tensors: other tests' files stay out."""
    folder = tempfile.mkdtemp(prefix="ma-test-shm-", dir="/dev/shm")
    monkeypatch.setenv("MODEL_ANALYZER_SHM_DIR", folder)
    try:
        yield Path(folder)
    finally:
        for leftover in Path(folder).iterdir():
            leftover.unlink()
        os.rmdir(folder)


def shm_fds(pid: int, folder: Path) -> list[os.stat_result]:
    """stat of every open file of `pid` that lives (or lived, unnamed) in `folder`."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"{folder}/"):
                found.append(os.stat(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:  # closed meanwhile
            continue
    return found


def test_sigterm_with_a_hung_execute_exits_in_time_and_kills_the_stub(tmp_path, shm_dir):
    repo, mark = python_repo(tmp_path)
    served = start_worker(repo)
    try:
        stubs = stubs_of(served.process)
        assert stubs, "the python model runs in no stub process"
        thread, outcome = infer_in_background(served.http, np.array([1000.0]))
        wait_for(mark.exists, 60, "the model's execute to start")
        # while the execute hangs: the metrics port answers and our shm files are 0600, unnamed
        text = urllib.request.urlopen(served.metrics, timeout=30).read().decode()
        assert 'nv_inference_request_success{model="slow",version="1"} 0' in text
        for pid in (served.process.pid, stubs[0].pid):
            files = shm_fds(pid, shm_dir)
            assert files, f"process {pid} holds no shared-memory file in {shm_dir}"
            assert all(stat.S_IMODE(f.st_mode) == 0o600 for f in files)
        assert list(shm_dir.iterdir()) == []  # nameless: nothing for anyone to open
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(EXIT_TIMEOUT_S + 10)  # the bound, plus room for a loaded machine
        wait_for(lambda: all(gone(p) for p in stubs), 10, "the stub processes to go")
        thread.join(30)
        assert not thread.is_alive(), "the client was neither answered nor disconnected"
        assert isinstance(outcome[0], Exception)  # nothing computed it: an error or a close
        if isinstance(outcome[0], InferenceServerException):
            assert "stopped" in str(outcome[0]) or "unloaded" in str(outcome[0])
    finally:
        served.stop()


def test_sigkill_of_the_worker_leaves_no_stub_and_no_shm_file(tmp_path, shm_dir):
    repo, mark = python_repo(tmp_path)
    served = start_worker(repo)
    try:
        stubs = stubs_of(served.process)
        assert stubs
        # in the worker's process group, so a launcher's killpg reaches them as well
        assert {os.getpgid(p.pid) for p in stubs} == {os.getpgid(served.process.pid)}
        # serving: a few small requests done, a larger one in the middle of its execute
        for _ in range(3):
            assert infer(served.http, np.array([0.0, 1.0, 2.0])).tolist() == [0.0, 1.0, 2.0]
        mark.unlink()
        thread, _ = infer_in_background(served.http, np.full(300_000, 1000.0))
        wait_for(mark.exists, 60, "the model's execute to start")
        assert shm_fds(stubs[0].pid, shm_dir)
        served.process.kill()
        served.process.wait(30)
        wait_for(lambda: all(gone(p) for p in stubs), 10, "the stub processes to die")
        assert list(shm_dir.iterdir()) == []
        thread.join(30)
    finally:
        served.stop()


@pytest.fixture
def small_tmpfs(tmp_path, monkeypatch):
    """A 3 MiB tmpfs as the worker's shm folder: Docker's default --shm-size, only smaller."""
    folder = tmp_path / "shm"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(folder)], check=True
    )
    monkeypatch.setenv("MODEL_ANALYZER_SHM_DIR", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_full_tmpfs_is_a_clean_error_and_the_worker_serves_on(tmp_path, small_tmpfs):
    repo, _ = python_repo(tmp_path)
    served = start_worker(repo)
    try:
        big_input = np.zeros(1 << 20)  # 4 MiB of FP32 inputs: the worker cannot reserve them
        with pytest.raises(InferenceServerException) as err:
            infer(served.http, big_input)
        assert "cannot reserve 4.0 MiB of shared memory" in str(err.value)
        assert err.value.status() == "503"
        with pytest.raises(InferenceServerException) as err:  # the stub cannot reserve outputs
            infer(served.http, np.array([0.0, float(1 << 20)]))
        assert "cannot reserve 4.0 MiB of shared memory" in str(err.value)
        assert err.value.status() == "503"
        assert served.process.poll() is None
        assert infer(served.http, np.array([0.0, 4.0])).tolist() == [0.0] * 4
        assert infer(served.http, np.array([0.0, 7.0, 8.0])).tolist() == [0.0, 7.0, 8.0]
    finally:
        served.stop()


HANG_INIT = """
import time
from pathlib import Path

class TritonPythonModel:
    def initialize(self, args):
        Path({mark!r}).touch()
        time.sleep(3600)

    def execute(self, requests):
        return []
"""
HANG_WARMUP = """
import time

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(3600)
        return []
"""
WARMUP = """
model_warmup [ { name: "w" batch_size: 1
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
"""


def test_a_load_past_model_load_timeout_fails_and_stops_the_models_processes(tmp_path):
    """Triton waits for a model's load code as long as it runs; --model-load-timeout-secs
    bounds it: the load's answer names the limit and what was still running, and the model's
    process is stopped (before, initialize() had a fixed 120 s, and its stub was left to a
    finalize it could not answer)."""
    repo, mark = python_repo(tmp_path)
    for name, code, extra in (("hang_init", HANG_INIT, ""), ("hang_warmup", HANG_WARMUP, WARMUP)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name) + extra)
        (repo / name / "1" / "model.py").write_text(code.format(mark=str(mark)))
    served = start_worker(repo, "--model-control-mode", "explicit",
                          "--model-load-timeout-secs", "3")  # fmt: skip
    client = httpclient.InferenceServerClient(served.http, network_timeout=120)
    try:
        for name, running in (("hang_init", "instance hang_init_0_0's initialize() was still "
                               "running; its process was stopped"),
                              ("hang_warmup", "instance hang_warmup_0_0's warm-up "
                               "(model_warmup) was still running")):  # fmt: skip
            t0 = time.monotonic()
            with pytest.raises(InferenceServerException) as err:
                client.load_model(name)
            assert f"model '{name}' did not finish loading within 3 s " \
                   "(--model-load-timeout-secs): " + running in str(err.value)
            assert time.monotonic() - t0 < 60  # 3 s, on a loaded machine
            wait_for(lambda: not stubs_of(served.process), 10, f"{name}'s process to go")
            assert not client.is_model_ready(name)
        assert mark.exists()  # the initialize() that hung did run
        client.load_model("slow")  # the worker serves on
        assert infer(served.http, np.array([0.0, 2.0])).tolist() == [0.0, 0.0]
    finally:
        client.close()
        served.stop()


def test_the_load_timeout_flag_takes_seconds_or_zero(tmp_path):
    repo, _ = python_repo(tmp_path)
    for value in ("-1", "nan", "inf"):
        run = subprocess.run(
            [sys.executable, "-m", "analyzer", "serve", "--model-repository", str(repo),
             "--model-load-timeout-secs", value],
            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert "--model-load-timeout-secs must be a positive number of seconds" in run.stderr


def test_label_values_are_escaped_as_the_text_format_says():
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert escape_label("plain_name-1") == "plain_name-1"


SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(\\[\\"n]|[^"\\\n])*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(\\[\\"n]|[^"\\\n])*")*\})? -?[0-9.e+-]+$'
)
COMMENT = re.compile(r"^# (HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*|TYPE [a-zA-Z_:][a-zA-Z0-9_:]* "
                     r"(counter|gauge))$")  # fmt: skip


def test_the_metrics_endpoint_speaks_the_prometheus_text_format(tmp_path):
    repo, _ = python_repo(tmp_path, name="slow")
    served = start_worker(repo)
    try:
        infer(served.http, np.array([0.0]))
        with urllib.request.urlopen(served.metrics, timeout=30) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = reply.read().decode()
        assert text.endswith("\n")
        for line in text.splitlines():
            assert SAMPLE.match(line) or COMMENT.match(line), f"not Prometheus text: {line!r}"
        assert 'nv_inference_request_success{model="slow",version="1"} 1' in text
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(served.metrics.replace("/metrics", "/other"), timeout=30)
        assert err.value.code == 404
    finally:
        served.stop()


def test_metrics_are_served_while_the_starting_event_loop_is_blocked():
    """The endpoint has its own loop: a caller whose loop is stuck still gets scraped."""

    async def blocked_scrape() -> str:
        server = MetricsServer(lambda: "up 1\n", "127.0.0.1", 0, Limits())
        port = server.start()
        try:  # urlopen blocks this loop for the whole scrape
            url = f"http://127.0.0.1:{port}/metrics"
            return urllib.request.urlopen(url, timeout=30).read().decode()
        finally:
            server.stop()

    assert asyncio.run(blocked_scrape()) == "up 1\n"


def test_nvml_is_initialised_once_per_process_not_per_scrape(monkeypatch):
    import pynvml

    from analyzer.worker import metrics

    calls = []
    real_init = pynvml.nvmlInit

    def counted_init(*args):
        calls.append(args)
        return real_init(*args)

    monkeypatch.setattr(pynvml, "nvmlInit", counted_init)
    monkeypatch.setattr(metrics, "_nvml", metrics._Nvml())
    first = metrics.render_metrics([])
    second = metrics.render_metrics([])
    assert len(calls) == 1
    # the same GPU series on both scrapes: all of them with a GPU, none without
    assert gpu_series(first) == gpu_series(second)


def gpu_series(text: str) -> list[str]:
    return [line.split(" ")[0] for line in text.splitlines() if line.startswith("nv_gpu_")]
