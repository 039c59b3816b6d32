"""Triton's `triton_python_backend_utils` API, so python-backend models run unmodified.

The worker's python stub puts this folder on sys.path; models `import triton_python_backend_utils
as pb_utils` exactly as under Triton. Tensors are numpy arrays (CPU); BYTES tensors are numpy object
arrays of bytes, as in Triton.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from enum import IntEnum
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# public, as in Triton's module (models read it directly)
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# Triton's numeric TRITONSERVER_DataType codes, returned by Tensor.triton_dtype().
_WIRE_CODES = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_string(dtype: DTypeLike) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "TYPE_STRING"
    for name, np_type in TRITON_STRING_TO_NUMPY.items():
        if np.dtype(np_type) == dtype:
            return name
    raise ValueError(f"numpy dtype {dtype} has no Triton type")


def _wire_of(dtype: DTypeLike) -> str:
    return numpy_to_triton_string(dtype).removeprefix("TYPE_").replace("STRING", "BYTES")


def triton_to_numpy_type(data_type: int) -> Any:
    for wire, code in _WIRE_CODES.items():
        if code == data_type:
            name = "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
            return TRITON_STRING_TO_NUMPY.get(name)
    return None


def numpy_to_triton_type(data_type: DTypeLike) -> int | None:
    try:
        return _WIRE_CODES[_wire_of(data_type)]
    except ValueError:
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Triton's length-prefixed layout of an object or np.bytes_ tensor, in C order, as `bytes`
    (what Triton's helper returns); () for an empty tensor, None for any other dtype. An object
    element that is not bytes is written as its str() in UTF-8, as Triton's."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)) + data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    data = bytes(encoded_tensor)
    items, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        items.append(data[offset : offset + length])
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


class TritonError(Exception):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    """Raised by the API on misuse; a model may raise it too."""


class Tensor:
    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
        if data.dtype.kind in ("U", "S"):
            data = data.astype(np.object_)
        self._name = name
        self._array: np.ndarray = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        if _is_bf16(self._array.dtype):
            return _WIRE_CODES["BF16"]
        return _WIRE_CODES[_wire_of(self._array.dtype)]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        """The DLPack protocol, so that torch.from_dlpack(tensor) reads it without a copy.
        Triton exports any tensor it holds: numpy refuses read-only arrays (a model's
        np.broadcast_to, np.frombuffer of bytes), which are exported from a copy, and BF16,
        which DLPack carries but numpy cannot, goes through torch."""
        array = self._array
        if array.dtype == np.object_:
            raise TritonModelException(f"tensor '{self._name}': a BYTES tensor cannot be "
                                       "exported through DLPack")  # fmt: skip
        if not array.flags.writeable:
            array = array.copy()
        if _is_bf16(array.dtype):
            import torch

            shared = torch.from_numpy(array.view(np.int16))  # the same bits, shared
            return shared.view(torch.bfloat16).__dlpack__()
        return array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: the worker's tensors are host memory

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from any DLPack producer. Host memory is shared; a GPU tensor (a model's
        torch CUDA output, as Triton's GPU models return them) is copied to host memory, where
        the worker's tensors live. BF16, which numpy cannot import, comes through torch as
        ml_dtypes' bfloat16, the worker's BF16 arrays."""
        device = getattr(dlpack_tensor, "__dlpack_device__", None)
        if device is not None and device()[0] == 1:  # kDLCPU
            try:
                return Tensor(name, np.from_dlpack(dlpack_tensor))
            except (BufferError, RuntimeError, TypeError):  # a dtype numpy has no DLPack for
                pass
        import torch
        import torch.utils.dlpack

        tensor = (dlpack_tensor if isinstance(dlpack_tensor, torch.Tensor)
                  else torch.utils.dlpack.from_dlpack(dlpack_tensor))  # fmt: skip
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            import ml_dtypes

            bits = tensor.contiguous().view(torch.int16).numpy()
            return Tensor(name, bits.view(ml_dtypes.bfloat16))
        return Tensor(name, tensor.numpy())


