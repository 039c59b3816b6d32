"""`model_warmup` in the worker, with Triton's semantics: every instance runs every sample `count`
times (a sample of batch_size N as N requests run together) before the model is READY."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import start_worker

COUNTER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers (executions so far, this batch's requests, the first value it ever saw)."""

    def initialize(self, args):
        self.executions = 0
        self.first = None

    def execute(self, requests):
        self.executions += 1
        out = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            if value == -1:
                raise ValueError("a negative value")
            if self.first is None:
                self.first = value
            row = np.array([[self.executions, len(requests), self.first]], dtype=np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", row)]))
        return out
'''

CONFIG = """name: "counter"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
model_warmup [ { name: "w" batch_size: 2 count: 3
  inputs { key: "IN" value { data_type: TYPE_INT32 dims: [ 1 ] DATA } } } ]
"""


def _repo(tmp_path: Path, data: str, files: dict[str, bytes] | None = None) -> Path:
    folder = tmp_path / "repo" / "counter"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(COUNTER)
    (folder / "config.pbtxt").write_text(CONFIG.replace("DATA", data))
    for name, content in (files or {}).items():
        (folder / "warmup").mkdir(exist_ok=True)
        (folder / "warmup" / name).write_bytes(content)
    return tmp_path / "repo"


def _stats(served) -> dict:
    with urllib.request.urlopen(f"http://{served.http}/v2/models/counter/stats") as r:
        return json.load(r)["model_stats"][0]


def _ask(served, value: int) -> list[int]:
    with httpclient.InferenceServerClient(served.http) as client:
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return [int(x) for x in client.infer("counter", [tensor]).as_numpy("OUT")[0]]


def test_the_model_ran_its_warmup_before_the_first_request(tmp_path: Path):
    served = start_worker(_repo(tmp_path, "zero_data: true"), "--log-verbose", "1")
    try:
        stats = _stats(served)  # READY: the warm-up is over, and counted as Triton counts it
        assert (stats["execution_count"], stats["inference_count"]) == (3, 6)
        executions, batch, first = _ask(served, 5)
        assert executions == 4  # 3 warm-up executions, then this request's
        assert batch == 1 and first == 0  # the warm-up's zero data came first
        log = "".join(served.output)  # the load log says it, at --log-verbose 1 as Triton's
        assert "instance counter_0_0 ran warmup sample 'w' 3 time(s)" in log
    finally:
        assert served.stop() == 0


def test_warmup_data_from_a_file_in_the_warmup_folder(tmp_path: Path):
    repo = _repo(tmp_path, 'input_data_file: "seven.bin"',
                 {"seven.bin": np.array([7], dtype=np.int32).tobytes()})  # fmt: skip
    served = start_worker(repo)
    try:
        assert _ask(served, 1)[2] == 7
    finally:
        assert served.stop() == 0


@pytest.mark.parametrize(("data", "files", "needle"), [
    ('input_data_file: "minus.bin"', {"minus.bin": np.array([-1], np.int32).tobytes()},
     "failed to run warmup sample 'w': python model 'counter' instance counter_0_0: "
     "ValueError: a negative value"),
    ('input_data_file: "../config.pbtxt"', None, "input_data_file '../config.pbtxt' is outside"),
    ('input_data_file: "short.bin"', {"short.bin": b"\x01"}, "has 1 bytes, the input needs 4"),
])  # fmt: skip
def test_a_warmup_that_cannot_run_fails_the_load_with_its_reason(tmp_path, data, files, needle):
    with pytest.raises(RuntimeError) as failed:
        start_worker(_repo(tmp_path, data, files), timeout=60)
    assert needle in " ".join(str(failed.value).split())


def test_random_data_is_accepted_and_every_dimension_must_be_given(tmp_path: Path):
    served = start_worker(_repo(tmp_path, "random_data: true"))
    try:
        assert _stats(served)["execution_count"] == 3
    finally:
        assert served.stop() == 0
    repo = _repo(tmp_path / "b", "zero_data: true")
    config = repo / "counter" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 1 ] zero_data", "dims: [ -1 ] zero_data"))
    with pytest.raises(RuntimeError) as failed:
        start_worker(repo, timeout=60)
    assert "every dimension must be given" in str(failed.value)


def test_a_warmup_the_worker_will_not_allocate_is_refused(tmp_path: Path):
    """A config may come from a repository-API load: its warm-up is bounded."""
    repo = _repo(tmp_path, "zero_data: true")
    config = repo / "counter" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 1 ] zero_data",
                                                 "dims: [ 1000000000 ] zero_data"))  # fmt: skip
    with pytest.raises(RuntimeError) as failed:
        start_worker(repo, timeout=60)
    assert "more than this worker allocates for a warm-up input" in " ".join(
        str(failed.value).split())


def test_a_warmup_bounded_input_by_input_is_bounded_as_a_whole_too():
    """Each input under the per-input bound, but their sum times batch_size over a load's: two
    128 MiB inputs at batch_size 4 held 2 GB of /dev/shm and 2.5 GB of the worker. Refused
    before any input is made."""
    from analyzer.config.model_config import parse_model_config
    from analyzer.worker import warmup

    config = parse_model_config(
        'name: "m"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },'
        ' { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'model_warmup [ { name: "big" batch_size: 4 inputs [\n'
        '  { key: "A" value { data_type: TYPE_FP32 dims: [ 33554432 ] zero_data: true } },\n'
        '  { key: "B" value { data_type: TYPE_FP32 dims: [ 33554432 ] zero_data: true } } ] } ]\n')
    with pytest.raises(ValueError, match="the warm-up samples' inputs times their batch_size "
                       "make more than 536870912 bytes"):  # fmt: skip
        warmup.warmup_samples(config, Path("."))
