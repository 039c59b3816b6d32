"""A python model's own execution environment (`parameters { key: "EXECUTION_ENV_PATH" }`), as
Triton's python backend runs one.

The value names an environment folder, or a packed one (conda-pack's tar archives), which is
extracted once per worker into a folder of its own and again when the archive changes. As in
Triton the folder must hold `bin/activate`; the model's process then runs the environment's own
`bin/python3` with VIRTUAL_ENV set, the environment's `bin` first on PATH and its `lib` first on
LD_LIBRARY_PATH, PYTHONHOME unset. That process imports only this package's stub (PYTHONPATH
names a folder holding just `analyzer`), so the model sees the environment's packages, not the
worker's. The environment's Python must be 3.10 or newer and have numpy, which the stub uses to
pass tensors; both are checked once, with one sentence if not.

A relative value is read from the model's folder (`$$TRITON_MODEL_DIRECTORY` names it too).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from analyzer.config.model_config import ModelConfig
from analyzer.repository.repository import MODEL_DIR_VARIABLE

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MIN_PYTHON = (3, 10)
PROBE_TIMEOUT_S = 120.0
PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the `analyzer` package


class ExecutionEnvError(ValueError):
    """The environment cannot be used; the message names the model, the value and why."""


@dataclass(frozen=True)
class ExecutionEnv:
    root: Path
    python: str
    environ: dict[str, str]


_lock = threading.Lock()
# an archive (its device and inode: the profile's variants hard-link one archive) -> (its
# mtime, the folder it was extracted to)
_extracted: dict[tuple[int, int], tuple[float, Path]] = {}
_probed: dict[tuple[str, float], str | None] = {}  # (python, its mtime) -> problem, or None
_base: Path | None = None  # this worker's folder for extracted environments, removed at exit


def execution_env(config: ModelConfig, model_path: Path) -> ExecutionEnv | None:
    """The model's environment, ready to run its process; None when it names none."""
    if ENV_PARAMETER not in config.parameters:
        return None
    value = config.parameters[ENV_PARAMETER].string_value
    if not value:
        return None
    where = f"model '{config.name}': parameters.{ENV_PARAMETER} '{value}'"
    path = model_path / Path(value.replace(MODEL_DIR_VARIABLE, str(model_path)))
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ExecutionEnvError(f"{where} does not exist") from None
    root = real if real.is_dir() else _extract(real, where)
    activate = root / "bin" / "activate"
    if not activate.is_file():
        raise ExecutionEnvError(f"{where}: {activate} does not exist; the Python environment "
                                "should contain an 'activate' script")  # fmt: skip
    python = next((root / "bin" / name for name in ("python3", "python")
                   if (root / "bin" / name).exists()), None)  # fmt: skip
    if python is None:
        raise ExecutionEnvError(f"{where} has no bin/python3 or bin/python")
    environ = dict(os.environ)
    environ.pop("PYTHONHOME", None)
    environ["VIRTUAL_ENV"] = str(root)
    environ["VIRTUAL_ENV_PROMPT"] = f"({root})"
    environ["PATH"] = _prepend(root / "bin", environ.get("PATH"))
    environ["LD_LIBRARY_PATH"] = _prepend(root / "lib", environ.get("LD_LIBRARY_PATH"))
    environ["PYTHONPATH"] = str(_stub_path())
    problem = _probe(python, environ)
    if problem is not None:
        raise ExecutionEnvError(f"{where}: {problem}")
    return ExecutionEnv(root, str(python), environ)


def quick_problem(config: ModelConfig, model_path: Path) -> str | None:
    """What `check` can say without extracting or running anything: the value names nothing,
    a folder without bin/activate, or a file that is not a tar archive."""
    value = config.parameters[ENV_PARAMETER].string_value if (
        ENV_PARAMETER in config.parameters) else ""  # fmt: skip
    if not value:
        return None
    where = f"parameters.{ENV_PARAMETER} '{value}'"
    path = model_path / Path(value.replace(MODEL_DIR_VARIABLE, str(model_path)))
    if not path.exists():
        return f"{where} does not exist"
    if path.is_dir() and not (path / "bin" / "activate").is_file():
        return f"{where} has no bin/activate; the Python environment should contain one"
    if path.is_file() and not tarfile.is_tarfile(path):
        return f"{where} is neither a folder nor a tar archive"
    return None


def _prepend(folder: Path, rest: str | None) -> str:
    return f"{folder}:{rest}" if rest else str(folder)


def _base_dir() -> Path:
    """(Under the lock.) This worker's own folder for environments, made on first use."""
    global _base
    if _base is None:
        _base = Path(tempfile.mkdtemp(prefix="model-analyzer-envs-"))
        atexit.register(shutil.rmtree, _base, True)
    return _base


def _stub_path() -> Path:
    """A folder holding only this package (a link to it): the environment's own packages
    stay the ones its Python finds."""
    with _lock:
        folder = _base_dir() / "stub-path"
        link = folder / "analyzer"
        if not link.is_symlink():
            folder.mkdir(exist_ok=True)
            link.symlink_to(PACKAGE_DIR, target_is_directory=True)
        return folder


def _extract(archive: Path, where: str) -> Path:
    """A packed environment's folder: extracted once, again when the archive changes (Triton's
    rule), once for all the hard links to it (a profile's variants); an archive's members
    cannot land outside it."""
    with _lock:
        stat = archive.stat()
        identity, mtime = (stat.st_dev, stat.st_ino), stat.st_mtime
        known = _extracted.get(identity)
        if known is not None and known[0] == mtime:
            return known[1]
        target = known[1] if known is not None else _base_dir() / f"env-{len(_extracted)}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        try:
            if not tarfile.is_tarfile(archive):
                raise ExecutionEnvError(f"{where} is neither a folder nor a tar archive (conda-"
                                        "pack's .tar.gz, .tgz, .tar.bz2, .tar.xz or .tar)")
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter=_member)
        except (tarfile.TarError, OSError, EOFError) as err:
            shutil.rmtree(target, ignore_errors=True)
            raise ExecutionEnvError(f"{where} cannot be extracted: {err}") from None
        except ExecutionEnvError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        _extracted[identity] = (mtime, target)
        return target


def _member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter (nothing lands outside the folder, no link leads out of it, no
    device files, no setuid bits), except that a symbolic link may name an absolute path: a
    venv's bin/python names its base interpreter. Writing through such a link is still refused,
    since every member's own path is checked after links."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.AbsoluteLinkError:
        if member.issym():
            return tarfile.tar_filter(member, dest)
        raise


def _probe(python: Path, environ: dict[str, str]) -> str | None:
    """Whether the environment's Python can run the stub: its version, and numpy."""
    key = (str(python), python.stat().st_mtime)
    with _lock:
        if key in _probed:
            return _probed[key]
    check = "import sys, numpy; print('%d %d' % sys.version_info[:2])"
    try:
        done = subprocess.run([str(python), "-c", check], env=environ, capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"its Python ({python}) does not run: {err}"
    problem: str | None = None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        problem = (f"its Python ({python}) cannot import numpy, which the model's process "
                   f"needs to pass tensors: {last}")  # fmt: skip
    else:
        major, minor = (int(part) for part in done.stdout.split()[:2])
        if (major, minor) < MIN_PYTHON:
            problem = (f"its Python is {major}.{minor}; the model's process needs "
                       f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer")  # fmt: skip
    with _lock:
        _probed[key] = problem
    return problem
