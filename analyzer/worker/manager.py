"""Which models are loaded: startup per model-control mode, and the repository API's load/unload."""

from __future__ import annotations

import base64
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.config.model_config import ConfigError, model_config_from_json
from analyzer.repository.repository import (
    ModelSource,
    RepositoryError,
    list_models,
    read_model,
)
from analyzer.worker.backends.base import Backend
from analyzer.worker.errors import InferError, Status
from analyzer.worker.model import ModelVersion

log = logging.getLogger(__name__)

CONTROL_MODES = ("none", "explicit")


def make_backend(name: str) -> Backend:
    """Import backends lazily: a python-only repository never imports torch or onnxruntime."""
    if name == "pytorch":
        from analyzer.worker.backends.torchscript import TorchScriptBackend

        return TorchScriptBackend()
    if name == "onnxruntime":
        from analyzer.worker.backends.onnx import OnnxBackend

        return OnnxBackend()
    if name == "python":
        from analyzer.worker.backends.python import PythonBackend

        return PythonBackend()
    raise RepositoryError(f"backend '{name}' is not supported")


@dataclass
class ModelEntry:
    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    state: str = ""  # "" = never loaded; READY, UNAVAILABLE, LOADING, UNLOADING
    reason: str = ""
    temp_dir: str | None = None


