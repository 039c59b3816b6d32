"""pytorch_libtorch: TorchScript `model.pt`, with Triton's input/output naming rules.

Inputs named `<name>__<i>` are positional argument i; other names are matched to the names of
`forward`'s arguments. Outputs named `<name>__<i>` take element i of the returned tuple; otherwise
outputs follow the config order (a dict result is matched by key).

A GPU instance runs its batch as one TorchScript call (`device_call`): inputs to the device, the
model, every output back to host memory. Measured on an H200 (BENCHMARKS.md, "GPU instances in one
call"), the separate Python steps around the model -- a stream context, each input's copy, each
output's copy, each a GIL release and re-acquire next to the busy event loop -- cost 15-20% of
tiny_cnn's served throughput. The instance's own CUDA stream is made current once, on its thread.
"""

from __future__ import annotations

import itertools
import linecache
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analyzer.datatypes import config_to_wire, wire_to_numpy
from analyzer.repository.repository import ModelSource
from analyzer.worker.backends.base import Backend, BackendInstance, InstanceSpec, TensorInstance
from analyzer.worker.validate import model_type_name

_INDEXED = re.compile(r"^.+__(\d+)$")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class TorchScriptBackend(Backend):
    name = "pytorch"

    def gpu_capable(self) -> bool:
        return torch.cuda.is_available()

    def auto_complete(self, source: ModelSource, version: int) -> None:
        config = source.config
        if not config.input or not config.output:
            raise ValueError(
                f"model '{source.name}': pytorch_libtorch configs must list every input and "
                "output (TorchScript files do not carry tensor shapes)"
            )
        for tensor in list(config.input) + list(config.output):
            if config_to_wire(model_type_name(tensor.data_type)) == "BYTES":
                raise ValueError(
                    f"model '{source.name}': TYPE_STRING tensor '{tensor.name}' is not supported "
                    "by the TorchScript backend; use the python backend"
                )

    def create_instance(
        self, source: ModelSource, version: int, spec: InstanceSpec
    ) -> BackendInstance:
        path = source.model_file(version)
        if not path.exists():
            raise ValueError(f"model '{source.name}' version {version}: {path} does not exist")
        return TorchScriptInstance(source, path, spec)


class TorchScriptInstance(TensorInstance):
    def __init__(self, source: ModelSource, path: Path, spec: InstanceSpec) -> None:
        config = source.config
        super().__init__(batched=config.max_batch_size > 0)
        self.spec = spec
        if spec.kind == "GPU":
            self.device = torch.device("cuda", spec.device_id)
            self.stream: torch.cuda.Stream | None = torch.cuda.Stream(  # type: ignore[no-untyped-call]
                device=self.device)
        else:
            self.device = torch.device("cpu")
            self.stream = None
        try:
            module: torch.jit.ScriptModule = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=self.device)
            self.module = module.eval()
        except Exception as err:
            raise ValueError(f"model '{source.name}': cannot load {path}: {err}") from None
        self.arg_order = _argument_order(self.module, [i.name for i in config.input], source.name)
        self.outputs = [
            (o.name, wire_to_numpy(config_to_wire(model_type_name(o.data_type))))
            for o in config.output
        ]
        self.output_index = _output_indices([o.name for o in config.output])
        # host tensors in, host tensors out: the module itself on CPU, one call on a GPU
        self.call: Callable[..., Any] = self.module
        if self.stream is not None:
            wrapped = device_call(self.module, self.device, len(self.arg_order))
            self.call = wrapped or self._device_steps

    def thread_init(self) -> None:
        # OpenMP's thread count is per calling thread: each instance gets its own budget.
        torch.set_num_threads(self.spec.cpu_threads)
        if self.stream is not None:  # the device and the current stream are per thread too
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self.stream)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            return self._collect(self.call(*[torch.from_numpy(inputs[n]) for n in self.arg_order]))

    def _device_steps(self, *args: torch.Tensor) -> Any:
        """A module `device_call` cannot wrap: the same steps from Python, on our stream."""
        with torch.cuda.stream(self.stream):
            return self.module(*[a.to(self.device, non_blocking=True) for a in args])

    def _collect(self, result: Any) -> dict[str, np.ndarray]:
        if isinstance(result, torch.Tensor):
            result = (result,)
        outputs: dict[str, np.ndarray] = {}
        for position, (name, dtype) in enumerate(self.outputs):
            if isinstance(result, dict):
                tensor = result[name]
            else:
                tensor = result[self.output_index.get(name, position)]
            array = tensor.detach().cpu().numpy()
            outputs[name] = array if array.dtype == dtype else array.astype(dtype)
        return outputs