def _is_bf16(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16"  # ml_dtypes' (imported by the stub only where installed)


class InferenceResponse:
    def __init__(self, output_tensors: Iterable[Tensor] | None = None,
                 error: TritonError | None = None, parameters: Any = None) -> None:  # fmt: skip
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters: dict[str, bool | int | str] = _response_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON object, as Triton's (they reach the client in
        the response's `parameters`)."""
        return json.dumps(self._parameters)


def _response_parameters(parameters: Any) -> dict[str, bool | int | str]:
    """Triton's rule: a dict of str keys to bool, int or str values."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, found type "
                                   f"{type(parameters).__name__}")  # fmt: skip
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key).__name__}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException("Expect parameters values to have type bool/int/str, "
                                       f"found type {type(value).__name__}")  # fmt: skip
        if isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
            raise TritonModelException(f"parameter '{key}': {value} does not fit in an int64")
    return dict(parameters)


class InferenceResponseSender:
    """What a model sends through get_response_sender(). A decoupled model's responses leave at
    once, from any thread, during execute() or after it (`emit`, set by the stub); a model that
    is not decoupled sends one, which the stub returns when execute() does."""

    def __init__(self, emit: Callable[[InferenceResponse | None, bool], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> None:  # fmt: skip
        self.responses: list[InferenceResponse] = []
        self.closed = False
        self._emit = emit  # (response or None, final) -> None
        self._cancelled = cancelled  # asks the worker whether the client cancelled

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed:
            raise TritonModelException("response sender is already closed")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):  # Triton's rule
            raise TritonModelException(f"Unsupported flag provided: {flags!r} (send() takes 0 "
                                       "or TRITONSERVER_RESPONSE_COMPLETE_FINAL)")  # fmt: skip
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is None and not final:
            raise TritonModelException("send() needs a response, the final flag, or both")
        if response is None and self._emit is None and not self.responses:
            raise TritonModelException("a model that is not decoupled cannot send the final "
                                       "flag alone before its response")  # fmt: skip
        if final:
            self.closed = True
        if self._emit is not None:
            self._emit(response, final)
        elif response is not None:
            if self.responses:
                raise TritonModelException(
                    "a model that is not decoupled sends one response per request")
            self.responses.append(response)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (went away, cancelled its call or closed
        its stream): a model may stop working on it then, as under Triton."""
        return self._cancelled() if self._cancelled is not None else False


class InferenceTrace:
    """Triton's trace handle of a request (a BLS request may pass its caller's on, as
    `InferenceRequest(trace=request.trace())`); the worker does not trace, so no context."""

    def get_context(self) -> str | None:
        return None


class MemoryType(IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Where a BLS request would like its outputs (InferenceRequest(preferred_memory=...)).
    Accepted as in Triton; the worker's tensors are host memory, so outputs come back there."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        if preferred_memory_type is None or preferred_device_id is None:
            raise TypeError("PreferredMemory needs a memory type and a device id")
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


class InferenceRequest:
    """A request handed to execute(); constructed by a model it is a BLS request."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Iterable[Tensor] | None = None,
        requested_output_names: Iterable[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: Any = None,
    ) -> None:
        # Triton's order and names: a misspelled keyword is a TypeError there too.
        # preferred_memory and trace are accepted as Triton's: outputs come back to host memory
        # and the worker does not trace
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        # a set in Triton; kept in the caller's order for the worker, without repeats
        self._requested = list(dict.fromkeys(requested_output_names or []))
        self._model_name = model_name
        self._model_version = int(model_version)
        self._flags = flags
        self._timeout = timeout
        self._parameters = (
            parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        )
        self._sender: InferenceResponseSender | None = None
        # set by the stub for a decoupled model's requests
        self._emit: Callable[[InferenceResponse | None, bool], None] | None = None
        # set by the stub for the requests execute() gets: asks the worker about cancellation
        self._ask_cancelled: Callable[[], bool] | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> set[str]:
        return set(self._requested)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(self._emit, self._ask_cancelled)
        return self._sender

    def set_flags(self, flags: int) -> None:
        """A BLS request's flags (sequence start/end), set after construction."""
        self._flags = int(flags)

    def trace(self) -> InferenceTrace:
        """The request's trace: the worker traces no request, so its context is None."""
        return InferenceTrace()

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: this request goes back to the sequence
        batcher when execute() returns, for a later batch (a model with
        sequence_batching { iterative_sequence: true }); a model that is not decoupled
        returns None as its response."""
        if not isinstance(flags, int) or flags not in (TRITONSERVER_REQUEST_RELEASE_ALL,
                                                       TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"release flags must be TRITONSERVER_REQUEST_RELEASE_ALL "
                                       f"or ..._RESCHEDULE, not {flags!r}")  # fmt: skip
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request (see InferenceResponseSender)."""
        return self._ask_cancelled() if self._ask_cancelled is not None else False

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on model `model_name` through the worker's own scheduling;
        `decoupled`: an iterator over its responses, the last the final flag."""
        if decoupled:
            return _bls().call_decoupled(self)
        return _bls().call(self)

    def async_exec(self, decoupled: bool = False) -> Any:
        """BLS, awaitable: sent at once, as Triton's (which runs exec() in the running loop's
        executor), and returned as an asyncio Future of the response (`decoupled`: of an
        iterator over the responses), so calls started one after another run side by side
        before any is awaited. Outside a running event loop: RuntimeError, as Triton's."""
        import asyncio  # not at the top: the stub imports asyncio only for a model that uses it

        loop = asyncio.get_running_loop()
        if decoupled:
            future = loop.create_future()
            future.set_result(_bls().call_decoupled(self))
            return future
        return _bls().call_async(self, loop)


_bls_client: Any = None  # the stub's BlsClient, set when the stub starts


def _bls() -> Any:
    if _bls_client is None:
        raise TritonModelException("BLS requests can be sent only by a model the worker runs")
    return _bls_client


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# a model's config as execute() and initialize() get it: Triton's JSON text, or its parsed dict
Config = str | dict[str, Any]


def _config_of(model_config: Config) -> dict[str, Any]:
    if isinstance(model_config, str):
        loaded: dict[str, Any] = json.loads(model_config)
        return loaded
    return model_config


def _tensor_config(model_config: Config, kind: str,
                   name: str) -> dict[str, Any] | None:  # fmt: skip
    for item in _config_of(model_config).get(kind, []):
        if item.get("name") == name:
            found: dict[str, Any] = item  # the config's own entry, as Triton returns it
            return found
    return None


def get_input_config_by_name(model_config: Config, name: str) -> dict[str, Any] | None:
    return _tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: Config, name: str) -> dict[str, Any] | None:
    return _tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: Config) -> bool:
    policy = _config_of(model_config).get("model_transaction_policy", {})
    return bool(policy.get("decoupled", False))