class ModelManager:
    def __init__(
        self,
        repository: str | Path,
        control_mode: str = "none",
        allow_file_uploads: bool = False,
        max_instance_count: int = 64,
    ):
        if control_mode not in CONTROL_MODES:
            raise ValueError(
                f"--model-control-mode '{control_mode}' is not one of {', '.join(CONTROL_MODES)}"
            )
        self.repository = Path(repository)
        self.control_mode = control_mode
        self.allow_file_uploads = allow_file_uploads
        self.max_instance_count = max_instance_count
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()
        self._models: dict[str, ModelEntry] = {}
        self._backends: dict[str, Backend] = {}

    # -- startup / shutdown -------------------------------------------------------------------
    def startup(self, load_models: list[str]) -> list[str]:
        """Load the models the control mode asks for; return one error line per failed model."""
        names = list_models(self.repository)
        if self.control_mode == "none" or "*" in load_models:
            wanted = names
        else:
            wanted = load_models
        errors = []
        for name in wanted:
            try:
                self._load(name, None, None)
            except (InferError, RepositoryError, ConfigError, ValueError) as err:
                errors.append(f"failed to load '{name}': {err}")
        return errors

    def shutdown(self) -> None:
        with self._lock:
            names = list(self._models)
        for name in names:
            self._unload(name)

    # -- repository API -----------------------------------------------------------------------
    def load(self, name: str, config_json: str | None = None, files: dict | None = None) -> None:
        if self.control_mode != "explicit":
            raise InferError(
                "explicit model load / unload is not allowed if polling is enabled or "
                "--model-control-mode is none",
                Status.UNAVAILABLE,
            )
        try:
            self._load(name, config_json, files)
        except (RepositoryError, ConfigError, ValueError) as err:
            raise InferError(f"failed to load '{name}': {err}") from None

    def unload(self, name: str) -> None:
        if self.control_mode != "explicit":
            raise InferError(
                "explicit model load / unload is not allowed if polling is enabled or "
                "--model-control-mode is none",
                Status.UNAVAILABLE,
            )
        self._unload(name)

    def index(self, ready_only: bool = False) -> list[dict]:
        with self._lock:
            known = dict(self._models)
        try:
            names = sorted(set(list_models(self.repository)) | set(known))
        except RepositoryError:
            names = sorted(known)
        rows = []
        for name in names:
            entry = known.get(name)
            if entry is None or not entry.state:
                if not ready_only:
                    rows.append({"name": name})
                continue
            if entry.versions:
                for version in sorted(entry.versions):
                    rows.append(
                        {"name": name, "version": str(version), "state": entry.state,
                         "reason": entry.reason}
                    )
            elif not ready_only:
                rows.append({"name": name, "version": "", "state": entry.state,
                             "reason": entry.reason})
        if ready_only:
            rows = [r for r in rows if r.get("state") == "READY"]
        return rows

    # -- lookups on the request path ----------------------------------------------------------
    def get(self, name: str, version: str = "") -> ModelVersion:
        entry = self._models.get(name)
        if entry is None or not entry.versions:
            if entry is not None and entry.state == "UNAVAILABLE":
                raise InferError(
                    f"Request for unknown model: '{name}' is not ready"
                    + (f" ({entry.reason})" if entry.reason else ""),
                    Status.UNAVAILABLE,
                )
            raise InferError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
        if not version:
            return entry.versions[max(entry.versions)]
        try:
            return entry.versions[int(version)]
        except (ValueError, KeyError):
            raise InferError(
                f"Request for unknown model: '{name}' version {version} is not found",
                Status.NOT_FOUND,
            ) from None

    def versions(self, name: str) -> list[int]:
        entry = self._models.get(name)
        return sorted(entry.versions) if entry else []

    def loaded(self) -> list[ModelVersion]:
        with self._lock:
            return [v for e in self._models.values() for v in e.versions.values()]

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except InferError:
            return False
        return self._models[name].state == "READY"

    # -- internals ----------------------------------------------------------------------------
    def _load(self, name: str, config_json: str | None, files: dict | None) -> None:
        with self._load_lock:
            override = (
                model_config_from_json(config_json, f"config override for model '{name}'")
                if config_json
                else None
            )
            if files and override is None:
                raise ConfigError("'file:' parameters need a 'config' parameter as well")
            temp_dir = _write_files(name, files) if files else None
            repository = Path(temp_dir) if temp_dir else self.repository
            with self._lock:
                entry = self._models.setdefault(name, ModelEntry(name))
                old = dict(entry.versions) if entry.state == "READY" else {}
                entry.state, entry.reason = "LOADING", ""
            try:
                new = self._build(repository, name, override)
            except Exception as err:
                with self._lock:
                    entry.state = "READY" if old else "UNAVAILABLE"
                    entry.reason = "" if old else str(err)
                if temp_dir:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                if isinstance(err, RepositoryError | ConfigError | ValueError | InferError):
                    raise
                raise ValueError(f"{type(err).__name__}: {err}") from err
            with self._lock:
                old_temp, entry.temp_dir = entry.temp_dir, temp_dir
                entry.versions = new
                entry.state, entry.reason = "READY", ""
            for version in old.values():  # the new versions serve already; drain the old ones
                version.unload()
            if old_temp:
                shutil.rmtree(old_temp, ignore_errors=True)
            log.info("loaded model '%s' versions %s", name, sorted(new))

    def _build(self, repository: Path, name: str, override) -> dict[int, ModelVersion]:
        source = read_model(repository, name, override)
        backend = self._backends.get(source.backend) or make_backend(source.backend)
        self._backends[source.backend] = backend
        backend.auto_complete(source, source.versions[-1])
        built: dict[int, ModelVersion] = {}
        try:
            for version in source.versions:
                per_version = ModelSource(
                    name=source.name,
                    path=source.path,
                    config=type(source.config)(),
                    backend=source.backend,
                    versions=source.versions,
                )
                per_version.config.CopyFrom(source.config)
                model = ModelVersion(per_version, version, backend)
                model.load()
                built[version] = model
        except BaseException:
            for model in built.values():
                model.unload()
            raise
        return built

    def _unload(self, name: str) -> None:
        with self._lock:
            entry = self._models.get(name)
            if entry is None or not entry.versions:
                if entry is None:
                    try:
                        if name not in list_models(self.repository):
                            raise InferError(f"failed to unload '{name}': model not found",
                                             Status.NOT_FOUND)
                    except RepositoryError:
                        pass
                return
            versions, entry.versions = entry.versions, {}
            entry.state = "UNLOADING"
        for version in versions.values():
            version.unload()
        with self._lock:
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"
            temp, entry.temp_dir = entry.temp_dir, None
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


def _write_files(name: str, files: dict) -> str:
    """Repository API 'file:<version>/<name>' parameters become a temporary model folder."""
    root = tempfile.mkdtemp(prefix="ma-load-")
    model_dir = Path(root) / name
    model_dir.mkdir()
    for key, content in files.items():
        rel = Path(key.removeprefix("file:"))
        if rel.is_absolute() or ".." in rel.parts:
            shutil.rmtree(root, ignore_errors=True)
            raise ConfigError(f"parameter '{key}' must name a path inside the model folder")
        data = content if isinstance(content, bytes) else base64.b64decode(content)
        target = model_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root
