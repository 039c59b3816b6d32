"""The local launcher keeps its worker to itself and leaves nothing behind: the repository API
answers only the per-run key the launcher holds (given in the environment, never argv), and
stop() ends the worker's whole process group, python stubs included, however the worker ends."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import stat
import threading
import time
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import EXAMPLES
from tritonclient.utils import InferenceServerException

from analyzer.launch.base import LOAD_ANSWER_MARGIN_S, Launcher, LaunchError, LoadTimeoutError
from analyzer.launch.local import LocalLauncher
from analyzer.launch.remote import RemoteLauncher
from analyzer.worker.restrict import KEY_HEADER
from analyzer.worker_session import WorkerSession, _fresh_worker_after_load_timeout

# A model with a helper process of its own (as models that run a tokenizer or a converter do),
# whose execute() marks that it started, then never returns: a request stays in flight.
HANGING = '''
import subprocess
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        self.helper = subprocess.Popen(["sleep", "3600"])

    def execute(self, requests):
        Path(MARKER).write_text("started")
        time.sleep(3600)
'''


@pytest.fixture
def launcher(tmp_path):
    made: list[LocalLauncher] = []

    def make(repository: Path = EXAMPLES, stop_timeout_s: float = 30.0) -> LocalLauncher:
        made.append(LocalLauncher(repository, tmp_path / "logs" / "worker.log",
                                  stop_timeout_s=stop_timeout_s))  # fmt: skip
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            each.stop()
            for proc in _group(each.pid) if each.pid else []:  # what a failed assertion left
                try:
                    proc.kill()
                except psutil.Error:
                    pass


def _group(pgid: int) -> list[psutil.Process]:
    """Live processes of the group (a zombie holds no port, GPU or file)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def _empty_group(pgid: int, timeout_s: float = 10.0) -> list[psutil.Process]:
    """The group's members once it is empty, or what is left after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while (left := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _stubs(pgid: int) -> list[psutil.Process]:
    return [p for p in _group(pgid) if "analyzer.worker.backends.python_stub" in p.cmdline()]


def _hanging_repo(tmp_path: Path) -> tuple[Path, Path]:
    repo, marker = tmp_path / "repo", tmp_path / "execute-started"
    shutil.copytree(EXAMPLES / "add_sub", repo / "hang")
    config = repo / "hang" / "config.pbtxt"
    config.write_text(config.read_text().replace('"add_sub"', '"hang"'))
    (repo / "hang" / "1" / "model.py").write_text(HANGING.replace("MARKER", repr(str(marker))))
    return repo, marker


def _infer_in_flight(http_url: str, model: str) -> threading.Thread:
    body = json.dumps({"inputs": [
        {"name": n, "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        for n in ("INPUT0", "INPUT1")]}).encode()  # fmt: skip

    def send() -> None:
        host, _, port = http_url.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", f"/v2/models/{model}/infer", body=body)
            conn.getresponse().read()
        except OSError:
            pass  # the worker is killed under it: that is the point
        finally:
            conn.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _wait_for(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_key_is_in_the_environment_not_argv_and_the_log_is_private(launcher):
    worker = launcher()
    worker.start()
    assert len(worker.repository_key) >= 40
    cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    assert worker.repository_key.encode() not in cmdline
    environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
    assert f"MODEL_ANALYZER_REPOSITORY_KEY={worker.repository_key}".encode() in environ
    assert stat.S_IMODE(worker.log_path.stat().st_mode) == 0o600
    assert launcher().repository_key != worker.repository_key  # one key per run


def test_the_repository_api_answers_only_the_launchers_key(launcher):
    worker = launcher()
    worker.start()
    http_client = httpclient.InferenceServerClient(worker.http_url)
    grpc_client = grpcclient.InferenceServerClient(worker.grpc_url)
    for headers in (None, {KEY_HEADER: "not-the-key"}):
        with pytest.raises(InferenceServerException) as refused:
            http_client.load_model("add_sub", headers=headers)
        assert refused.value.status() == "403"
        assert KEY_HEADER in refused.value.message()
        with pytest.raises(InferenceServerException) as refused:
            grpc_client.load_model("add_sub", headers=headers)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert KEY_HEADER in refused.value.message()
    assert not http_client.is_model_ready("add_sub")
    worker.load("add_sub")
    assert http_client.is_model_ready("add_sub")
    with pytest.raises(InferenceServerException) as refused:
        http_client.unload_model("add_sub")
    assert refused.value.status() == "403"
    grpc_client.load_model("add_sub", headers={KEY_HEADER: worker.repository_key})
    worker.unload("add_sub")
    assert not http_client.is_model_ready("add_sub")
    http_client.close()
    grpc_client.close()


def test_stop_with_a_request_hung_in_a_model_leaves_no_process(launcher, tmp_path):
    repo, marker = _hanging_repo(tmp_path)
    worker = launcher(repo, stop_timeout_s=5)
    worker.start()
    worker.load("hang")
    pgid = worker.pid
    assert _stubs(pgid), "the python model's stub is in the worker's group"
    assert any(p.cmdline() == ["sleep", "3600"] for p in _group(pgid))
    _infer_in_flight(worker.http_url, "hang")
    _wait_for(marker)
    worker.stop()
    assert not _empty_group(pgid)
    assert not worker.alive()


def test_stop_kills_a_worker_that_never_sees_sigterm(launcher):
    worker = launcher(stop_timeout_s=2)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:  # the worker and its stubs inherit the mask: SIGTERM stays pending for ever
        worker.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    worker.load("add_sub")
    process, pgid = worker.process, worker.pid
    assert process is not None and _stubs(pgid)
    worker.stop()
    assert process.returncode == -signal.SIGKILL
    assert not _empty_group(pgid)


def test_stubs_of_a_worker_killed_outright_are_killed_on_restart_and_stop(launcher, tmp_path):
    repo, marker = _hanging_repo(tmp_path)
    worker = launcher(repo)
    worker.start()
    worker.load("hang")
    pgid = worker.pid
    _infer_in_flight(worker.http_url, "hang")
    _wait_for(marker)
    os.kill(pgid, signal.SIGKILL)  # the worker alone, as the OOM killer would
    deadline = time.monotonic() + 30
    while worker.alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    left = _group(pgid)  # the helper outlives worker and stub: what the group kill is for
    assert any(p.cmdline() == ["sleep", "3600"] for p in left), left
    worker.start()  # what the profiler does after a crash
    assert not _empty_group(pgid)
    new_group = worker.pid
    assert new_group != pgid
    worker.stop()
    assert not _empty_group(new_group)


def start_with_its_http_port_taken(worker) -> None:
    """Start `worker` while another socket holds the HTTP port it chose: it must choose again."""
    with socket.socket() as thief:  # another process binds the chosen port first
        thief.bind(("127.0.0.1", worker.ports["http"]))
        thief.listen()
        taken = worker.ports["http"]
        worker.start()
        port = worker.ports["http"]
        assert port != taken and worker.http_url.endswith(f":{port}")
        assert worker.alive()
        with httpclient.InferenceServerClient(worker.http_url) as client:
            assert client.is_server_ready()


def test_a_port_taken_between_choice_and_bind_is_chosen_again(launcher):
    worker = launcher()
    start_with_its_http_port_taken(worker)
    assert worker.starts == 2


def test_a_worker_that_cannot_start_says_why_on_the_first_line(launcher, tmp_path):
    worker = launcher(tmp_path / "no-such-repository")
    with pytest.raises(LaunchError) as failed:
        worker.start()
    first = str(failed.value).splitlines()[0]
    assert "exited at start (exit code" in first and "no-such-repository" in first, first
    assert str(tmp_path / "logs" / "worker.log") in first


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a server stuck in a load)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


class _Unstarted(LocalLauncher):
    """The local launcher's repository calls against a given URL, no worker started."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        super().__init__(EXAMPLES, tmp_path / "worker.log")
        self.http_url = url