_GENERATED = itertools.count()


def device_call(module: torch.jit.ScriptModule, device: torch.device,
                inputs: int) -> torch.jit.ScriptModule | None:  # fmt: skip
    """`module` wrapped as one TorchScript call: `inputs` host tensors moved to `device`, the
    model run, every output copied back to host memory; None when the signature does not allow
    it (an argument that is not a tensor, arguments left to defaults, or a result other than a
    tensor, a tuple, list or str-keyed dict of tensors)."""
    try:
        schema = module.forward.schema  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    args = schema.arguments[1:]  # drop self
    if len(args) != inputs or any(str(a.type) != "Tensor" for a in args):
        return None
    if len(schema.returns) != 1:
        return None
    returned = schema.returns[0].type
    text = str(returned)
    if text == "Tensor":
        back = "r.cpu()"
    elif text == "List[Tensor]":
        back = "[t.cpu() for t in r]"
    elif text == "Dict[str, Tensor]":
        back = "{k: v.cpu() for k, v in r.items()}"
    elif isinstance(returned, torch.TupleType) and all(
        str(e) == "Tensor" for e in returned.elements()
    ):
        back = "(" + "".join(f"r[{i}].cpu(), " for i in range(len(returned.elements()))) + ")"
    else:
        return None
    names = [f"x{i}" for i in range(inputs)]
    moved = ", ".join(f"{n}.to(self.device, non_blocking=True)" for n in names)
    source = (
        "import torch\n"
        "from typing import Dict, List, Tuple\n\n\n"
        "class DeviceCall(torch.nn.Module):\n"
        "    def __init__(self, inner, device: torch.device):\n"
        "        super().__init__()\n"
        "        self.inner = inner\n"
        "        self.device = device\n\n"
        f"    def forward(self, {', '.join(f'{n}: torch.Tensor' for n in names)}):\n"
        f"        r = self.inner({moved})\n"
        f"        return {back}\n"
    )  # fmt: skip
    # TorchScript compiles from source it reads through linecache: register the generated file
    filename = f"<analyzer device_call {next(_GENERATED)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)  # our own template, never client input
    try:
        with warnings.catch_warnings():  # torch's deprecation notice, once per instance
            warnings.simplefilter("ignore", DeprecationWarning)
            wrapper = namespace["DeviceCall"](module, device)
            scripted: torch.jit.ScriptModule = torch.jit.script(wrapper)
            return scripted
    except Exception:  # a module TorchScript cannot call this way keeps the Python steps
        return None


def _argument_order(module: torch.jit.ScriptModule, names: list[str], model: str) -> list[str]:
    """The config input feeding each positional argument of forward()."""
    indexed = {int(m.group(1)): n for n in names if (m := _INDEXED.match(n))}
    if len(indexed) == len(names):
        return [indexed[i] for i in sorted(indexed)]
    try:
        schema = module.forward.schema  # type: ignore[attr-defined]
        args = [a.name for a in schema.arguments][1:]  # drop self
    except (AttributeError, RuntimeError):
        return names
    missing = [n for n in names if n not in args]
    if missing:
        raise ValueError(
            f"model '{model}': input(s) {missing} are neither named <name>__<index> nor "
            f"arguments of forward() {args}"
        )
    return [a for a in args if a in names]


def _output_indices(names: list[str]) -> dict[str, int]:
    return {n: int(m.group(1)) for n in names if (m := _INDEXED.match(n))}
