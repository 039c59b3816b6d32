"""The repository doctor: what would keep a Triton model repository from loading, each problem as
one line naming the path, what is wrong and the fix, found without serving anything.

Why: a layout mistake fails late and far from its cause -- a repository one folder too deep made
Triton look for `/mnt/models/1/config.pbtxt` and stop with "failed to load all models"
(shared/seeds/000). `model-analyzer check` and the start of every `profile` run these checks.

Models are read, never run: configs with Triton's schema, `model.py` compiled (not imported),
ONNX graphs with `onnx.load`, TorchScript files with `torch.jit.load` (which executes no Python)
for their forward() signature.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from google.protobuf import descriptor_pool
from tritonclient.grpc import model_config_pb2

from analyzer.config.config_rules import config_problems
from analyzer.config.model_config import (
    ConfigError,
    ConfigReadError,
    ModelConfig,
    load_model_config,
)
from analyzer.fsutil import UserFileError, read_user_bytes
from analyzer.repository.repository import (
    BACKENDS,
    CONFIG_FILE,
    ENSEMBLE,
    RepositoryError,
    available_versions,
    resolve_backend,
    select_versions,
)

KIND = model_config_pb2.ModelInstanceGroup.Kind
_DATA_TYPE = model_config_pb2.DataType
_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_ENUM = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
# ONNX TensorProto element types -> Triton data types
_ONNX_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
               6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL",
               10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64",
               16: "TYPE_BF16"}  # fmt: skip


AUTO_COMPLETING = {"python", "onnxruntime"}  # backends whose load may fill a tensor's fields


@dataclass(frozen=True)
class Finding:
    """One problem: where, what is wrong, how to fix it; a warning does not stop a profile."""

    path: str
    problem: str
    fix: str
    severity: str = "error"  # "error" | "warning"

    def line(self) -> str:
        head = "warning: " if self.severity == "warning" else ""
        return f"{head}{self.path}: {self.problem}; {self.fix}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def check_repository(
    repository: str | Path, models: list[str] | None = None, gpus: int = 0
) -> list[Finding]:
    """Every problem of the repository's models (or of `models` alone, with the models their
    ensembles call). RepositoryError when the repository folder itself does not exist."""
    root = Path(repository)
    if not root.is_dir():
        raise RepositoryError(f"model repository '{root}' does not exist or is not a directory")
    findings = _root_problems(root)
    if findings:
        return findings
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names and not models:
        return [Finding(str(root), "holds no model folder", "put each model in a folder of its "
                        "own: R/<model>/config.pbtxt and R/<model>/1/", "warning")]  # fmt: skip
    wanted = list(models or names)
    seen: set[str] = set()
    calls: dict[str, list[str]] = {}  # model -> the models its ensemble steps name
    while wanted:
        name = wanted.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name not in names:
            findings.append(Finding(str(root), f"has no model folder '{name}'",
                                    missing_model_hint(name, names)))  # fmt: skip
            continue
        checked = _ModelCheck(root, name, gpus)
        findings += checked.run()
        calls[name] = checked.calls
        wanted += [m for m in checked.calls if m not in seen]
    findings += _cycles(root, calls)
    return findings


def _cycles(root: Path, calls: dict[str, list[str]]) -> list[Finding]:
    """Ensembles that call each other round (Triton and the worker refuse to load them)."""
    found: list[Finding] = []
    reported: set[frozenset[str]] = set()

    def walk(name: str, path: list[str]) -> None:
        for callee in calls.get(name, []):
            if callee in path:
                loop = path[path.index(callee):] + [callee]
                if frozenset(loop) not in reported:
                    reported.add(frozenset(loop))
                    found.append(Finding(str(root / loop[0] / CONFIG_FILE), "ensembles call "
                                         "each other in a cycle: " + " -> ".join(loop),
                                         "remove a step so that no ensemble calls itself, "
                                         "directly or through another"))  # fmt: skip
            elif len(path) < 64:
                walk(callee, [*path, callee])

    for name in sorted(calls):
        walk(name, [name])
    return found


def missing_model_hint(name: str, names: list[str]) -> str:
    """What to say of a model name the repository has no folder for."""
    close = difflib.get_close_matches(name, names, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"it holds {', '.join(names)}" if names else "it holds no model folder"


def _root_problems(root: Path) -> list[Finding]:
    """A model folder given as the repository (the seed's mistake): Triton would take its
    version folder '1' for a model."""
    numeric = [p.name for p in root.iterdir()
               if p.is_dir() and p.name.isascii() and p.name.isdigit()]  # fmt: skip
    if not (root / CONFIG_FILE).exists() and not numeric:
        return []
    name = root.resolve().name
    found = CONFIG_FILE if (root / CONFIG_FILE).exists() else f"version folder {numeric[0]}/"
    return [Finding(str(root), f"is a model folder (it holds {found}), not a repository of "
                    "model folders: Triton would look for "
                    f"{root / (numeric[0] if numeric else '1') / CONFIG_FILE}",
                    f"move it into a repository folder: REPO/{name}/{CONFIG_FILE} and "
                    f"REPO/{name}/1/, then pass --model-repository REPO")]  # fmt: skip


class _ModelCheck:
    """The checks of one model folder, in the order a load would meet them."""

    def __init__(self, root: Path, name: str, gpus: int) -> None:
        self.root, self.name, self.gpus = root, name, gpus
        self.folder = root / name
        self.config_path = self.folder / CONFIG_FILE
        self.findings: list[Finding] = []
        self.calls: list[str] = []  # the models an ensemble's steps name

    def add(self, path: Path | str, problem: str, fix: str, severity: str = "error") -> None:
        self.findings.append(Finding(str(path), problem, fix, severity))

    def run(self) -> list[Finding]:
        config = self._config()
        versions = available_versions(self.folder)
        if not versions:
            self._no_versions()
            return self.findings
        if config is None:
            return self.findings
        if config.name and config.name != self.name:
            self.add(self.config_path, f"field 'name' is '{config.name}' but the model folder "
                     f"is '{self.name}'", f"set name: \"{self.name}\" or rename the folder "
                     f"to '{config.name}'")  # fmt: skip
        config.name = self.name
        try:
            backend = resolve_backend(config, self.folder, str(self.config_path))
            chosen = select_versions(config, versions, str(self.config_path))
        except RepositoryError as err:
            self.add(self.config_path, _after_path(str(err), self.config_path), "fix that field")
            return self.findings
        self._tensor_names(config)
        for problem in config_problems(config, data_types=backend not in AUTO_COMPLETING):
            self.add(self.config_path, problem, "Triton would not load it either")
        self._kinds(config)
        self._warmup(config)
        if backend == "pytorch" and not (config.input and config.output):
            self.add(self.config_path, "a TorchScript model's config lists no "
                     + ("inputs" if not config.input else "outputs"),
                     "declare every input and output (TorchScript files carry no tensor shapes)")
            return self.findings
        if backend == ENSEMBLE:
            self._ensemble(config)
            return self.findings
        for version in chosen:
            self._model_file(config, backend, version)
        if backend == "python":
            self._execution_env(config)
        return self.findings

    def _execution_env(self, config: ModelConfig) -> None:
        from analyzer.worker.backends.python_env import quick_problem

        problem = quick_problem(config, self.folder)
        if problem is not None:
            self.add(self.config_path, problem, "point EXECUTION_ENV_PATH at a conda-pack "
                     "archive or an environment folder holding bin/activate")  # fmt: skip

    # -- the config ---------------------------------------------------------------------------
    def _config(self) -> ModelConfig | None:
        if not self.config_path.exists() and not self.config_path.is_symlink():
            nested = sorted(self.folder.glob(f"*/{CONFIG_FILE}"))
            if nested:
                rel = nested[0].relative_to(self.root)
                self.add(nested[0], "config.pbtxt sits inside a version folder, where Triton "
                         "does not read it", f"move {rel} to {self.name}/{CONFIG_FILE}")
                return None
            return ModelConfig()  # python and onnx models may go without (auto-complete)
        try:
            return load_model_config(self.config_path)
        except ConfigReadError as err:
            self.add(err.where, err.problem, err.fix)
            return None
        except ConfigError as err:
            self._parse_error(str(err))
            return None

    def _parse_error(self, message: str) -> None:
        text = _after_path(message, self.config_path)
        line = re.match(r"line (\d+): ", text)
        where = f"{self.config_path}, line {line.group(1)}" if line else str(self.config_path)
        unknown = _UNKNOWN_FIELD.search(text)
        enum = _UNKNOWN_ENUM.search(text)
        if unknown:
            type_name, field = unknown.groups()
            names = [f.name for f in _message(type_name).fields]
            self.add(where, f"unknown field '{field}' in {type_name.split('.')[-1]}",
                     _closest(field, names, "a field"))  # fmt: skip
        elif enum:
            type_name, value = enum.groups()
            values = [v.name for v in _enum(type_name).values]
            self.add(where, f"unknown value {value} for {type_name.split('.')[-1]}",
                     _closest(value, values, "a value"))  # fmt: skip
        else:
            body = re.sub(r"^line \d+: ", "", text)
            self.add(where, body, "correct the syntax (Triton's protobuf text format)")

    def _no_versions(self) -> None:
        loose = [p.name for p in self.folder.iterdir()
                 if p.is_file() and p.name in {f for _, f in BACKENDS.values()}]  # fmt: skip
        named = [p.name for p in self.folder.iterdir() if p.is_dir() and re.search(r"\d", p.name)]
        if loose:
            fix = f"move {self.name}/{loose[0]} into {self.name}/1/"
        elif named:
            fix = f"rename {self.name}/{named[0]} to a number, e.g. {self.name}/1"
        else:
            fix = f"put the model file in {self.name}/1/"
        self.add(self.folder, "has no numeric version folder", fix)

    def _tensor_names(self, config: ModelConfig) -> None:
        for kind, tensors in (("input", config.input), ("output", config.output)):
            names = [t.name for t in tensors]
            for name in sorted({n for n in names if names.count(n) > 1}):
                self.add(self.config_path, f"{kind} '{name}' is declared {names.count(name)} "
                         "times", f"give each {kind} its own name")  # fmt: skip

    def _warmup(self, config: ModelConfig) -> None:
        """model_warmup samples the load would fail on (the worker runs them before READY)."""
        inputs = {t.name for t in config.input}
        controls = {c.name for c in config.sequence_batching.control_input}
        for index, sample in enumerate(config.model_warmup):
            name = sample.name or f"#{index}"
            for key, meta in sample.inputs.items():
                at = f"model_warmup '{name}' input '{key}'"
                if inputs and key not in inputs | controls:
                    self.add(self.config_path, f"{at} is not an input of the model",
                             _closest(key, sorted(inputs), "an input"))  # fmt: skip
                if any(d < 0 for d in meta.dims):
                    self.add(self.config_path, f"{at} has dims {list(meta.dims)}",
                             "give every dimension: the warm-up makes real tensors")  # fmt: skip
                if meta.WhichOneof("input_data_type") is None:
                    self.add(self.config_path, f"{at} has no data",
                             "set zero_data: true, random_data: true or input_data_file")
                elif meta.WhichOneof("input_data_type") == "input_data_file":
                    path = self.folder / "warmup" / meta.input_data_file
                    if not path.is_file():
                        self.add(path, f"is missing ({at} reads it)",
                                 f"put the raw input bytes in {self.name}/warmup/")  # fmt: skip

    def _kinds(self, config: ModelConfig) -> None:
        if self.gpus:
            return
        for index, group in enumerate(config.instance_group):
            if group.kind == KIND.KIND_GPU:
                self.add(self.config_path, f"instance_group[{index}] is KIND_GPU and this host "
                         "has no GPU", "profile measures it as KIND_CPU (cpu_only); write "
                         "KIND_CPU to serve it here", "warning")  # fmt: skip

    # -- the model file -----------------------------------------------------------------------
    def _model_file(self, config: ModelConfig, backend: str, version: int) -> None:
        filename = config.default_model_filename or BACKENDS[backend][1]
        path = self.folder / str(version) / filename
        if not path.exists():
            folder = self.folder / str(version)
            others = []  # hints only for a plain file name, and never a hidden file
            if path.parent == folder:
                others = sorted(p.name for p in folder.iterdir()
                                if p.is_file() and not p.name.startswith("."))  # fmt: skip
            fix = (f"rename {self.name}/{version}/{others[0]} to {filename}, or set "
                   f"default_model_filename: \"{others[0]}\"" if others
                   else f"put the {backend} model there as {filename}")  # fmt: skip
            self.add(path, f"is missing ({backend}'s model file)", fix)
            return
        if backend == "python":
            self._python(config, path)
        elif backend == "onnxruntime":
            self._onnx(config, path)
        elif backend == "pytorch":
            self._torchscript(config, path)

    def _python(self, config: ModelConfig, path: Path) -> None:
        try:
            tree = compile(read_user_bytes(path), str(path), "exec", ast.PyCF_ONLY_AST)
        except UserFileError as err:
            self.add(err.where, err.problem, err.fix)
        except SyntaxError as err:
            self.add(f"{path}, line {err.lineno}", f"does not compile: {err.msg}",
                     "fix the Python syntax (the file was compiled, not run)")  # fmt: skip
        except (ValueError, OSError) as err:
            self.add(path, f"cannot be read as Python: {err}", "save it as UTF-8 Python source")
        else:
            self._python_io(config, path, tree)
            self._python_api(path, tree)

    def _python_io(self, config: ModelConfig, path: Path, tree: ast.AST) -> None:
        """A python model whose config lists no inputs or outputs needs auto_complete_config to
        add them (the load refused it while check said nothing)."""
        missing = [kind for kind, have in (("inputs", config.input), ("outputs", config.output))
                   if not have]  # fmt: skip
        if not missing:
            return
        completes = any(isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel" and any(
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and item.name == "auto_complete_config" for item in node.body)
            for node in ast.walk(tree))  # fmt: skip
        if completes:
            return
        where = self.config_path if self.config_path.exists() else self.folder
        self.add(where, f"the config lists no {' and no '.join(missing)}, and {path.name}'s "
                 "TritonPythonModel has no auto_complete_config to add them",
                 f"declare the model's {' and '.join(missing)} in {self.name}/{CONFIG_FILE}, or "
                 "add auto_complete_config to TritonPythonModel")  # fmt: skip

    def _python_api(self, path: Path, tree: ast.AST) -> None:
        """A name of triton_python_backend_utils that the worker's does not provide: the model
        would meet an AttributeError (or an ImportError) where it uses it, mid-profile."""
        provided = _pb_utils_names()
        aliases: set[str] = set()
        used: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update(alias.asname or alias.name for alias in node.names
                               if alias.name == _PB_UTILS)  # fmt: skip
            elif isinstance(node, ast.ImportFrom) and node.module == _PB_UTILS:
                for alias in node.names:
                    if alias.name != "*":
                        used.setdefault(alias.name, node.lineno)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases:  # fmt: skip
                used.setdefault(node.attr, node.lineno)
        for name, line in sorted(used.items(), key=lambda item: item[1]):
            if name not in provided:
                self.add(f"{path}, line {line}", f"uses {_PB_UTILS}.{name}, which this worker's "
                         f"{_PB_UTILS} does not provide",
                         "the model fails where it reaches that line; see the README's python "
                         "models section for what is provided", "warning")  # fmt: skip

    def _onnx(self, config: ModelConfig, path: Path) -> None:
        try:
            import onnx
        except ImportError:  # pragma: no cover - onnx comes with the test extras only
            return
        try:
            graph = onnx.load(str(path), load_external_data=False).graph
        except Exception as err:  # noqa: BLE001 - any unreadable file is the finding
            self.add(path, f"is not a readable ONNX model ({type(err).__name__})",
                     "export the model again")  # fmt: skip
            return
        self._onnx_external_data(path, graph)
        initializers = {i.name for i in graph.initializer}
        model_inputs = {v.name: v for v in graph.input if v.name not in initializers}
        model_outputs = {v.name: v for v in graph.output}
        batched = config.max_batch_size > 0
        for kind, declared, actual in (("input", config.input, model_inputs),
                                       ("output", config.output, model_outputs)):  # fmt: skip
            for tensor in declared:
                found = actual.get(tensor.name)
                if found is None:
                    self.add(self.config_path, f"{kind} '{tensor.name}' is not an {kind} of "
                             f"{path.name}", _closest(tensor.name, list(actual), f"an {kind}"))
                    continue
                self._onnx_tensor(kind, tensor, found, batched)

    def _onnx_external_data(self, path: Path, graph) -> None:
        """Weights kept in files beside the model (models over 2 GB must): each file must be
        there, inside the model's folder, and long enough; one finding per file, however many
        tensors it holds (the load failed on it while check said nothing)."""
        files: dict[str, tuple[str, int]] = {}  # location -> (first tensor, bytes it must have)
        for tensor in graph.initializer:
            if tensor.data_location != 1:  # TensorProto.EXTERNAL
                continue
            entry = {e.key: e.value for e in tensor.external_data}
            location = entry.get("location", "")
            try:
                end = int(entry.get("offset") or 0) + int(entry.get("length") or 0)
            except ValueError:
                end = 0
            first, need = files.get(location, (tensor.name, 0))
            files[location] = (first, max(need, end))
        folder = path.parent.resolve()
        for location, (first, need) in files.items():
            target = (path.parent / location).resolve()
            where = f"{path.name}'s tensor '{first}'"
            if not location or Path(location).is_absolute() or not target.is_relative_to(folder):
                self.add(path, f"{where} has its data in '{location}', outside the model's "
                         "folder (external data must be a relative path beside the model)",
                         "export the model again with its external data beside it")  # fmt: skip
            elif not target.is_file():
                self.add(path, f"{where} has its data in '{location}', which is not there",
                         f"copy '{location}' into {path.parent} with the model (external data "
                         "is read relative to the model file)")  # fmt: skip
            elif target.stat().st_size < need:
                self.add(target, f"holds {target.stat().st_size} bytes but {path.name}'s "
                         f"tensors need {need}", "copy the whole file again")  # fmt: skip

    def _onnx_tensor(self, kind: str, tensor, value, batched: bool) -> None:
        ttype = value.type.tensor_type
        wanted = _ONNX_TYPES.get(ttype.elem_type)
        have = _DATA_TYPE.Name(tensor.data_type)
        if wanted and have != wanted:
            self.add(self.config_path, f"{kind} '{tensor.name}' is {have} but the model's is "
                     f"{wanted}", f"write data_type: {wanted}")  # fmt: skip
        if not ttype.HasField("shape"):
            return
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
        declared = list(tensor.dims)
        if batched:
            if len(dims) == len(declared) + 1 and dims[0] > 0:
                self.add(self.config_path, f"max_batch_size is > 0 but {kind} '{tensor.name}' "
                         f"of the model has a fixed first dimension ({dims[0]}): no batch "
                         "dimension", "set max_batch_size: 0, or export the model with a "
                         "dynamic first dimension")  # fmt: skip
                return
            dims = dims[1:]
        if len(dims) != len(declared) or any(
            d != c and d != -1 and c != -1 for d, c in zip(dims, declared, strict=False)
        ):
            shown = dims if not batched else ["batch", *dims]
            self.add(self.config_path, f"{kind} '{tensor.name}' has dims {declared} but the "
                     f"model's shape is {shown}",
                     f"write dims: {dims}" + (" (without the batch dimension)"
                                              if batched else ""))  # fmt: skip

    def _torchscript(self, config: ModelConfig, path: Path) -> None:
        import torch

        from analyzer.worker.backends.torchscript import _argument_order

        try:
            module = torch.jit.load(str(path), map_location="cpu")
        except Exception as err:  # noqa: BLE001 - any unreadable file is the finding
            self.add(path, f"is not a readable TorchScript file ({type(err).__name__})",
                     "save it with torch.jit.save of a scripted or traced module")  # fmt: skip
            return
        try:
            _argument_order(module, [i.name for i in config.input], self.name)
        except ValueError as err:
            self.add(self.config_path, _after_path(str(err), f"model '{self.name}'"),
                     "name inputs NAME__0, NAME__1, ... in argument order, or as forward()'s "
                     "arguments")  # fmt: skip
            return
        try:
            schema = module.forward.schema
        except (AttributeError, RuntimeError):
            return
        arguments = schema.arguments[1:]
        required = [a for a in arguments if not a.has_default_value()]
        if not len(required) <= len(config.input) <= len(arguments):
            takes = (f"{len(required)}" if len(required) == len(arguments)
                     else f"{len(required)} to {len(arguments)}")  # fmt: skip
            self.add(self.config_path, f"declares {len(config.input)} input(s) but forward() of "
                     f"{path.name} takes {takes}",
                     "declare one input per argument of forward()")  # fmt: skip
        returned = schema.returns[0].type if schema.returns else None
        if returned is not None and str(returned) == "Tensor" and len(config.output) > 1:
            self.add(self.config_path, f"declares {len(config.output)} outputs but forward() of "
                     f"{path.name} returns one tensor", "declare one output")  # fmt: skip
        elif isinstance(returned, torch.TupleType) and len(config.output) > len(
            returned.elements()
        ):
            self.add(self.config_path, f"declares {len(config.output)} outputs but forward() of "
                     f"{path.name} returns {len(returned.elements())}",
                     "declare one output per element of the returned tuple")  # fmt: skip

    # -- ensembles ----------------------------------------------------------------------------
    def _ensemble(self, config: ModelConfig) -> None:
        available = {t.name for t in config.input}
        kinds = {t.name: t.data_type for t in config.input if t.data_type}  # tensor -> type
        for index, step in enumerate(config.ensemble_scheduling.step):
            at = f"{self.config_path}, step {index + 1} ('{step.model_name}')"
            target = self.root / step.model_name
            if not step.model_name or not target.is_dir():
                names = sorted(p.name for p in self.root.iterdir() if p.is_dir())
                self.add(at, f"names model '{step.model_name}', which is not in the repository",
                         _closest(step.model_name, names, "a model"))  # fmt: skip
                continue
            self.calls.append(step.model_name)
            inputs, outputs = _declared_tensors(target / CONFIG_FILE)
            for key, tensor in step.input_map.items():
                if inputs is not None and key not in inputs:
                    self.add(at, f"input_map key '{key}' is not an input of '{step.model_name}'",
                             _closest(key, sorted(inputs), "an input"))  # fmt: skip
                have, want = kinds.get(tensor), (inputs or {}).get(key)
                if have and want and have != want:  # (serve refused it; check said nothing)
                    self.add(at, f"tensor '{tensor}' is {_type_name(have)} but input '{key}' of "
                             f"'{step.model_name}' is {_type_name(want)}", "make the two data "
                             "types agree (or add a step that converts)")  # fmt: skip
                if tensor not in available:
                    self.add(at, f"input_map value '{tensor}' is neither an ensemble input nor "
                             "an earlier step's output_map value", "map it from one of: "
                             + ", ".join(sorted(available)))  # fmt: skip
            for key, tensor in step.output_map.items():
                if outputs is not None and key not in outputs:
                    self.add(at, f"output_map key '{key}' is not an output of "
                             f"'{step.model_name}'", _closest(key, sorted(outputs), "an output"))
                kind = (outputs or {}).get(key)
                if kind:
                    kinds[tensor] = kind
                available.add(tensor)
        for output in config.output:
            if output.name not in available:
                self.add(self.config_path, f"ensemble output '{output.name}' is produced by no "
                         "step", "name it as a step's output_map value")  # fmt: skip


_PB_UTILS = "triton_python_backend_utils"


def _pb_utils_names() -> set[str]:
    """The public names of the triton_python_backend_utils that python models get here."""
    from analyzer.worker.backends.pb_utils import triton_python_backend_utils as pb_utils

    return {name for name in dir(pb_utils) if not name.startswith("_")}


def _type_name(data_type: int) -> str:
    return str(model_config_pb2.DataType.Name(data_type))


def _declared_tensors(path: Path) -> tuple[dict[str, int] | None, dict[str, int] | None]:
    """A composing model's declared inputs and outputs, name -> data type (0: not given);
    None: unknown (no config, or it lists none)."""
    try:
        config = load_model_config(path)
    except ConfigError:
        return None, None
    inputs = {t.name: t.data_type for t in config.input} or None
    outputs = {t.name: t.data_type for t in config.output} or None
    return inputs, outputs


def _message(full_name: str):
    return descriptor_pool.Default().FindMessageTypeByName(full_name)


def _enum(full_name: str):
    return descriptor_pool.Default().FindEnumTypeByName(full_name)


def _closest(word: str, choices: list[str], what: str) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"use {what} of: {', '.join(choices[:12])}" if choices else f"there is no {what}"


def _after_path(message: str, path: Path | str) -> str:
    """A message without its leading '<path>: ' or '<path>, ' (the finding names the path)."""
    for prefix in (f"{path}: ", f"{path}, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message
