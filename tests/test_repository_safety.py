"""Repository API safety and 'every queued request gets an answer', against real workers.

Each worker gets its own TMPDIR, so 'nothing was written' is checked on a folder no other test
shares: the upload folder a load would create lives there and nowhere else.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from gate import gate_model
from serving import EXAMPLES, start_worker
from tritonclient.utils import InferenceServerException

from analyzer.config.model_config import parse_model_config
from analyzer.worker import model as model_module
from analyzer.worker.batcher import Scheduler
from analyzer.worker.request import InferRequest
from analyzer.worker.stats import ModelStats

WAIT_S = 60  # generous bound for "it eventually happens" on a shared 2-core machine

ADD_SUB_CONFIG = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
}
ADD_SUB_CODE = (EXAMPLES / "add_sub" / "1" / "model.py").read_bytes()

# initialize() announces itself, then waits (bounded) for the test to let it go
HUNG_MODEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        open({started!r}, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({release!r}) and time.monotonic() < deadline:
            time.sleep(0.05)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros((1, 1), np.float32))])
                for _ in requests]
"""

# a request whose X is 1 holds the instance until the gate file exists (bounded)
GATED_MODEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any((x == 1).any() for x in xs):
            open(os.path.join({folder!r}, self.name + ".busy"), "w").close()
            deadline = time.monotonic() + 60
            while (not os.path.exists(os.path.join({folder!r}, self.name + ".gate"))
                   and time.monotonic() < deadline):
                time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for x in xs]
"""

SIMPLE_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [1] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [1] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# importing this file is the attack: it must never run
PWN_MODEL = """
open({marker!r}, "w").write("pwned")


class TritonPythonModel:
    def execute(self, requests):
        return []
"""


def _python_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (repo / name / "1" / "model.py").write_text(code)


def _worker(root: Path, repo: Path, *args: str):
    """A worker whose temp folder is `root/tmp`, so its uploads are visible to the test alone."""
    tmp = root / "tmp"
    tmp.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        served = start_worker(repo, "--model-control-mode", "explicit", *args)
    return served, tmp


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Uploads not allowed (the default); models for the hang, ordering and unload tests."""
    root = tmp_path_factory.mktemp("guarded")
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    flags = root / "flags"
    flags.mkdir()
    hung = HUNG_MODEL.format(started=str(flags / "hung.started"), release=str(flags / "hung.go"))
    _python_model(repo, "hung", hung, "max_batch_size: 8\n" + SIMPLE_IO)
    gated = GATED_MODEL.format(folder=str(flags))
    _python_model(repo, "gated", gated, "max_batch_size: 8\n" + SIMPLE_IO)
    _python_model(
        repo, "ordered", gated,
        "max_batch_size: 8\n" + SIMPLE_IO + "dynamic_batching { preserve_ordering: true "
        "default_queue_policy { allow_timeout_override: true } }\n",
    )  # fmt: skip
    # a symlink in a version folder that points at a python file outside the repository
    outside = root / "outside.py"
    outside.write_text(PWN_MODEL.format(marker=str(root / "symlink.marker")))
    shutil.copytree(EXAMPLES / "add_sub", repo / "linked")
    (repo / "linked" / "config.pbtxt").write_text(
        (repo / "add_sub" / "config.pbtxt").read_text().replace('"add_sub"', '"linked"')
    )
    (repo / "linked" / "1" / "elsewhere.py").symlink_to(outside)
    served, tmp = _worker(root, repo)
    try:
        yield served, root, repo, tmp, flags
    finally:
        served.stop()


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    root = tmp_path_factory.mktemp("uploads")
    repo = root / "repo"
    repo.mkdir()
    served, tmp = _worker(root, repo, "--allow-model-file-uploads=true")
    try:
        yield served, tmp
    finally:
        served.stop()


def _config(name: str, **changes) -> str:
    return json.dumps({**ADD_SUB_CONFIG, "name": name, **changes})


def _post(address: str, path: str, body: dict) -> tuple[int, dict]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _infer_add_sub(client, name: str) -> np.ndarray:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer(name, inputs).as_numpy("OUTPUT0")


