"""onnxruntime_onnx: `model.onnx` through onnxruntime, one session per instance.

Auto-complete fills inputs, outputs and max_batch_size from the model like Triton's onnxruntime
backend: when every tensor's first dimension is dynamic, batching is on (max_batch_size 4 and a
dynamic batcher unless the config says otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2

from analyzer.repository.repository import ModelSource
from analyzer.worker.backends.base import Backend, BackendInstance, InstanceSpec, TensorInstance

_ORT_TO_CONFIG = {
    "tensor(float)": "TYPE_FP32",
    "tensor(float16)": "TYPE_FP16",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(string)": "TYPE_STRING",
}
DEFAULT_MAX_BATCH_SIZE = 4


class OnnxBackend(Backend):
    name = "onnxruntime"

    def gpu_capable(self) -> bool:
        return "CUDAExecutionProvider" in ort.get_available_providers()

    def auto_complete(self, source: ModelSource, version: int) -> None:
        config = source.config
        path = source.model_file(version)
        if not path.exists():
            raise ValueError(f"model '{source.name}' version {version}: {path} does not exist")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
        batchable = all(_dynamic_first(t.shape) for t in inputs + outputs)
        user_set_inputs = bool(config.input)
        if not user_set_inputs and not config.max_batch_size and batchable:
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        _fill(config.input, inputs, skip, source.name)
        _fill(config.output, outputs, skip, source.name)

    def create_instance(
        self, source: ModelSource, version: int, spec: InstanceSpec
    ) -> BackendInstance:
        return OnnxInstance(source, version, spec)


def _dynamic_first(shape: Sequence[Any]) -> bool:
    return bool(shape) and not isinstance(shape[0], int)


def _fill(configured: Any, tensors: Sequence[Any], skip: int, model: str) -> None:
    known = {t.name for t in configured}
    names = {t.name for t in tensors}
    for item in configured:
        if item.name not in names:
            raise ValueError(
                f"model '{model}': config tensor '{item.name}' is not in the ONNX model "
                f"(it has {sorted(names)})"
            )
    for t in tensors:
        if t.name in known:
            continue
        item = configured.add()
        item.name = t.name
        if t.type not in _ORT_TO_CONFIG:
            raise ValueError(f"model '{model}': ONNX tensor '{t.name}' has type {t.type}")
        item.data_type = model_config_pb2.DataType.Value(_ORT_TO_CONFIG[t.type])
        item.dims.extend(d if isinstance(d, int) else -1 for d in t.shape[skip:])


class OnnxInstance(TensorInstance):
    def __init__(self, source: ModelSource, version: int, spec: InstanceSpec):
        super().__init__(batched=source.config.max_batch_size > 0)
        options = ort.SessionOptions()
        options.intra_op_num_threads = spec.cpu_threads
        options.inter_op_num_threads = 1
        if spec.kind == "GPU":
            providers: list[str | tuple[str, dict[str, int]]] = [
                ("CUDAExecutionProvider", {"device_id": spec.device_id})]
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise ValueError(
                    f"model '{source.name}': instance {spec.name} is KIND_GPU but this "
                    "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
                )
        else:
            providers = ["CPUExecutionProvider"]
        path = source.model_file(version)
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as err:
            raise ValueError(f"model '{source.name}': cannot load {path}: {err}") from None
        self.output_names = [o.name for o in source.config.output]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {
            name: (arr.astype(np.str_) if arr.dtype == np.object_ else arr)
            for name, arr in inputs.items()
        }
        results = self.session.run(self.output_names, feed)
        return dict(zip(self.output_names, results, strict=True))