@pytest.mark.parametrize("kind", ["ours", "remote"])
def test_a_load_with_no_answer_in_time_is_a_load_timeout(silent_server, tmp_path, kind,
                                                         monkeypatch):  # fmt: skip
    """A load that never answers ends after model_load_timeout (plus the margin a worker of ours
    gets to stop the load itself) as LoadTimeoutError, which names the setting."""
    if kind == "ours":
        launcher: Launcher = _Unstarted(silent_server, tmp_path)
        assert launcher.enforces_load_timeout()
        assert f"--model-load-timeout-secs={launcher.load_timeout_s:g}" in launcher.command()
    else:
        launcher = RemoteLauncher(silent_server, silent_server, "", protocol="http")
        assert not launcher.enforces_load_timeout()
    launcher.load_timeout_s = 0.5
    margin = LOAD_ANSWER_MARGIN_S if kind == "ours" else 0.0
    assert launcher.load_wait_s() == 0.5 + margin
    monkeypatch.setattr("analyzer.launch.base.LOAD_ANSWER_MARGIN_S", 0.0)  # a short test
    t0 = time.monotonic()
    with pytest.raises(LoadTimeoutError) as err:
        launcher.load_variant("add_sub", 'name: "add_sub"\nbackend: "python"\n')
    assert time.monotonic() - t0 < 30
    assert "model 'add_sub' did not finish loading within 0.5 s" in str(err.value)
    assert "(model_load_timeout; raise it for a model whose initialize() takes longer)" in str(
        err.value)