# -- the reproduction of issue 12 -------------------------------------------------------------
def test_http_upload_is_refused_and_runs_nothing(guarded):
    served, root, repo, tmp, _ = guarded
    marker = root / "http.marker"
    code = PWN_MODEL.format(marker=str(marker)).encode()
    status, body = _post(
        served.http,
        "/v2/repository/models/pwn/load",
        {"parameters": {"config": _config("pwn"),
                        "file:1/model.py": base64.b64encode(code).decode()}},
    )  # fmt: skip
    assert status == 400, body
    assert "--allow-model-file-uploads=true" in body["error"]
    assert not marker.exists()
    assert _tree(tmp) == []  # no upload folder was even created
    assert not (repo / "pwn").exists()
    client = httpclient.InferenceServerClient(served.http)
    try:
        with pytest.raises(InferenceServerException, match="allow-model-file-uploads"):
            client.load_model("pwn", config=_config("pwn"), files={"file:1/model.py": code})
    finally:
        client.close()
    assert not marker.exists() and _tree(tmp) == []


def test_grpc_upload_and_path_name_are_refused(guarded):
    served, root, repo, tmp, _ = guarded
    marker = root / "grpc.marker"
    code = PWN_MODEL.format(marker=str(marker)).encode()
    name = "../../../../tmp/x"
    escaped = (tmp / "ma-load-0" / name).resolve()  # where the old code wrote the files
    existed = escaped.exists()
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        with pytest.raises(InferenceServerException, match="invalid model name"):
            client.load_model(name, config=_config("x"), files={"file:1/model.py": code})
        with pytest.raises(InferenceServerException, match="allow-model-file-uploads"):
            client.load_model("pwn", config=_config("pwn"), files={"file:1/model.py": code})
    finally:
        client.close()
    assert not marker.exists()
    assert _tree(tmp) == [] and not (repo / "pwn").exists()
    assert escaped.exists() == existed


# -- uploads when the operator opted in --------------------------------------------------------
def test_opted_in_upload_serves_and_unload_removes_its_folder(uploads):
    served, tmp = uploads
    client = httpclient.InferenceServerClient(served.http)
    try:
        client.load_model("up", config=_config("up"), files={"file:1/model.py": ADD_SUB_CODE})
        assert _infer_add_sub(client, "up").tolist() == [[0, 2, 4, 6]]
        folders = list(tmp.iterdir())
        assert len(folders) == 1 and (folders[0].stat().st_mode & 0o777) == 0o700
        client.load_model("up", config=_config("up"), files={"file:1/model.py": ADD_SUB_CODE})
        assert len(list(tmp.iterdir())) == 1  # a reload removes the previous upload
        client.unload_model("up")
        assert _tree(tmp) == []
    finally:
        client.close()


FAILING_UPLOADS = {
    "bad base64": ("f1", {"file:1/model.py": "not base64 !!"}, "not valid base64"),
    "absolute key": ("f2", {"file:/etc/cron.d/x": "eA=="}, "relative path"),
    "dotdot key": ("f3", {"file:1/../../x.py": "eA=="}, "relative path"),
    "nul in key": ("f4", {"file:1/a\u0000b": "eA=="}, "relative path"),
    "file then folder": ("f5", {"file:1": "eA==", "file:1/model.py": "eA=="}, "cannot be written"),
    "init error": (
        "f6",
        {"file:1/model.py": base64.b64encode(
            b"class TritonPythonModel:\n    def initialize(self, args):\n"
            b"        raise RuntimeError('boom')\n").decode()},
        "boom",
    ),
    "not a model": ("f7", {"file:1/model.py": base64.b64encode(b"x = (").decode()}, "f7"),
}


@pytest.mark.parametrize("case", sorted(FAILING_UPLOADS))
def test_failed_upload_leaves_no_temp_folder(uploads, case):
    served, tmp = uploads
    name, files, message = FAILING_UPLOADS[case]
    before = _tree(tmp)
    status, body = _post(
        served.http, f"/v2/repository/models/{name}/load",
        {"parameters": {"config": _config(name), **files}},
    )  # fmt: skip
    assert status == 400, body
    assert message in body["error"]
    assert _tree(tmp) == before