class LogLevel:
    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3


_LOG_NAMES = {0: ("info", "INFO"), 1: ("warning", "WARNING"), 2: ("error", "ERROR"),
              3: ("verbose", "VERBOSE")}  # fmt: skip
_log_settings: dict[str, Any] | None = None
_log_lock = threading.Lock()


def _log_line(message: str, level: int) -> None:
    """One line in the worker's log, if the worker's --log-* flags show that level (the worker
    hands them over in MODEL_ANALYZER_MODEL_LOG): its file, else stderr, in its format."""
    global _log_settings
    if _log_settings is None:
        try:
            _log_settings = json.loads(os.environ.get("MODEL_ANALYZER_MODEL_LOG", "") or "{}")
        except ValueError:
            _log_settings = {}
    settings = _log_settings
    key, name = _LOG_NAMES.get(level, _LOG_NAMES[0])
    shown = (settings.get("verbose", 0) > 0) if key == "verbose" else settings.get(key, True)
    if not shown:
        return
    now = time.time()
    if settings.get("iso8601"):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    else:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + \
            f",{int(now % 1 * 1000):03d}"  # fmt: skip
    line = f"{stamp} {name} python model: {message}\n"
    with _log_lock:
        path = settings.get("file")
        if path:
            try:
                with open(path, "a") as out:
                    out.write(line)
                return
            except OSError:
                pass  # the worker's stderr, rather than nothing
        sys.stderr.write(line)
        sys.stderr.flush()


