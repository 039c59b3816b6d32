"""A Triton model repository: `<repo>/<model>/config.pbtxt` and numeric version folders.

Finds models, reads their configs with Triton's schema, applies the version policy and works out
which backend serves the model. Every problem a user can cause is a RepositoryError whose message
names the file and the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.config.model_config import ConfigError, ModelConfig, load_model_config
from analyzer.errors import AnalyzerError

CONFIG_FILE = "config.pbtxt"

# platform / backend names Triton uses -> our backend module and default model file name.
BACKENDS: dict[str, tuple[str, str]] = {
    "pytorch": ("pytorch_libtorch", "model.pt"),
    "onnxruntime": ("onnxruntime_onnx", "model.onnx"),
    "python": ("", "model.py"),
}
_PLATFORM_TO_BACKEND = {"pytorch_libtorch": "pytorch", "onnxruntime_onnx": "onnxruntime"}
# `platform: "ensemble"`: steps on other models, no backend and no model file (worker/ensemble.py)
ENSEMBLE = "ensemble"
# parameters whose value is a path a backend may read (python backend's conda-pack environment)
PATH_PARAMETERS = ("EXECUTION_ENV_PATH",)
MODEL_DIR_VARIABLE = "$$TRITON_MODEL_DIRECTORY"


class RepositoryError(AnalyzerError):
    """The repository, a model folder or a config is unusable; the message says which and why."""


@dataclass
class ModelSource:
    """Everything needed to load one model: its folder, config and the versions to serve."""

    name: str
    path: Path
    config: ModelConfig
    backend: str
    versions: list[int] = field(default_factory=list)
    # the config came from the network (a load's override): its paths must stay in `path`
    overridden: bool = False

    def version_path(self, version: int) -> Path:
        return self.path / str(version)

    def model_file(self, version: int) -> Path:
        default = BACKENDS[self.backend][1]
        filename = self.config.default_model_filename or default
        path = self.version_path(version) / filename
        if self.overridden:  # what was checked is what the backend opens
            return inside(self.path, path, "default_model_filename", filename)
        return path


def inside(folder: Path, path: Path, field_name: str, value: str) -> Path:
    """`path` with symlinks resolved, or RepositoryError when it leaves `folder`."""
    if "\0" not in value:
        resolved = path.resolve()
        if resolved.is_relative_to(folder.resolve()):
            return resolved
    shown = value.encode("unicode_escape").decode("ascii")
    raise RepositoryError(
        f"config override field '{field_name}' is '{shown}', which is outside the model's folder"
    )


def check_override_paths(config: ModelConfig, model_path: Path, versions: list[int]) -> None:
    """Paths in a config from the network must name files inside the model's own folder.

    A load request may not point a backend at, say, a python file elsewhere on the machine.
    """
    for version in versions:
        folder = model_path / str(version)
        if config.default_model_filename:
            name = config.default_model_filename
            inside(model_path, folder / name, "default_model_filename", name)
        for key, name in config.cc_model_filenames.items():
            inside(model_path, folder / name, f"cc_model_filenames[{key}]", name)
    for key in PATH_PARAMETERS:
        if key in config.parameters:
            value = config.parameters[key].string_value
            path = Path(value.replace(MODEL_DIR_VARIABLE, str(model_path)))
            inside(model_path, model_path / path, f"parameters.{key}", value)


def list_models(repository: str | Path) -> list[str]:
    root = Path(repository)
    if not root.is_dir():
        raise RepositoryError(f"model repository '{root}' does not exist or is not a directory")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def available_versions(model_path: Path) -> list[int]:
    """Numeric sub-folders only (ASCII digits, as Triton reads them); anything else (e.g.
    '__pycache__', 'notes', '²') is ignored."""
    return sorted(int(p.name) for p in model_path.iterdir()
                  if p.is_dir() and p.name.isascii() and p.name.isdigit())  # fmt: skip


def read_model(
    repository: str | Path, name: str, config_override: ModelConfig | None = None
) -> ModelSource:
    path = Path(repository) / name
    if not path.is_dir():
        raise RepositoryError(f"model '{name}' is not in repository '{repository}'")
    config_path = path / CONFIG_FILE
    if config_override is not None:
        config = ModelConfig()
        config.CopyFrom(config_override)
    elif config_path.exists() or config_path.is_symlink():  # a broken link is an error
        try:
            config = load_model_config(config_path)
        except ConfigError as err:
            raise RepositoryError(str(err)) from None
    else:
        config = ModelConfig()  # allowed: backends that auto-complete (python, onnx) fill it
    if not config.name:
        config.name = name
    elif config.name != name:
        raise RepositoryError(
            f"{config_path}: field 'name' is '{config.name}' but the model folder is '{name}'"
        )
    backend = resolve_backend(config, path, str(config_path))
    versions = select_versions(config, available_versions(path), str(config_path))
    overridden = config_override is not None
    if overridden:
        check_override_paths(config, path, versions)
    return ModelSource(
        name=name, path=path, config=config, backend=backend, versions=versions,
        overridden=overridden,
    )


def resolve_backend(config: ModelConfig, path: Path, source: str) -> str:
    """Fill `backend`/`platform` the way Triton does and return our backend name."""
    backend = config.backend
    if config.platform == ENSEMBLE:
        if backend:
            raise RepositoryError(
                f"{source}: an ensemble (platform 'ensemble') has no backend, but field "
                f"'backend' is '{backend}'"
            )
        if not config.HasField("ensemble_scheduling"):
            raise RepositoryError(
                f"{source}: platform is 'ensemble' but the config has no ensemble_scheduling"
            )
        return ENSEMBLE
    if config.HasField("ensemble_scheduling"):
        raise RepositoryError(
            f"{source}: ensemble_scheduling needs platform: \"ensemble\" (it is "
            f"'{config.platform or config.backend or 'unset'}')"
        )
    if not backend and config.platform:
        backend = _PLATFORM_TO_BACKEND.get(config.platform, "")
        if not backend:
            raise RepositoryError(
                f"{source}: field 'platform' is '{config.platform}'; supported platforms are "
                f"{', '.join(sorted([*_PLATFORM_TO_BACKEND, ENSEMBLE]))}"
            )
    if not backend:
        backend = _guess_backend(path)
        if not backend:
            raise RepositoryError(
                f"{source}: neither 'backend' nor 'platform' is set and no model.pt, model.onnx "
                "or model.py was found in a version folder"
            )
    if backend not in BACKENDS:
        raise RepositoryError(
            f"{source}: field 'backend' is '{backend}'; supported backends are "
            f"{', '.join(sorted(BACKENDS))}"
        )
    config.backend = backend
    platform = BACKENDS[backend][0]
    if platform and not config.platform:
        config.platform = platform
    return backend


def composing_models(config: ModelConfig) -> list[str]:
    """The models an ensemble's steps call, each once, in step order."""
    names: list[str] = []
    for step in config.ensemble_scheduling.step:
        if step.model_name and step.model_name not in names:
            names.append(step.model_name)
    return names


def _guess_backend(path: Path) -> str:
    for version in available_versions(path):
        for backend, (_, filename) in BACKENDS.items():
            if (path / str(version) / filename).exists():
                return backend
    return ""


def select_versions(config: ModelConfig, versions: list[int], source: str) -> list[int]:
    """Triton's version_policy: latest N (default latest 1), all, or specific."""
    policy = config.version_policy
    kind = policy.WhichOneof("policy_choice")
    if not versions:
        raise RepositoryError(f"{source}: model '{config.name}' has no numeric version folder")
    if kind == "all":
        return versions
    if kind == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in versions]
        if missing:
            raise RepositoryError(
                f"{source}: version_policy.specific lists version(s) {missing} "
                f"but the model folder has {versions}"
            )
        return wanted
    count = policy.latest.num_versions if kind == "latest" else 1
    if count < 1:
        raise RepositoryError(f"{source}: version_policy.latest.num_versions must be >= 1")
    return versions[-count:]


def files_digest(folder: Path) -> str:
    """Identity of a model's files (path, size, mtime): a changed model is measured afresh."""
    entries = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.name != "config.pbtxt":
            stat = path.stat()
            entries.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]