class _Held(Launcher):
    """Counts stops: what a session does to its launcher after a load timed out."""

    def __init__(self, remote: bool) -> None:
        self.remote = remote
        self.stops = 0

    def start(self) -> None: ...

    def stop(self) -> None:
        self.stops += 1

    def alive(self) -> bool:
        return self.stops == 0


@pytest.mark.parametrize("remote", [False, True])
def test_a_worker_of_ours_is_stopped_after_a_load_timed_out(remote):
    """It holds the load in an unknown state (a model's process may still take CPU or GPU
    memory): the next config starts a fresh one. A remote server is not ours to restart."""
    held = _Held(remote)
    with pytest.raises(LoadTimeoutError), _fresh_worker_after_load_timeout(held):
        raise LoadTimeoutError("model 'm' did not finish loading within 1 s")
    assert held.stops == (0 if remote else 1)
    with pytest.raises(LaunchError), _fresh_worker_after_load_timeout(held):
        raise LaunchError("failed to load 'm': weights missing")  # answered: the worker is fine
    assert held.stops == (0 if remote else 1)


class _StuckClient:
    """A load client whose requests stay unanswered (a model hung in execute())."""

    def __init__(self, unanswered: int) -> None:
        self.unanswered = unanswered
        self.closed = False

    def quiesce(self, timeout_s: float = 30.0) -> None: ...

    def outstanding(self) -> int:
        return self.unanswered

    def close(self) -> None:
        self.closed = True


class _Unloads(_Held):
    def __init__(self, remote: bool) -> None:
        super().__init__(remote)
        self.unloaded: list[str] = []

    def unload(self, name: str, timeout_s: float = 120.0) -> None:
        self.unloaded.append(name)


@pytest.mark.parametrize(("unanswered", "remote"), [(1, False), (0, False), (1, True)])
def test_after_a_failed_config_a_hung_execute_stops_the_worker_instead_of_an_unload(
        unanswered, remote):  # fmt: skip
    """An unload waits a minute for a hung batch (and the profile had waited another 30 s
    before asking): requests still unanswered after the failed config's wait stop a worker of
    ours, which the next config starts afresh. Otherwise, and for a remote server, it unloads."""
    session = WorkerSession(None, None, None)  # type: ignore[arg-type]  # recover() needs neither
    launcher = _Unloads(remote)
    client = _StuckClient(unanswered)
    session.launcher, session.own.client = launcher, client  # type: ignore[assignment]
    session.loaded = session.loaded_as = "m_config_0"
    session.recover()
    stopped = unanswered and not remote
    assert launcher.stops == (1 if stopped else 0)
    assert launcher.unloaded == ([] if stopped else ["m_config_0"])
    assert client.closed == bool(stopped)
    assert session.loaded is None
