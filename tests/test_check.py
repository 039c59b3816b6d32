"""`model-analyzer check`, the repository doctor: each broken case named with its path and fix,
exit 1; a clean repository exits 0; `profile` refuses a broken model with the same lines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from build_examples import build_onnx_add_mul
from serving import EXAMPLES

from analyzer.repository.doctor import check_repository

PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
PY_CONFIG = 'name: "{name}"\nbackend: "python"\n'
ADD_MUL = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "{second}" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _python_model(repo: Path, name: str, config: str | None = None, code: str = PY) -> None:
    _write(repo / name / "1" / "model.py", code)
    if config is not None:
        _write(repo / name / "config.pbtxt", config)


def _fixed_batch_onnx(path: Path) -> None:
    """add_mul exported with a fixed first dimension of 2: no batch dimension to batch on."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name: str):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])

    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])], "fixed",
        [tensor("INPUT0"), tensor("INPUT1")], [tensor("OUTPUT0")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    _write(repo / "bert" / "1" / "config.pbtxt", PY_CONFIG.format(name="bert"))
    _write(repo / "bert" / "1" / "model.py", PY)
    _write(repo / "loose" / "config.pbtxt", PY_CONFIG.format(name="loose"))
    _write(repo / "loose" / "model.py", PY)
    _python_model(repo, "misnamed", PY_CONFIG.format(name="other"))
    _python_model(repo, "typo", PY_CONFIG.format(name="typo") + "max_batch_sizes: 4\n")
    _python_model(repo, "gpu", PY_CONFIG.format(name="gpu")
                  + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  + "instance_group [ { kind: KIND_GPU } ]\n")  # fmt: skip
    _python_model(repo, "no_io", PY_CONFIG.format(name="no_io"))
    _python_model(repo, "future", PY_CONFIG.format(name="future")
                  + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                  + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
                  "import triton_python_backend_utils as pb\n"
                  "from triton_python_backend_utils import Tensor, get_model_dir\n\n"
                  "class TritonPythonModel:\n"
                  "    def execute(self, requests):\n"
                  "        pb.InferenceResponse(parameters={})\n"
                  "        return pb.teleport(requests)\n")  # fmt: skip
    _python_model(repo, "completes", PY_CONFIG.format(name="completes"), PY + (
        "    @staticmethod\n    def auto_complete_config(config):\n        return config\n"))
    _write(repo / "nofile" / "config.pbtxt", PY_CONFIG.format(name="nofile"))
    (repo / "nofile" / "1").mkdir()
    _python_model(repo, "badpy", PY_CONFIG.format(name="badpy"), "def execute(:\n")
    _python_model(repo, "twice", PY_CONFIG.format(name="twice")
                  + 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] },'
                  + ' { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')  # fmt: skip
    build_onnx_add_mul(repo / "onnx_io" / "1" / "model.onnx")
    _write(repo / "onnx_io" / "config.pbtxt",
           ADD_MUL.format(name="onnx_io", second="INPUT_1", dtype="TYPE_INT32"))
    build_onnx_add_mul(repo / "onnx_type" / "1" / "model.onnx")
    _write(repo / "onnx_type" / "config.pbtxt",
           ADD_MUL.format(name="onnx_type", second="INPUT1", dtype="TYPE_INT32"))
    _fixed_batch_onnx(repo / "nobatch" / "1" / "model.onnx")
    _write(repo / "nobatch" / "config.pbtxt",
           ADD_MUL.format(name="nobatch", second="INPUT1", dtype="TYPE_FP32"))
    shutil.copytree(EXAMPLES / "tiny_cnn", repo / "cnn")
    config = (repo / "cnn" / "config.pbtxt").read_text().replace('"tiny_cnn"', '"cnn"')
    _write(repo / "cnn" / "config.pbtxt", config.replace(
        "input [", 'input [\n  { name: "EXTRA__1" data_type: TYPE_FP32 dims: [ 1 ] },'))
    _python_model(repo, "conda", PY_CONFIG.format(name="conda")
                  + 'parameters { key: "EXECUTION_ENV_PATH" '
                  + 'value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    _python_model(repo, "warm", PY_CONFIG.format(name="warm")
                  + 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                  + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INN" value {'
                  + ' data_type: TYPE_FP32 dims: [ -1 ] input_data_file: "a.bin" } } } ]\n')
    _write(repo / "pipeline" / "config.pbtxt", """name: "pipeline"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "nosuch" model_version: -1 input_map { key: "A" value: "IN" }
    output_map { key: "B" value: "MID" } },
  { model_name: "typo" model_version: -1 input_map { key: "A" value: "LOST" }
    output_map { key: "B" value: "OUT" } } ] }
""")
    (repo / "pipeline" / "1").mkdir()
    return repo


