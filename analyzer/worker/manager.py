"""Which models are loaded: startup per model-control mode, and the repository API's load/unload.

Loads and unloads of one model name are serialized by that name's lock; different models never
wait on each other, so a model hanging in its `initialize` blocks only itself. `_lock` guards the
shared dicts and is held only for short updates.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from analyzer.config.config_rules import config_problems
from analyzer.config.model_config import ConfigError, ModelConfig, model_config_from_json
from analyzer.repository.repository import (
    CONFIG_FILE,
    ENSEMBLE,
    ModelSource,
    RepositoryError,
    list_models,
    read_model,
)
from analyzer.worker.backends.base import Backend
from analyzer.worker.ensemble import EnsembleVersion, composing_models
from analyzer.worker.errors import InferError, Status
from analyzer.worker.limits import HeldBytes, Limits
from analyzer.worker.load_deadline import load_deadline
from analyzer.worker.model import ModelVersion, instance_specs
from analyzer.worker.names import check_model_name

log = logging.getLogger(__name__)
Served = ModelVersion | EnsembleVersion  # what a loaded model version is, to the protocols
# a model folder's files as poll mode compares them: (path, size, mtime in ns)
FolderFiles = tuple[tuple[str, int, int], ...]

CONTROL_MODES = ("none", "explicit", "poll")
UPLOAD_FLAG = "--allow-model-file-uploads=true"
# errors whose message already says what is wrong; anything else is prefixed with its type
_CLEAN_ERRORS = (RepositoryError, ConfigError, ValueError, InferError)


def make_backend(name: str, models: ModelManager | None = None) -> Backend:
    """Import backends lazily: a python-only repository never imports torch or onnxruntime."""
    if name == "pytorch":
        from analyzer.worker.backends.torchscript import TorchScriptBackend

        return TorchScriptBackend()
    if name == "onnxruntime":
        from analyzer.worker.backends.onnx import OnnxBackend

        return OnnxBackend()
    if name == "python":
        from analyzer.worker.backends.python import PythonBackend

        return PythonBackend(models)  # BLS requests find their models here
    raise RepositoryError(f"backend '{name}' is not supported")


@dataclass
class ModelEntry:
    name: str
    versions: dict[int, Served] = field(default_factory=dict)
    state: str = ""  # "" = never loaded; READY, UNAVAILABLE, LOADING, UNLOADING
    reason: str = ""
    temp_dir: str | None = None


class ModelManager:
    def __init__(
        self,
        repository: str | Path | list[str] | list[Path],
        control_mode: str = "none",
        allow_file_uploads: bool = False,
        max_instance_count: int = 64,
        auto_complete: bool = True,
        load_timeout_s: float = 0.0,
        max_total_instances: int = Limits.max_total_instances,
        max_queued_bytes: int = Limits.max_queued_bytes,
    ):
        if control_mode not in CONTROL_MODES:
            raise ValueError(
                f"--model-control-mode '{control_mode}' is not one of {', '.join(CONTROL_MODES)}"
            )
        # Triton's --model-repository may be given more than once: every one is served
        self.repositories = [Path(r) for r in
                             (repository if isinstance(repository, list | tuple) else [repository])]
        self.control_mode = control_mode
        self.auto_complete = auto_complete  # off: --disable-auto-complete-config
        self._polled: dict[str, FolderFiles] = {}  # poll mode: the files at last look
        self.allow_file_uploads = allow_file_uploads
        self.max_instance_count = max_instance_count
        self.load_timeout_s = load_timeout_s  # --model-load-timeout-secs (0: as long as it takes)
        self.max_total_instances = max_total_instances  # every loaded model's together
        self.held = HeldBytes(max_queued_bytes)  # every model's unanswered requests together
        self._reserved = 0  # instances of loads being built now
        self._lock = threading.RLock()
        self._name_locks: dict[str, threading.Lock] = {}
        self._backends_lock = threading.Lock()
        self._closing = False
        # the serving event loop (bind_loop), where readiness checks run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._models: dict[str, ModelEntry] = {}
        self._backends: dict[str, Backend] = {}
        self._loading = threading.local()  # the names this thread is loading (ensemble chains)

    # -- startup / shutdown -------------------------------------------------------------------
    def startup(self, load_models: list[str]) -> list[str]:
        """Load the models the control mode asks for; return one error line per failed model."""
        names = self._names()
        if self.control_mode == "poll":
            self._polled = self._snapshot()
        if self.control_mode in ("none", "poll") or "*" in load_models:
            wanted = names
        else:
            wanted = load_models
        errors = []
        for name in wanted:
            if self.is_ready(name):
                continue  # loaded already, as a composing model of an ensemble before it
            try:
                self._load(name, None, None)
            except (InferError, RepositoryError, ConfigError, ValueError) as err:
                errors.append(f"failed to load '{name}': {err}")
        return errors

    def _names(self) -> list[str]:
        """Every model of every repository (a name in two repositories is listed once; loading
        it is the error)."""
        return sorted({name for r in self.repositories for name in list_models(r)})

    def _repository_of(self, name: str) -> Path | None:
        found = [r for r in self.repositories if (r / name).is_dir()]
        if len(found) > 1:
            raise RepositoryError(f"model '{name}' is in more than one model repository: "
                                  + ", ".join(map(str, found)))  # fmt: skip
        return found[0] if found else None

    def _snapshot(self) -> dict[str, FolderFiles]:
        out: dict[str, FolderFiles] = {}
        for repository in self.repositories:
            for name, files in _snapshot(repository).items():
                out[name] = out.get(name, ()) + files
        return out

    def poll(self) -> list[str]:
        """One pass of Triton's poll mode: a model folder added to the repository is loaded, one
        removed is unloaded, one whose files changed (a file added, removed, resized or touched)
        is loaded again -- the new versions serve before the old ones drain, and a failed reload
        keeps the old ones. Returns one line per failure."""
        try:
            now = self._snapshot()
        except (RepositoryError, OSError) as err:
            return [f"repository poll: {err}"]
        before, self._polled = self._polled, now
        errors = []
        for name in sorted(set(before) - set(now)):
            self._unload(name, missing_ok=True)
            log.info("poll: model '%s' left the repository: unloaded", name)
        for name in sorted(now):
            if before.get(name) == now[name]:
                continue
            try:
                self._load(name, None, None)
            except (InferError, RepositoryError, ConfigError, ValueError) as err:
                errors.append(f"failed to load '{name}': {err}")
        return errors

    def shutdown(self) -> None:
        """Refuse new loads, wait for loads in progress, then unload every model."""
        with self._lock:
            self._closing = True
            names = set(self._models) | set(self._name_locks)
        for name in sorted(names):
            self._unload(name, missing_ok=True)

    # -- repository API -----------------------------------------------------------------------
    def load(self, name: str, config_json: str | None = None,
             files: Mapping[str, object] | None = None) -> None:  # fmt: skip
        self.require_explicit()
        check_model_name(name)  # also checked by the protocol layer; the folder depends on it
        if files and not self.allow_file_uploads:
            raise InferError(
                f"load of model '{name}' refused: 'file:' parameters are model code, which this "
                f"worker accepts only when started with {UPLOAD_FLAG}"
            )
        try:
            self._load(name, config_json, files)
        except (RepositoryError, ConfigError, ValueError) as err:
            raise InferError(f"failed to load '{name}': {err}") from None

    def unload(self, name: str, dependents: bool = False) -> None:
        """`dependents`: an ensemble's composing models are unloaded too, after it (Triton's
        `unload_dependents`)."""
        self.require_explicit()
        check_model_name(name)
        composing = self._composing(name) if dependents else []
        self._unload(name)
        for model in composing:
            if self._used_by_loaded_ensemble(model):
                continue  # another loaded ensemble still calls it
            nested = self._composing(model)
            self._unload(model, missing_ok=True)
            composing.extend(m for m in nested if m not in composing)

    def _composing(self, name: str) -> list[str]:
        with self._lock:
            entry = self._models.get(name)
            versions = list(entry.versions.values()) if entry else []
        return [m for v in versions if isinstance(v, EnsembleVersion)
                for m in composing_models(v.config)]  # fmt: skip

    def _used_by_loaded_ensemble(self, name: str) -> bool:
        return any(isinstance(v, EnsembleVersion) and name in composing_models(v.config)
                   for v in self.loaded())  # fmt: skip

    def require_explicit(self) -> None:
        """InferError unless models may be loaded and unloaded on request."""
        if self.control_mode != "explicit":
            raise InferError(
                "explicit model load / unload is not allowed if polling is enabled or "
                "--model-control-mode is none",
                Status.UNAVAILABLE,
            )

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            known = dict(self._models)
        try:
            names = sorted(set(self._names()) | set(known))
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
                        {
                            "name": name,
                            "version": str(version),
                            "state": entry.state,
                            "reason": entry.reason,
                        }
                    )
            elif not ready_only:
                rows.append(
                    {"name": name, "version": "", "state": entry.state, "reason": entry.reason}
                )
        if ready_only:
            rows = [r for r in rows if r.get("state") == "READY"]
        return rows

    # -- lookups on the request path ----------------------------------------------------------
    def get(self, name: str, version: str = "") -> Served:
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

    def loaded(self) -> list[Served]:
        with self._lock:
            return [v for e in self._models.values() for v in e.versions.values()]

    def all_ready(self) -> bool:
        """Triton's strict readiness: no model failed to load or is still loading (one unloaded
        on purpose does not count)."""
        with self._lock:
            return all(e.state in ("", "READY") or (e.state == "UNAVAILABLE"
                                                     and e.reason == "unloaded")
                       for e in self._models.values())  # fmt: skip

    def is_ready(self, name: str, version: str = "") -> bool:
        """Loaded and READY (the state the repository index shows)."""
        try:
            self.get(name, version)
        except InferError:
            return False
        return self._models[name].state == "READY"

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """(On `loop`.) The event loop that serves the endpoints: readiness asked from other
        threads (a model's pb_utils.is_model_ready) runs there."""
        self._loop, self._loop_thread = loop, threading.get_ident()

    def ask_ready(self, name: str, version: str, done: Callable[[bool], None]) -> None:
        """`model_ready` for a thread other than the loop's (a model's pb_utils.is_model_ready,
        which in Triton asks the named model's instances too): `done(ready)` is called when
        the answer is in, on the loop; the asking thread does not wait (it may be the one
        that reads a model's responses)."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread or loop.is_closed():
            done(self.is_ready(name, version))
            return

        async def ask() -> bool:
            ready = self.model_ready(name, version)
            return ready if isinstance(ready, bool) else await ready

        def answer(future: concurrent.futures.Future[bool]) -> None:
            done(not future.cancelled() and future.exception() is None and future.result())

        try:
            asyncio.run_coroutine_threadsafe(ask(), loop).add_done_callback(answer)
        except RuntimeError:  # the loop closed meanwhile
            done(False)

    def model_ready(self, name: str, version: str = "") -> bool | Coroutine[Any, Any, bool]:
        """(On an event loop.) The readiness endpoints' answer, as Triton's: READY and every
        instance able to serve (`ModelVersion.probe_ready`); a coroutine when a model must
        be asked."""
        if not self.is_ready(name, version):
            return False
        try:
            return self.get(name, version).probe_ready()
        except InferError:  # unloaded meanwhile
            return False

    # -- internals ----------------------------------------------------------------------------
    def _name_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._name_locks.setdefault(name, threading.Lock())

    def _load(self, name: str, config_json: str | None,
              files: Mapping[str, object] | None) -> None:  # fmt: skip
        override = (
            model_config_from_json(config_json, f"config override for model '{name}'")
            if config_json
            else None
        )
        if files and override is None:
            raise ConfigError("'file:' parameters need a 'config' parameter as well")
        if not files and self._repository_of(name) is None:  # no lock for unknown names
            where = ", ".join(f"'{r}'" for r in self.repositories)
            raise RepositoryError(f"model '{name}' is not in repository {where}")
        with self._name_lock(name):
            if self._closing:
                raise InferError(f"model '{name}' not loaded: the worker is shutting down",
                                 Status.UNAVAILABLE)  # fmt: skip
            temp_dir = _write_files(name, files) if files else None
            try:
                new, old = self._build_entry(name, temp_dir, override)
            except BaseException:  # the uploaded folder never outlives a failed load
                if temp_dir:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                raise
            with self._lock:
                entry = self._models[name]
                old_temp, entry.temp_dir = entry.temp_dir, temp_dir
                entry.versions = new
                entry.state, entry.reason = "READY", ""
            for version in old.values():  # the new versions serve already; drain the old ones
                version.unload()
            if old_temp:
                shutil.rmtree(old_temp, ignore_errors=True)
            log.info("loaded model '%s' versions %s", name, sorted(new))

    def _build_entry(
        self, name: str, temp_dir: str | None, override: ModelConfig | None
    ) -> tuple[dict[int, Served], dict[int, Served]]:
        """Build the new versions while the old ones (if any) keep serving; (new, old)."""
        repository = Path(temp_dir) if temp_dir else self._repository_of(name)
        if repository is None:
            raise RepositoryError(f"model '{name}' left the repository")
        with self._lock:
            entry = self._models.setdefault(name, ModelEntry(name))
            old = dict(entry.versions) if entry.state == "READY" else {}
            entry.state, entry.reason = "LOADING", ""
        try:
            with load_deadline(name, self.load_timeout_s):
                return self._build(repository, name, override), old
        except BaseException as err:
            with self._lock:
                entry.state = "READY" if old else "UNAVAILABLE"
                entry.reason = "" if old else str(err)
            if isinstance(err, _CLEAN_ERRORS) or not isinstance(err, Exception):
                raise
            raise ValueError(f"{type(err).__name__}: {err}") from err

    def _backend(self, name: str) -> Backend:
        with self._backends_lock:
            backend = self._backends.get(name)
            if backend is None:
                backend = self._backends[name] = make_backend(name, self)
            return backend

    def _build(self, repository: Path, name: str,
               override: ModelConfig | None) -> dict[int, Served]:  # fmt: skip
        source = read_model(repository, name, override)
        if source.backend == ENSEMBLE:
            _refuse_what_triton_refuses(source)
            return self._build_ensemble(source)
        backend = self._backend(source.backend)
        if self.auto_complete:
            backend.auto_complete(source, source.versions[-1])
        _refuse_what_triton_refuses(source)
        needed = len(source.versions) * len(instance_specs(
            source.config, backend.gpu_capable(), self.max_instance_count))  # fmt: skip
        self._reserve(name, needed)
        built: dict[int, Served] = {}
        try:
            for version in source.versions:
                model = ModelVersion(_one_version(source), version, backend,
                                     self.max_instance_count, self.held)  # fmt: skip
                model.load()
                built[version] = model
        except BaseException:
            for loaded in built.values():
                loaded.unload()
            raise
        finally:
            with self._lock:
                self._reserved -= needed
        return built

    def _reserve(self, name: str, needed: int) -> None:
        """Room for `needed` more instances under --max-total-instances, held until the load
        ends (the versions of `name` being replaced do not count: they go once it serves)."""
        with self._lock:
            loaded = sum(len(getattr(version, "runners", ())) for entry in self._models.values()
                         if entry.name != name for version in entry.versions.values())
            if loaded + self._reserved + needed > self.max_total_instances:
                raise ValueError(
                    f"model '{name}' needs {needed} instance(s), and the loaded models have "
                    f"{loaded + self._reserved} of the {self.max_total_instances} this worker "
                    "runs at most (--max-total-instances); unload a model first")  # fmt: skip
            self._reserved += needed

    def _build_ensemble(self, source: ModelSource) -> dict[int, Served]:
        """An ensemble loads after its composing models, as Triton's does: those not loaded yet
        are loaded first (an explicit load of an ensemble loads what it needs)."""
        stack: list[str] = getattr(self._loading, "names", [])
        self._loading.names = [*stack, source.name]
        try:
            for dependency in composing_models(source.config):
                if dependency in self._loading.names:
                    chain = " -> ".join([*self._loading.names, dependency])
                    raise ValueError(f"ensembles call each other in a cycle: {chain}")
                if not self.is_ready(dependency):
                    try:
                        self._load(dependency, None, None)
                    except (InferError, RepositoryError, ConfigError, ValueError) as err:
                        raise ValueError(f"ensemble '{source.name}' needs model "
                                         f"'{dependency}', which failed to load: {err}"
                                         ) from None  # fmt: skip
        finally:
            self._loading.names = stack
        built: dict[int, Served] = {}
        for version in source.versions:
            ensemble = EnsembleVersion(_one_version(source), version, self)
            ensemble.load()
            built[version] = ensemble
        return built

    def _unload(self, name: str, missing_ok: bool = False) -> None:
        if name not in self._models and not any((r / name).is_dir() for r in self.repositories):
            if missing_ok:
                return
            raise InferError(f"failed to unload '{name}': model not found", Status.NOT_FOUND)
        with self._name_lock(name):  # waits for a load of this model in progress
            with self._lock:
                entry = self._models.get(name)
                if entry is None:
                    return
                if not entry.versions:  # nothing served (a failed load): unloaded all the same
                    if entry.state == "UNAVAILABLE":
                        entry.reason = "unloaded"
                    return
                versions, entry.versions = entry.versions, {}
                entry.state = "UNLOADING"
            try:
                for version in versions.values():
                    version.unload()
            finally:
                with self._lock:
                    entry.state, entry.reason = "UNAVAILABLE", "unloaded"
                    temp, entry.temp_dir = entry.temp_dir, None
                if temp:
                    shutil.rmtree(temp, ignore_errors=True)


def _snapshot(repository: Path) -> dict[str, FolderFiles]:
    """Each model folder's files (path, size, mtime): what poll mode compares between looks."""
    out: dict[str, FolderFiles] = {}
    for name in list_models(repository):
        files = []
        for root, _, names in os.walk(repository / name):
            for file in names:
                path = Path(root) / file
                try:
                    info = path.stat()
                except OSError:  # removed while walking: the next look sees it gone
                    continue
                files.append((str(path.relative_to(repository)), info.st_size, info.st_mtime_ns))
        out[name] = tuple(sorted(files))
    return out


def _one_version(source: ModelSource) -> ModelSource:
    """A copy of the source with its own config: each version's config is completed apart."""
    copy = ModelSource(name=source.name, path=source.path, config=type(source.config)(),
                       backend=source.backend, versions=source.versions,
                       overridden=source.overridden)  # fmt: skip
    copy.config.CopyFrom(source.config)
    return copy


def _write_files(name: str, files: Mapping[str, object]) -> str:
    """Repository API 'file:<path>' parameters become a private temporary model folder.

    mkdtemp makes the folder 0700; it is removed again if any parameter is refused or unwritable.
    """
    root = tempfile.mkdtemp(prefix="ma-load-")
    try:
        model_dir = Path(root) / name
        model_dir.mkdir()
        for key, content in files.items():
            target = _upload_target(model_dir, key)
            data = _decode_upload(key, content)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as err:
                raise ConfigError(f"parameter '{key}' cannot be written: {err.strerror}") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def _upload_target(model_dir: Path, key: str) -> Path:
    """The file a 'file:' key names: a relative path that stays inside the model folder."""
    rel = key.removeprefix("file:")
    parts = PurePosixPath(rel).parts if "\0" not in rel else ()
    if not parts or rel.startswith("/") or ".." in parts:
        shown = key.encode("unicode_escape").decode("ascii")
        raise ConfigError(
            f"parameter '{shown}' must name a relative path inside the model folder "
            "(no leading '/', no '..')"
        )
    target = model_dir.joinpath(*parts)
    if not target.resolve().is_relative_to(model_dir.resolve()):
        raise ConfigError(f"parameter '{key}' leads outside the model folder")
    return target


def _decode_upload(key: str, content: object) -> bytes:
    """gRPC sends raw bytes; HTTP sends base64 text."""
    if isinstance(content, bytes):
        return content
    if not isinstance(content, str):
        raise ConfigError(
            f"parameter '{key}' must be a base64 string, got {type(content).__name__}"
        )
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"parameter '{key}' is not valid base64") from None


def _refuse_what_triton_refuses(source: ModelSource) -> None:
    """A config Triton's core would not load (after auto-complete): the first problem, with the
    file, as the load's error."""
    problems = config_problems(source.config)
    if problems:
        where = "the config override" if source.overridden else str(source.path / CONFIG_FILE)
        raise ConfigError(f"{where}: {problems[0]}")