class Logger:
    """Triton's pb_utils.Logger: lines in the server's log, shown as its --log-* flags say."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3
    LogLevel = LogLevel

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _log_line(str(message), level)

    # log_info(message) and the like: `log` at one level
    log_info = staticmethod(partial(log, level=INFO))
    log_warn = staticmethod(partial(log, level=WARNING))
    log_error = staticmethod(partial(log, level=ERROR))
    log_verbose = staticmethod(partial(log, level=VERBOSE))


class MetricKind(IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM


class MetricFamily:
    """Triton's custom metrics: a family of counters, gauges or histograms that the worker
    serves on its metrics port with its own. A family is known by its name across the worker;
    a second one of the same name and kind is the same family."""

    COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily needs a name, a description and a kind")
        try:
            self._kind = MetricKind(kind)
        except ValueError:
            raise TritonModelException(f"Error when creating MetricFamily: unknown kind {kind!r}"
                                       ) from None  # fmt: skip
        self._name = name
        self._handle: int | None = None
        reply = _metrics().ask({"op": "metric_family", "name": name, "description": description,
                                "kind": self._kind.name.lower()})  # fmt: skip
        if reply.get("error") is not None:
            raise TritonModelException(f"Error when creating MetricFamily: {reply['error']}")
        self._handle = int(reply["handle"])

    def Metric(self, labels: dict[str, str] | None = None,  # noqa: N802 - Triton's name
               buckets: list[float] | None = None) -> Metric:  # fmt: skip
        """A metric of this family with these labels (a histogram's needs its buckets)."""
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        if buckets is not None and self._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        if buckets is None and self._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        return Metric(self, labels, buckets)

    def __del__(self) -> None:
        if self._handle is not None:
            _tell_quietly({"op": "family_delete", "handle": self._handle})


class Metric:
    """One series of a MetricFamily. increment() (counter, gauge), set() (gauge) and observe()
    (histogram) go to the worker without waiting; value() asks it."""

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None,
                 buckets: list[float] | None) -> None:  # fmt: skip
        self._family = family  # a family outlives its metrics, as Triton asks
        self._handle: int | None = None
        reply = _metrics().ask({"op": "metric_new", "family": family._handle,
                                "labels": labels, "buckets": buckets})  # fmt: skip
        if reply.get("error") is not None:
            raise TritonModelException(f"Error when creating Metric: {reply['error']}")
        self._handle = int(reply["handle"])

    def increment(self, value: float) -> None:
        kind = self._family._kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to increment metric value: a histogram metric "
                                       "is not incremented; use observe()")  # fmt: skip
        number = _number("increment", value)
        if kind == MetricKind.COUNTER and not number >= 0:
            raise TritonModelException("Failed to increment metric value: a counter's increment "
                                       f"must be non-negative, got {value!r}")  # fmt: skip
        self._send("increment", number)

    def set(self, value: float) -> None:
        if self._family._kind != MetricKind.GAUGE:
            raise TritonModelException("Failed to set metric value: set() is only supported for "
                                       "gauge metrics")  # fmt: skip
        self._send("set", _number("set", value))

    def observe(self, value: float) -> None:
        if self._family._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to observe metric value: observe() is only "
                                       "supported for histogram metrics")  # fmt: skip
        self._send("observe", _number("observe", value))

    def value(self) -> float:
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to get metric value: value() is not supported "
                                       "for histogram metrics")  # fmt: skip
        reply = _metrics().ask({"op": "metric_value", "handle": self._handle})
        if reply.get("error") is not None:
            raise TritonModelException(f"Failed to get metric value: {reply['error']}")
        return float(reply["value"])

    def _send(self, kind: str, value: float) -> None:
        _metrics().tell({"op": "metric_op", "handle": self._handle, "kind": kind,
                         "value": value})  # fmt: skip

    def __del__(self) -> None:
        if self._handle is not None:
            _tell_quietly({"op": "metric_delete", "handle": self._handle})


def _number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{what}() takes a number, got {type(value).__name__}")
    return float(value)


def _metrics() -> Any:
    if _bls_client is None:
        raise TritonModelException("custom metrics work only in a model the worker runs")
    return _bls_client


# ---- the model loading API (explicit model control mode) -------------------------------------
def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, as Triton's; `config` is a JSON config that
    overrides the repository's, `files` ({"file:1/model.onnx": bytes}) the model's files (the
    worker accepts them only with --allow-model-file-uploads). Returns when the load ended."""
    if model_name is None or config is None:
        raise TypeError("load_model needs a model name (and config, if given, a string)")
    _control({"action": "load", "model_name": model_name, "config": config, "files": files},
             f"Failed to load model '{model_name}'", None)  # fmt: skip


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Start unloading a model, as Triton's: it does not wait for the unload to end, so a
    model may unload itself."""
    if model_name is None:
        raise TypeError("unload_model needs a model name")
    _control({"action": "unload", "model_name": model_name,
              "unload_dependents": bool(unload_dependents)},
             f"Failed to unload model '{model_name}'")  # fmt: skip


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    if model_name is None or model_version is None:
        raise TypeError("is_model_ready needs a model name (and a version string)")
    reply = _control({"action": "is_ready", "model_name": model_name,
                      "model_version": str(model_version)},
                     f"Failed to check the readiness of model '{model_name}'")  # fmt: skip
    return bool(reply.get("ready"))