def _lines(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", "check", "--model-repository",
                           str(repo), *args], capture_output=True, text=True, timeout=120)


def test_every_broken_case_is_one_line_with_its_fix(broken: Path):
    run = _lines(broken)
    assert run.returncode == 1, run.stdout + run.stderr
    text = run.stdout
    expected = [
        "bert/1/config.pbtxt: config.pbtxt sits inside a version folder, where Triton does not "
        "read it; move bert/1/config.pbtxt to bert/config.pbtxt",
        "loose: has no numeric version folder; move loose/model.py into loose/1/",
        "misnamed/config.pbtxt: field 'name' is 'other' but the model folder is 'misnamed'",
        "typo/config.pbtxt, line 3: unknown field 'max_batch_sizes' in ModelConfig; did you mean "
        "'max_batch_size'?",
        "warning: ",  # KIND_GPU on this host without a GPU
        "nofile/1/model.py: is missing (python's model file)",
        "badpy/1/model.py, line 1: does not compile",
        "twice/config.pbtxt: input 'X' is declared 2 times",
        "future/1/model.py, line 7: uses triton_python_backend_utils.teleport, which "
        "this worker's triton_python_backend_utils does not provide",
        "no_io/config.pbtxt: the config lists no inputs and no outputs, and model.py's "
        "TritonPythonModel has no auto_complete_config to add them; declare the model's inputs "
        "and outputs in no_io/config.pbtxt, or add auto_complete_config to TritonPythonModel",
        "twice/config.pbtxt: the config lists no outputs, and model.py's",
        "onnx_io/config.pbtxt: input 'INPUT_1' is not an input of model.onnx; did you mean "
        "'INPUT1'?",
        "onnx_type/config.pbtxt: input 'INPUT1' is TYPE_INT32 but the model's is TYPE_FP32; "
        "write data_type: TYPE_FP32",
        "cnn/config.pbtxt: declares 2 input(s) but forward() of model.pt takes 1",
        "nobatch/config.pbtxt: max_batch_size is > 0 but input 'INPUT0' of the model has a fixed "
        "first dimension (2): no batch dimension; set max_batch_size: 0",
        "warm/config.pbtxt: model_warmup 'w' input 'INN' is not an input of the model; did you "
        "mean 'IN'?",
        "warm/config.pbtxt: model_warmup 'w' input 'INN' has dims [-1]; give every dimension",
        "warm/warmup/a.bin: is missing (model_warmup 'w' input 'INN' reads it)",
        "conda/config.pbtxt: parameters.EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/env.tar.gz' "
        "does not exist; point EXECUTION_ENV_PATH at a conda-pack archive",
        "pipeline/config.pbtxt, step 1 ('nosuch'): names model 'nosuch', which is not in the "
        "repository",
        "pipeline/config.pbtxt, step 2 ('typo'): input_map value 'LOST' is neither an ensemble "
        "input nor an earlier step's output_map value",
    ]
    for line in expected:
        assert line in text, f"missing: {line}\n---\n{text}"
    assert "gpu/config.pbtxt: instance_group[0] is KIND_GPU and this host has no GPU" in text
    assert "completes/" not in text  # its auto_complete_config may add them (the load says)
    assert text.count("future/1/model.py") == 1  # Tensor, get_model_dir, InferenceResponse: here
    report = json.loads(_lines(broken, "--json").stdout)
    assert report["ok"] is False
    assert {f["severity"] for f in report["findings"]} == {"error", "warning"}


def test_a_clean_repository_passes():
    for repo in (EXAMPLES, EXAMPLES.parent / "ensemble_repository"):
        run = _lines(repo)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "no problems found" in run.stdout


def test_a_model_folder_given_as_the_repository(tmp_path: Path):
    """The seed's mistake: Triton looked for /mnt/models/1/config.pbtxt."""
    shutil.copytree(EXAMPLES / "tiny_cnn", tmp_path / "tiny_cnn")
    run = _lines(tmp_path / "tiny_cnn")
    assert run.returncode == 1
    assert "is a model folder (it holds config.pbtxt), not a repository of model folders" in (
        run.stdout)
    assert "REPO/tiny_cnn/config.pbtxt and REPO/tiny_cnn/1/" in run.stdout


def test_only_the_models_asked_and_what_their_ensembles_call(broken: Path):
    findings = check_repository(broken, ["pipeline"], gpus=0)
    paths = {f.path.split("/repo/")[-1].split(",")[0] for f in findings}
    assert paths == {"pipeline/config.pbtxt", "typo/config.pbtxt"}  # typo: a step of pipeline
    assert check_repository(broken, ["gpu"], gpus=1) == []  # the warning is for hosts without