def test_failed_grpc_upload_with_wrong_config_name_leaves_no_temp_folder(uploads):
    served, tmp = uploads
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        with pytest.raises(InferenceServerException, match="'name' is 'other'"):
            client.load_model("g1", config=_config("other"),
                              files={"file:1/model.py": ADD_SUB_CODE})  # fmt: skip
    finally:
        client.close()
    assert _tree(tmp) == []


# -- config overrides ---------------------------------------------------------------------------
def test_override_path_escape_is_refused(guarded):
    served, root, *_ = guarded
    client = httpclient.InferenceServerClient(served.http)
    try:
        escape = _config("add_sub", default_model_filename="../../../etc/passwd")
        with pytest.raises(InferenceServerException, match="default_model_filename"):
            client.load_model("add_sub", config=escape)
        env = _config("add_sub", parameters={"EXECUTION_ENV_PATH": {"string_value": "/opt/env"}})
        with pytest.raises(InferenceServerException, match="EXECUTION_ENV_PATH"):
            client.load_model("add_sub", config=env)
        linked = _config("linked", default_model_filename="elsewhere.py")
        with pytest.raises(InferenceServerException, match="outside the model's folder"):
            client.load_model("linked", config=linked)
        assert not (root / "symlink.marker").exists()
        inside = _config("add_sub", default_model_filename="model.py")
        client.load_model("add_sub", config=inside)  # a path inside the folder still loads
        assert _infer_add_sub(client, "add_sub").tolist() == [[0, 2, 4, 6]]
    finally:
        client.close()


def test_instance_count_cap_refuses_before_creating_instances(guarded):
    served, *_ = guarded
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        many = _config("add_sub", instance_group=[{"count": 1000, "kind": "KIND_CPU"}])
        with pytest.raises(InferenceServerException, match="--max-instance-count") as info:
            client.load_model("add_sub", config=many)
        assert "1000" in str(info.value)
    finally:
        client.close()


