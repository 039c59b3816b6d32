"""A python model's own execution environment (EXECUTION_ENV_PATH), as Triton runs one: a folder
or a packed archive holding bin/activate, whose Python runs the model with its own packages."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import python_models, start_worker
from tritonclient.utils import InferenceServerException

from analyzer.worker.manager import ModelManager

# answers from its environment: a module only that environment has, and its prefix
MODEL = '''
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

import only_in_env


class TritonPythonModel:
    def execute(self, requests):
        answer = np.array([only_in_env.VALUE.encode(), sys.prefix.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", answer)])
                for _ in requests]
'''

CONFIG = ('max_batch_size: 0\n'
          'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 2 ] } ]\n')


def _environment(root: Path, value: str) -> Path:
    """A Python environment of its own (a venv without pip) with a module the worker's lacks;
    numpy comes from the worker's environment through a .pth file (same Python)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    packages = next(root.glob("lib/python3*/site-packages"))
    (packages / "only_in_env.py").write_text(f"VALUE = {value!r}\n")
    numpy_home = Path(np.__file__).resolve().parents[1]
    (packages / "worker_numpy.pth").write_text(f"{numpy_home}\n")
    return root


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    base = tmp_path_factory.mktemp("envs")
    folder = _environment(base / "folder_env", "from the folder")
    packed = _environment(base / "packed_env", "from the archive")
    return folder, packed


def _ask(client: httpclient.InferenceServerClient, model: str) -> list[str]:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0], dtype=np.float32))
    return [v.decode() for v in client.infer(model, [tensor]).as_numpy("OUT")]


def test_a_model_runs_in_its_own_environment(tmp_path, environments):
    """EXECUTION_ENV_PATH was read only to check where it points: the model ran in the worker's
    Python and could not import what its environment has."""
    folder, packed = environments
    repo = tmp_path / "repo"
    repo.mkdir()
    python_models(repo, {"in_folder": MODEL}, CONFIG + 'parameters { key: "EXECUTION_ENV_PATH" '
                  f'value: {{ string_value: "{folder}" }} }}\n')
    python_models(repo, {"in_archive": MODEL}, CONFIG + 'parameters { key: "EXECUTION_ENV_PATH" '
                  'value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    with tarfile.open(repo / "in_archive" / "env.tar.gz", "w:gz") as tar:
        tar.add(packed, arcname=".")
    # a profile's variants hard-link the model's files: one extraction serves them all
    python_models(repo, {"variant": MODEL}, CONFIG + 'parameters { key: "EXECUTION_ENV_PATH" '
                  'value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    os.link(repo / "in_archive" / "env.tar.gz", repo / "variant" / "env.tar.gz")
    served = start_worker(repo, "--model-control-mode", "explicit", "--load-model", "*")
    try:
        with httpclient.InferenceServerClient(served.http) as client:
            value, prefix = _ask(client, "in_folder")
            assert (value, Path(prefix)) == ("from the folder", folder)
            value, prefix = _ask(client, "in_archive")
            assert value == "from the archive"
            assert Path(prefix) != packed and (Path(prefix) / "bin" / "activate").is_file()
            assert _ask(client, "variant") == [value, prefix]
            # the same archive is not extracted again for a second load
            client.unload_model("in_archive")
            client.load_model("in_archive")
            assert _ask(client, "in_archive")[1] == prefix
    finally:
        served.stop()
    assert not Path(prefix).exists()  # the worker's extracted copy leaves with it


def test_environments_that_cannot_run_the_model_fail_its_load_with_one_sentence(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    no_activate = tmp_path / "bare"
    (no_activate / "bin").mkdir(parents=True)
    no_numpy = tmp_path / "no_numpy"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(no_numpy)], check=True)
    (repo / "junk.tar.gz").write_bytes(b"not an archive")
    cases = {
        "missing": (tmp_path / "nowhere", "does not exist"),
        "bare": (no_activate, "should contain an 'activate' script"),
        "no_numpy": (no_numpy, "cannot import numpy"),
        "junk": (repo / "junk.tar.gz", "neither a folder nor a tar archive"),
    }
    for name, (path, _) in cases.items():
        python_models(repo, {name: MODEL}, CONFIG + 'parameters { key: "EXECUTION_ENV_PATH" '
                      f'value: {{ string_value: "{path}" }} }}\n')
    errors = ModelManager(repo).startup([])
    assert len(errors) == len(cases)
    for (name, (path, reason)), error in zip(sorted(cases.items()), sorted(errors), strict=True):
        assert f"failed to load '{name}'" in error
        assert f"parameters.EXECUTION_ENV_PATH '{path}'" in error and reason in error, error


def test_a_config_from_the_network_still_may_not_point_outside_the_model(tmp_path, environments):
    folder, _ = environments
    repo = tmp_path / "repo"
    repo.mkdir()
    python_models(repo, {"m": MODEL}, CONFIG)
    served = start_worker(repo, "--model-control-mode", "explicit")
    try:
        with httpclient.InferenceServerClient(served.http) as client:
            config = ('{"name": "m", "backend": "python", "parameters": {"EXECUTION_ENV_PATH": '
                      f'{{"string_value": "{folder}"}}}}}}')
            with pytest.raises(InferenceServerException, match="EXECUTION_ENV_PATH"):
                client.load_model("m", config=config)
    finally:
        served.stop()


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    import io

    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def test_an_archive_cannot_write_outside_its_folder(tmp_path):
    """Through a hard link to a file elsewhere, or a symbolic link to a folder elsewhere, an
    archive's next member would have been written outside the extraction folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("untouched")
    hard = tarfile.TarInfo("secret.txt")
    hard.type, hard.linkname = tarfile.LNKTYPE, str(outside / "secret.txt")
    link = tarfile.TarInfo("lib")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside)
    repo = tmp_path / "repo"
    repo.mkdir()
    archives = {
        "hard": [(hard, None), (tarfile.TarInfo("secret.txt"), b"overwritten")],
        "through_link": [(link, None), (tarfile.TarInfo("lib/secret.txt"), b"overwritten")],
    }
    for name, members in archives.items():
        python_models(repo, {name: MODEL}, CONFIG + 'parameters { key: "EXECUTION_ENV_PATH" '
                      'value: { string_value: "env.tar.gz" } }\n')
        _tar(repo / name / "env.tar.gz", members)
    errors = ModelManager(repo).startup([])
    assert len(errors) == 2 and all("cannot be extracted" in error for error in errors), errors
    assert (outside / "secret.txt").read_text() == "untouched"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