def test_bad_usage_exits_2(tmp_path: Path):
    run = _lines(tmp_path / "missing")
    assert run.returncode == 2
    assert "does not exist or is not a directory" in run.stderr


def test_profile_refuses_a_broken_model_with_the_same_lines(broken: Path, tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", "--model-repository", str(broken),
         "--profile-models", "typo", "--output-model-repository-path", str(tmp_path / "OUT"),
         "--export-path", str(tmp_path / "EXP")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    text = " ".join((run.stdout + run.stderr).split())
    assert "unknown field 'max_batch_sizes' in ModelConfig; did you mean 'max_batch_size'?" in text
    assert not list((tmp_path / "OUT").glob("typo*"))  # refused before a variant was made
    assert "starting the worker" not in run.stdout


ADD_SUB = """name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{extra}
"""


def _add_sub(repo: Path, name: str, mbs: int = 8, input: str = "IN", dims: str = "4",
             extra: str = "") -> None:  # fmt: skip
    _python_model(repo, name, ADD_SUB.format(name=name, mbs=mbs, input=input, dims=dims,
                                             extra=extra))  # fmt: skip


def test_files_that_are_not_text_and_configs_triton_refuses_are_named_never_a_traceback(
    tmp_path: Path,
):
    """Each was a traceback, a hang or "no problems found": a config that is not UTF-8, starts
    with a byte-order mark, is a FIFO (the check blocked for ever), /dev/zero (read without end),
    a folder or a broken link; a version folder '²' (int() failed); a default_model_filename in
    a missing folder; and configs Triton's core refuses (a dim of 0 or -5, a negative
    max_batch_size, an input with no name, a preferred batch size of 0 or over the maximum)."""
    import os

    repo = tmp_path / "repo"
    for name in ("latin1", "bom", "fifo", "zero", "folder", "dangling"):
        _python_model(repo, name)
    (repo / "latin1" / "config.pbtxt").write_bytes(b'name: "latin1"\nbackend: "python" # \xe9\n')
    (repo / "bom" / "config.pbtxt").write_bytes(b'\xef\xbb\xbfname: "bom"\n')
    os.mkfifo(repo / "fifo" / "config.pbtxt")
    (repo / "zero" / "config.pbtxt").symlink_to("/dev/zero")
    (repo / "folder" / "config.pbtxt").mkdir()
    (repo / "dangling" / "config.pbtxt").symlink_to(tmp_path / "nowhere.pbtxt")
    _add_sub(repo, "superscript")
    (repo / "superscript" / "1").rename(repo / "superscript" / "²")
    _add_sub(repo, "subfolder", extra='default_model_filename: "sub/model.py"')
    _add_sub(repo, "zerodim", dims="0")
    _add_sub(repo, "negdim", dims="-5")
    _add_sub(repo, "negmbs", mbs=-3)
    _add_sub(repo, "noname", input="")
    _add_sub(repo, "pref0", extra="dynamic_batching { preferred_batch_size: [ 0 ] }")
    _add_sub(repo, "pref64", extra="dynamic_batching { preferred_batch_size: [ 64 ] }")
    run = _lines(repo)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    expected = [
        "latin1/config.pbtxt, line 2: is not UTF-8 text (byte 0xe9 at offset 35); save it as "
        "UTF-8",
        "bom/config.pbtxt: starts with a UTF-8 byte-order mark; save it without one",
        "fifo/config.pbtxt: is not a regular file",
        "zero/config.pbtxt: is not a regular file",
        "folder/config.pbtxt: is a folder",
        "dangling/config.pbtxt: is a broken symlink (to ",
        "superscript: has no numeric version folder",
        "subfolder/1/sub/model.py: is missing (python's model file); put the python model there "
        "as sub/model.py",
        "zerodim/config.pbtxt: input 'IN' has dims [0]; each must be 1 or more, or -1 for a size "
        "that varies; Triton would not load it either",
        "negdim/config.pbtxt: input 'IN' has dims [-5]",
        "negmbs/config.pbtxt: max_batch_size is -3; it must be 0 (no batching) or more",
        "noname/config.pbtxt: input #1 has no 'name'",
        "pref0/config.pbtxt: dynamic_batching.preferred_batch_size 0 must be 1 or more",
        "pref64/config.pbtxt: dynamic_batching.preferred_batch_size 64 is larger than "
        "max_batch_size 8",
    ]
    for line in expected:
        assert line in run.stdout, f"missing: {line}\n---\n{run.stdout}"


def test_the_worker_refuses_to_load_what_triton_refuses(tmp_path: Path):
    """`serve` loaded a preferred batch size over the maximum as READY (the batcher dropped it
    without a word) and a dim of 0 failed only inside the model; the load now fails as
    Triton's does, naming the file and the field."""
    from analyzer.worker.manager import ModelManager

    repo = tmp_path / "repo"
    _add_sub(repo, "pref64", extra="dynamic_batching { preferred_batch_size: [ 64 ] }")
    _add_sub(repo, "zerodim", dims="0")
    errors = ModelManager(repo).startup([])
    assert len(errors) == 2, errors
    assert any("pref64/config.pbtxt: dynamic_batching.preferred_batch_size 64 is larger than "
               "max_batch_size 8" in e for e in errors), errors  # fmt: skip
    assert any("zerodim/config.pbtxt: input 'IN' has dims [0]" in e for e in errors), errors


def test_ensembles_that_call_each_other_round_are_named(tmp_path: Path):
    """check said "no problems found"; serve refused the load, and profile blamed the output
    repository. An ensemble that calls another is fine, and said nothing."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES, repo)
    step = ('ensemble_scheduling { step [ { model_name: "%s" model_version: -1 '
            'input_map { key: "IMAGE" value: "IMAGE" } output_map { key: "SCORES" value: "SCORES" '
            '} } ] }\n')
    head = ('name: "%s"\nplatform: "ensemble"\nmax_batch_size: 8\n'
            'input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 32, 32, 3 ] } ]\n'
            'output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]\n')
    _write(repo / "outer" / "config.pbtxt", head % "outer" + step % "classifier")
    (repo / "outer" / "1").mkdir()
    run = _lines(repo, "--profile-models", "outer")
    assert run.returncode == 0, run.stdout + run.stderr
    _write(repo / "loop_a" / "config.pbtxt", head % "loop_a" + step % "loop_b")
    _write(repo / "loop_b" / "config.pbtxt", head % "loop_b" + step % "loop_a")
    for name in ("loop_a", "loop_b"):
        (repo / name / "1").mkdir()
    run = _lines(repo, "--profile-models", "loop_a")
    assert run.returncode == 1
    assert "loop_a/config.pbtxt: ensembles call each other in a cycle: loop_a -> loop_b -> " \
           "loop_a" in run.stdout  # fmt: skip


def test_an_ensemble_step_whose_types_disagree_and_an_empty_repository(tmp_path: Path):
    """check said "no problems found" to both; serve refused the first at load."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES, repo)
    config = repo / "classifier" / "config.pbtxt"
    text = config.read_text()
    assert "TYPE_UINT8" in text
    config.write_text(text.replace("TYPE_UINT8", "TYPE_FP32", 1))
    run = _lines(repo, "--profile-models", "classifier")
    assert run.returncode == 1
    assert "tensor 'IMAGE' is TYPE_FP32 but input 'IMAGE' of 'preprocess' is TYPE_UINT8" in (
        run.stdout)
    empty = tmp_path / "empty"
    empty.mkdir()
    run = _lines(empty)
    assert run.returncode == 0 and "warning: " in run.stdout and "holds no model folder" in (
        run.stdout)
    assert "has no model folder 'add_sub'; it holds no model folder" in _lines(
        empty, "--profile-models", "add_sub").stdout


def _onnx_with_external_weights(folder: Path) -> None:
    """OUTPUT0 = INPUT0 + W, with W (4 floats) saved in weights.bin beside model.onnx."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def tensor(name: str):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])

    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])], "plus_w",
                              [tensor("INPUT0")], [tensor("OUTPUT0")], [weight])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True,
                    location="weights.bin", size_threshold=0)  # fmt: skip
    assert (folder / "weights.bin").stat().st_size == 16


def test_onnx_external_data_that_is_missing_or_short_is_named(tmp_path: Path):
    """check said "no problems found"; the load then failed on the missing weights file."""
    pytest.importorskip("onnx")
    repo = tmp_path / "repo"
    config = ('name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
              'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')  # fmt: skip
    for name in ("whole", "missing", "short"):
        _onnx_with_external_weights(repo / name / "1")
        _write(repo / name / "config.pbtxt", config.replace("{name}", name))
    (repo / "missing" / "1" / "weights.bin").unlink()
    (repo / "short" / "1" / "weights.bin").write_bytes(b"\0" * 8)
    run = _lines(repo)
    assert run.returncode == 1
    text = " ".join(run.stdout.split())
    assert "whole/" not in text
    assert ("missing/1/model.onnx: model.onnx's tensor 'W' has its data in 'weights.bin', which "
            "is not there") in text
    assert "copy 'weights.bin' into" in text
    assert "short/1/weights.bin: holds 8 bytes but model.onnx's tensors need 16" in text