def test_instances_of_all_loaded_models_are_capped_together(tmp_path):
    """--max-instance-count capped each model version alone: three loads of 64 python instances
    were 192 processes (7 GB). --max-total-instances caps them all; a reload of a model counts
    its new instances only, and an unload makes room."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a", "b"):
        shutil.copytree(EXAMPLES / "add_sub", repo / name)
        text = (repo / name / "config.pbtxt").read_text().replace('"add_sub"', f'"{name}"')
        (repo / name / "config.pbtxt").write_text(text)
    served = start_worker(repo, "--model-control-mode", "explicit", "--max-total-instances", "3")
    client = grpcclient.InferenceServerClient(served.grpc)
    two = [{"count": 2, "kind": "KIND_CPU"}]
    try:
        client.load_model("a", config=_config("a", instance_group=two))
        client.load_model("a", config=_config("a", instance_group=two))  # a reload: still 2
        with pytest.raises(InferenceServerException) as info:
            client.load_model("b", config=_config("b", instance_group=two))
        assert "model 'b' needs 2 instance(s), and the loaded models have 2 of the 3 this " \
               "worker runs at most (--max-total-instances)" in str(info.value)  # fmt: skip
        assert not client.is_model_ready("b")
        client.load_model("b", config=_config("b", instance_group=[{"count": 1,
                                                                    "kind": "KIND_CPU"}]))
        client.unload_model("a")
        client.load_model("b", config=_config("b", instance_group=[{"count": 3,
                                                                    "kind": "KIND_CPU"}]))
        assert client.is_model_ready("b")
    finally:
        client.close()
        served.stop()


# -- faults in models -----------------------------------------------------------------------------
def test_hung_load_does_not_block_another_load(guarded):
    served, _, _, _, flags = guarded
    errors: list[Exception] = []

    def load_hung() -> None:
        client = httpclient.InferenceServerClient(served.http, network_timeout=WAIT_S * 2)
        try:
            client.load_model("hung")
        except Exception as err:  # reported by the assertion below
            errors.append(err)
        finally:
            client.close()

    loader = threading.Thread(target=load_hung)
    loader.start()
    try:
        _wait_for(lambda: (flags / "hung.started").exists(), "hung model's initialize")
        client = httpclient.InferenceServerClient(served.http, network_timeout=WAIT_S * 2)
        try:
            client.unload_model("add_sub")
            client.load_model("add_sub")  # must not wait for 'hung'
            assert loader.is_alive()
            states = {r["name"]: r.get("state") for r in client.get_model_repository_index()}
            assert states["hung"] == "LOADING" and states["add_sub"] == "READY"
        finally:
            client.close()
    finally:
        (flags / "hung.go").touch()
        loader.join(WAIT_S * 2)
    assert not loader.is_alive() and errors == []


def _pending(served, model: str) -> int:
    host, port = served.metrics.removeprefix("http://").split("/")[0].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    pattern = rf'^nv_inference_pending_request_count{{[^}}]*model="{model}"[^}}]*}} (\S+)$'
    match = re.search(pattern, text, re.M)
    return int(float(match.group(1))) if match else -1


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _x(value: float) -> list[httpclient.InferInput]:
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [x]


def _outcome(pending) -> str:
    try:
        return str(pending.get_result(timeout=WAIT_S).as_numpy("Y")[0, 0])
    except InferenceServerException as err:
        return f"error: {err.message()}"


def test_expired_request_does_not_stall_preserve_ordering(guarded):
    served, _, _, _, flags = guarded
    for leftover in (flags / "ordered.busy", flags / "ordered.gate"):
        leftover.unlink(missing_ok=True)
    client = httpclient.InferenceServerClient(served.http, concurrency=4,
                                              network_timeout=WAIT_S * 2)  # fmt: skip
    try:
        client.load_model("ordered")
        first = client.async_infer("ordered", _x(1))  # holds the only instance
        _wait_for(lambda: (flags / "ordered.busy").exists(), "the first batch to start")
        expiring = client.async_infer("ordered", _x(2), timeout=1000)  # 1 ms in the queue
        _wait_for(lambda: _pending(served, "ordered") == 1, "the expiring request to queue")
        later = client.async_infer("ordered", _x(3))
        _wait_for(lambda: _pending(served, "ordered") == 2, "the later request to queue")
        (flags / "ordered.gate").touch()
        assert _outcome(first) == "1.0"
        assert "timeout" in _outcome(expiring)
        assert _outcome(later) == "3.0"  # before the fix it waited forever behind the expired one
        stats = client.get_inference_statistics("ordered")["model_stats"][0]["inference_stats"]
        assert stats["queue"]["count"] == stats["success"]["count"] == 2
        assert stats["fail"]["count"] == 1
        client.unload_model("ordered")
    finally:
        (flags / "ordered.gate").touch()
        client.close()


@pytest.mark.parametrize("model", ["gated", "ordered"])
def test_unload_answers_every_queued_request(guarded, model):
    served, _, _, _, flags = guarded
    for leftover in (flags / f"{model}.busy", flags / f"{model}.gate"):
        leftover.unlink(missing_ok=True)
    client = httpclient.InferenceServerClient(served.http, concurrency=8,
                                              network_timeout=WAIT_S * 2)  # fmt: skip
    unloader = threading.Thread(target=lambda: _unload(served, model))
    try:
        client.load_model(model)
        running = client.async_infer(model, _x(1))
        _wait_for(lambda: (flags / f"{model}.busy").exists(), "the first batch to start")
        queued = [client.async_infer(model, _x(0)) for _ in range(5)]
        _wait_for(lambda: _pending(served, model) == 5, "five queued requests")
        unloader.start()
        # the gate opens only once the unload has begun: opened earlier, the instance could take
        # the five queued requests before the unload closes the queue (seen under CI load)
        _wait_for(lambda: _state(client, model) in ("UNLOADING", "UNAVAILABLE"),
                  "the unload to begin")  # fmt: skip
        answers = []
        if model == "gated":  # no ordering to keep: the queued ones are answered at once
            answers = [_outcome(p) for p in queued]
        (flags / f"{model}.gate").touch()  # the batch in flight finishes normally
        assert _outcome(running) == "1.0"
        answers = answers or [_outcome(p) for p in queued]
        assert len(answers) == 5 and all("unloaded" in a for a in answers), answers
        unloader.join(WAIT_S)
        assert not unloader.is_alive()
        assert not client.is_model_ready(model)
    finally:
        (flags / f"{model}.gate").touch()
        if unloader.ident:
            unloader.join(WAIT_S)
        client.close()


def _state(client, model: str) -> str:
    return next((r.get("state", "") for r in client.get_model_repository_index()
                 if r["name"] == model), "")  # fmt: skip


def _unload(served, model: str) -> None:
    client = httpclient.InferenceServerClient(served.http, network_timeout=WAIT_S * 2)
    try:
        client.unload_model(model)
    finally:
        client.close()


# -- the scheduler and the model version, driven directly ------------------------------------------
def _request(done, value: float = 0.0) -> InferRequest:
    return InferRequest(
        model_name="m",
        inputs={"X": np.full((1, 1), value, np.float32)},
        wire_types={"X": "FP32"},
        requested_outputs=None,
        on_done=done,
        arrival_ns=time.perf_counter_ns(),
    )


@pytest.mark.parametrize("batching", ["", "dynamic_batching { }"])
def test_cancelled_requests_are_answered_not_run(batching):
    answers: list[tuple[str, Exception | None]] = []
    config = parse_model_config(f'name: "m"\nmax_batch_size: 8\n{batching}')
    stats = ModelStats("m", 1)
    s = Scheduler(config, stats)
    reqs = [_request(lambda o, e, i=i: answers.append((f"r{i}", e))) for i in range(3)]
    for r in reqs:
        s.enqueue(r)
    reqs[0].cancel()
    batch = s.next_batch()
    assert reqs[0] not in batch and reqs[1] in batch
    assert [a for a, _ in answers] == ["r0"] and "cancelled" in str(answers[0][1])
    assert stats.durations["fail"].count == 1 and stats.durations["queue"].count == 0


def test_all_cancelled_queue_waits_for_a_live_request():
    answers = []
    s = Scheduler(parse_model_config('name: "m"\nmax_batch_size: 8\ndynamic_batching { }'),
                  ModelStats("m", 1))  # fmt: skip
    gone = _request(lambda o, e: answers.append(e))
    s.enqueue(gone)
    gone.cancel()
    live = _request(lambda o, e: None)
    threading.Timer(0.2, s.enqueue, (live,)).start()
    assert s.next_batch() == [live]
    assert len(answers) == 1 and "cancelled" in str(answers[0])


@pytest.mark.parametrize("extra", ["", "dynamic_batching { preserve_ordering: true }"])
def test_unload_answers_a_batch_stuck_past_the_join_timeout(tmp_path, monkeypatch, extra):
    monkeypatch.setattr(model_module, "UNLOAD_JOIN_TIMEOUT_S", 0.2)
    version, backend = gate_model(tmp_path, extra)
    answers: list[tuple[str, object]] = []
    lock = threading.Lock()

    def record(tag):
        def done(outputs, error):
            with lock:
                answers.append((tag, error))
        return done

    runners = list(version.runners)
    try:
        version.submit(_request(record("stuck"), 1.0))
        assert backend.started.wait(WAIT_S)
        version.submit(_request(record("queued"), 2.0))
        version.unload()  # gives up on the stuck batch after 0.2 s
        assert sorted(t for t, _ in answers) == ["queued", "stuck"]
        assert all("unloaded" in str(e) for _, e in answers)
    finally:
        backend.gate.set()
    for runner in runners:  # the released runner ends; its late result is dropped
        runner.join(WAIT_S)
        assert not runner.thread.is_alive()
    assert len(answers) == 2
    stats = version.stats.durations
    assert stats["fail"].count == 2 and stats["success"].count == 0


def test_enqueue_failure_keeps_ordered_delivery_moving(tmp_path):
    version, backend = gate_model(
        tmp_path, "dynamic_batching { preserve_ordering: true "
        "default_queue_policy { max_queue_size: 1 } }"
    )  # fmt: skip
    answers: list[tuple[str, object]] = []
    try:
        version.submit(_request(lambda o, e: answers.append(("a", e)), 1.0))
        assert backend.started.wait(WAIT_S)
        version.submit(_request(lambda o, e: answers.append(("b", e))))
        version.submit(_request(lambda o, e: answers.append(("c", e))))  # queue full
        assert answers == []  # c's refusal waits for a and b, in order
        backend.gate.set()
        _wait_for(lambda: len(answers) == 3, "all three answers")
        assert [t for t, _ in answers] == ["a", "b", "c"]
        assert "maximum queue size" in str(answers[2][1])
    finally:
        backend.gate.set()
        version.unload()

