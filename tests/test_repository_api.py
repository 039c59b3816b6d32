"""Repository API and model control modes against a real worker process."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serving import EXAMPLES, start_worker
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def explicit_worker(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    shutil.copytree(EXAMPLES / "tiny_cnn", repo / "tiny_cnn")
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "add_sub")
    yield served
    assert served.stop() == 0


def test_explicit_mode_loads_only_what_was_asked(explicit_worker):
    client = httpclient.InferenceServerClient(explicit_worker.http)
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["add_sub"]["state"] == "READY"
    assert "state" not in index["tiny_cnn"]  # never loaded: name only, as Triton answers
    assert not client.is_model_ready("tiny_cnn")
    client.close()


def test_load_with_config_override_then_unload(explicit_worker):
    client = httpclient.InferenceServerClient(explicit_worker.http)
    config = client.get_model_config("add_sub")
    config["max_batch_size"] = 4
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 500}
    client.load_model("add_sub", config=json.dumps(config))
    served = client.get_model_config("add_sub")
    assert served["max_batch_size"] == 4
    assert served["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    big = np.ones((5, 4), np.float32)
    inputs = [httpclient.InferInput(n, [5, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException, match="<= 4"):
        client.infer("add_sub", inputs)
    client.unload_model("add_sub")
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["add_sub"]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException):
        client.infer("add_sub", inputs)
    client.load_model("add_sub")  # back from the repository's own config
    assert client.get_model_config("add_sub")["max_batch_size"] == 8
    client.close()


def test_grpc_load_and_bad_override(explicit_worker):
    client = grpcclient.InferenceServerClient(explicit_worker.grpc)
    client.load_model("tiny_cnn")
    assert client.is_model_ready("tiny_cnn")
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        client.load_model("tiny_cnn", config='{"max_batch_size": "many"}')
    assert client.is_model_ready("tiny_cnn")  # a failed reload keeps the old version serving
    client.unload_model("tiny_cnn")
    client.close()


def test_none_mode_refuses_load_and_unload(examples_worker):
    client = httpclient.InferenceServerClient(examples_worker.http)
    with pytest.raises(InferenceServerException, match="model-control-mode is none"):
        client.unload_model("add_sub")
    assert client.is_model_ready("add_sub")
    client.close()


def test_bad_config_fails_startup_with_file_and_line(tmp_path):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch: 4\n')
    with pytest.raises(RuntimeError) as info:
        start_worker(tmp_path, timeout=60)
    message = str(info.value)
    assert "config.pbtxt, line 2" in message and "max_batch" in message


def _until(check, what: str, seconds: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"poll mode never {what}"
        time.sleep(0.1)


def test_poll_mode_follows_the_repository(tmp_path):
    """Triton's --model-control-mode poll with --repository-poll-secs: a model folder added is
    loaded, one changed is loaded again with its new config, one removed is unloaded; the
    repository API's load and unload are refused, as Triton refuses them while polling."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    served = start_worker(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    client = httpclient.InferenceServerClient(served.http)
    try:
        assert client.is_model_ready("add_sub")
        shutil.copytree(EXAMPLES / "add_sub", tmp_path / "add2")
        config = tmp_path / "add2" / "config.pbtxt"
        config.write_text(config.read_text().replace('"add_sub"', '"add2"'))
        (tmp_path / "add2").rename(repo / "add2")  # whole, as a deployment would move it in
        _until(lambda: client.is_model_ready("add2"), "loaded the added model")
        config = repo / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
        _until(lambda: client.get_model_config("add_sub")["max_batch_size"] == 4,
               "reloaded the changed model")  # fmt: skip
        shutil.rmtree(repo / "add2")
        _until(lambda: not client.is_model_ready("add2"), "unloaded the removed model")
        assert client.is_model_ready("add_sub")
        with pytest.raises(InferenceServerException, match="polling is enabled"):
            client.load_model("add2")
    finally:
        client.close()
        assert served.stop() == 0


def test_several_model_repositories_as_tritonserver_takes_them(tmp_path):
    """--model-repository given twice serves the models of both; a name in both is one clear
    error naming the two folders, and the others still load."""
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(EXAMPLES / "add_sub", first / "add_sub")
    shutil.copytree(EXAMPLES / "add_sub", second / "add2")
    config = second / "add2" / "config.pbtxt"
    config.write_text(config.read_text().replace('"add_sub"', '"add2"'))
    served = start_worker(first, "--model-repository", str(second))
    client = httpclient.InferenceServerClient(served.http)
    try:
        assert client.is_model_ready("add_sub") and client.is_model_ready("add2")
    finally:
        client.close()
        assert served.stop() == 0
    shutil.copytree(EXAMPLES / "add_sub", second / "add_sub")
    served = start_worker(first, "--model-repository", str(second), "--exit-on-error=false")
    client = httpclient.InferenceServerClient(served.http)
    try:
        assert client.is_model_ready("add2") and not client.is_model_ready("add_sub")
        said = "".join(served.output)
        assert (f"model 'add_sub' is in more than one model repository: {first}, {second}"
                in said)  # fmt: skip
    finally:
        client.close()
        assert served.stop() == 0


def test_tritonserver_log_flags(tmp_path):
    """Triton's --log-file, --log-format=ISO8601 and --log-verbose: the load lines go to the file,
    stamped in ISO 8601; --log-info=false keeps them out even when verbose."""
    import re

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    for info, expect in (("true", True), ("false", False)):
        log = tmp_path / f"log-{info}.txt"
        served = start_worker(repo, "--log-verbose=1", f"--log-file={log}",
                              "--log-format=ISO8601", f"--log-info={info}")  # fmt: skip
        assert served.stop() == 0
        text = log.read_text() if log.exists() else ""
        loaded = re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO .*loaded model 'add_sub'",
                           text, re.M)  # fmt: skip
        assert bool(loaded) is expect, text
        assert not any("has no effect" in line for line in served.output)


def test_strict_readiness_as_triton_has_it(tmp_path):
    """--strict-readiness (Triton's default, true): the server is not ready while a model failed
    to load, and ready again once that model is unloaded on purpose; false: ready once it runs."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.py").write_text("raise RuntimeError('cannot load')\n")
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    for strict, ready in (("true", False), ("false", True)):
        served = start_worker(repo, "--exit-on-error=false", f"--strict-readiness={strict}")
        try:
            with httpclient.InferenceServerClient(served.http) as client:
                assert client.is_server_live() and client.is_model_ready("add_sub")
                assert client.is_server_ready() is ready
            with grpcclient.InferenceServerClient(served.grpc) as client:
                assert client.is_server_ready() is ready
        finally:
            assert served.stop() == 0
    served = start_worker(repo, "--exit-on-error=false", "--model-control-mode", "explicit",
                          "--load-model", "*")  # fmt: skip
    try:
        with httpclient.InferenceServerClient(served.http) as client:
            assert not client.is_server_ready()
            client.unload_model("broken")  # unloaded on purpose: it no longer counts
            assert client.is_server_ready()
    finally:
        assert served.stop() == 0
