"""pytorch_libtorch: TorchScript `model.pt`, with Triton's input/output naming rules.

Inputs named `<name>__<i>` are positional argument i; other names are matched to the names of
`forward`'s arguments. Outputs named `<name>__<i>` take element i of the returned tuple; otherwise
outputs follow the config order (a dict result is matched by key).
"""

from __future__ import annotations

import re
import warnings

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
    def __init__(self, source: ModelSource, path, spec: InstanceSpec):
        config = source.config
        super().__init__(batched=config.max_batch_size > 0)
        self.spec = spec
        if spec.kind == "GPU":
            self.device = torch.device("cuda", spec.device_id)
            self.stream = torch.cuda.Stream(device=self.device)
        else:
            self.device = torch.device("cpu")
            self.stream = None
        try:
            self.module = torch.jit.load(str(path), map_location=self.device).eval()
        except Exception as err:
            raise ValueError(f"model '{source.name}': cannot load {path}: {err}") from None
        self.arg_order = _argument_order(self.module, [i.name for i in config.input], source.name)
        self.outputs = [
            (o.name, wire_to_numpy(config_to_wire(model_type_name(o.data_type))))
            for o in config.output
        ]
        self.output_index = _output_indices([o.name for o in config.output])

    def thread_init(self) -> None:
        # OpenMP's thread count is per calling thread: each instance gets its own budget.
        torch.set_num_threads(self.spec.cpu_threads)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            if self.stream is None:
                args = [torch.from_numpy(inputs[name]) for name in self.arg_order]
                result = self.module(*args)
                return self._collect(result)
            with torch.cuda.stream(self.stream):
                args = [
                    torch.from_numpy(inputs[name]).to(self.device, non_blocking=True)
                    for name in self.arg_order
                ]
                result = self.module(*args)
                outputs = self._collect(result)
            return outputs

    def _collect(self, result) -> dict[str, np.ndarray]:
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


def _argument_order(module, names: list[str], model: str) -> list[str]:
    """The config input feeding each positional argument of forward()."""
    indexed = {int(m.group(1)): n for n in names if (m := _INDEXED.match(n))}
    if len(indexed) == len(names):
        return [indexed[i] for i in sorted(indexed)]
    try:
        args = [a.name for a in module.forward.schema.arguments][1:]  # drop self
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