def _control(message: dict[str, Any], failure: str,
             timeout: float | None = 30.0) -> dict[str, Any]:  # fmt: skip
    if _bls_client is None:
        raise TritonModelException("the model loading API works only in a model the worker runs")
    reply: dict[str, Any] = _bls_client.ask({"op": "model_control", **message}, timeout)
    if reply.get("error") is not None:
        raise TritonModelException(f"{failure}: {reply['error']}")
    return reply


_model_dir = ""  # the model's version folder, set by the stub


def get_model_dir() -> str:
    """The folder of the model's version (where its model.py is), as Triton's."""
    return _model_dir


def _tell_quietly(message: dict[str, Any]) -> None:
    """A deletion from __del__, sent with the channel's next message (see tell_later); the
    worker releases whatever a model's process still holds when it ends."""
    if _bls_client is not None:
        _bls_client.tell_later(message)


class ModelConfig:
    """What auto_complete_config receives: Triton's JSON config with Triton's setters."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Triton's rule: the config may lower the model's max_batch_size, not raise it."""
        current = self._config.get("max_batch_size", 0) or 0
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in "
                             f"auto-complete-config function for model '{self._name()}' "
                             f"specified max_batch_size {max_batch_size}")  # fmt: skip
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if self._config.get("sequence_batching"):
            raise ValueError(f"configuration specified scheduling_choice as "
                             f"'sequence_batching', but auto-complete-config function for model "
                             f"'{self._name()}' tries to set scheduling_choice as "
                             "'dynamic_batching'")  # fmt: skip
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = [k for k in transaction_policy_dict if k != "decoupled"]
        if unknown:
            raise ValueError(f"model transaction property in auto-complete-config function for "
                             f"model '{self._name()}' contains property other than "
                             "'decoupled'")  # fmt: skip
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(f"trying to change decoupled property in auto-complete-config "
                                 f"for model '{self._name()}', which is already set to "
                                 f"'{policy['decoupled']}'")  # fmt: skip
            policy["decoupled"] = wanted

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def add_instance_group(self, group: dict[str, Any]) -> None:
        self._config.setdefault("instance_group", []).append(dict(group))

    def _add(self, kind: str, item: dict[str, Any], allowed: tuple[str, ...]) -> None:
        """Triton's add_input/add_output: every property named, none other; a tensor the config
        already lists gets the model's data_type and dims (its own, when it gave them, must
        agree)."""
        model = self._name()
        label = f"{kind} '{item.get('name', '')}' in auto-complete-config function for model " \
                f"'{model}'"  # fmt: skip
        extra = [k for k in item if k not in allowed]
        if extra:
            raise ValueError(f"{label} contains property other than "
                             f"{', '.join(repr(a) for a in allowed)}")  # fmt: skip
        for key in ("name", "data_type", "dims"):
            if key not in item:
                raise ValueError(f"{label} is missing '{key}' property")
        for existing in self._config.setdefault(kind, []):
            if existing.get("name") != item["name"]:
                continue
            have = existing.get("data_type", "TYPE_INVALID")
            if have not in ("", "TYPE_INVALID") and have != item["data_type"]:
                raise ValueError(f"unable to load model '{model}', configuration expects "
                                 f"datatype {have} for {kind} '{item['name']}', model provides "
                                 f"{item['data_type']}")  # fmt: skip
            if existing.get("dims") and list(existing["dims"]) != list(item["dims"]):
                raise ValueError(f"model '{model}', tensor '{item['name']}': the model expects "
                                 f"dims {list(item['dims'])} but the model configuration "
                                 f"specifies dims {list(existing['dims'])}")  # fmt: skip
            if "optional" in item and "optional" in existing \
                    and bool(existing["optional"]) != bool(item["optional"]):  # fmt: skip
                raise ValueError(f"model '{model}', tensor '{item['name']}': the model expects "
                                 f"optional {item['optional']} but the model configuration "
                                 f"specifies optional {existing['optional']}")  # fmt: skip
            existing["data_type"] = item["data_type"]
            existing["dims"] = list(item["dims"])
            if "optional" in item:
                existing["optional"] = item["optional"]
            return
        self._config[kind].append(dict(item))
