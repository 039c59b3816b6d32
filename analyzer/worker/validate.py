"""Request checks against the model config, with Triton's wording, before anything is queued."""

from __future__ import annotations

from collections.abc import Iterable

from tritonclient.grpc import model_config_pb2

from analyzer.config.model_config import ModelConfig
from analyzer.datatypes import config_to_wire
from analyzer.worker.errors import InferError
from analyzer.worker.request import InferRequest


class RequestValidator:
    """Precomputed per model version so the per-request check is a few dict lookups."""

    def __init__(self, config: ModelConfig):
        self.model = config.name
        self.max_batch = config.max_batch_size
        self.inputs = {
            i.name: (
                config_to_wire(model_type_name(i.data_type)),
                tuple(i.dims),
                tuple(i.reshape.shape) if i.HasField("reshape") else None,
            )
            for i in config.input
        }
        self.required = [i.name for i in config.input if not i.optional]
        self.outputs = {o.name for o in config.output}
        # without reshapes a check only reads the request: its verdict on one request layout
        # (names, types, shapes, requested outputs) holds for every request of that layout
        self.pure = all(spec[2] is None for spec in self.inputs.values())

    def check_type(self, name: str, wire: str) -> None:
        """An input's name and datatype, before its values are read: a BYTES input is decoded
        into one object per element, and 16 M of them for a model that takes FP32 held the
        event loop for 9 s before this request was refused."""
        spec = self.inputs.get(name)
        if spec is None:
            raise InferError(f"unexpected inference input '{name}' for model '{self.model}'")
        if wire != spec[0]:
            raise InferError(f"unexpected datatype {wire} for inference input '{name}', "
                             f"expecting {spec[0]} for model '{self.model}'")  # fmt: skip

    def check(self, request: InferRequest) -> None:
        model = self.model
        batch = None
        for name, array in request.inputs.items():
            spec = self.inputs.get(name)
            if spec is None:
                raise InferError(f"unexpected inference input '{name}' for model '{model}'")
            wire, dims, reshape = spec
            if request.wire_types[name] != wire:
                raise InferError(
                    f"unexpected datatype {request.wire_types[name]} for inference input "
                    f"'{name}', expecting {wire} for model '{model}'"
                )
            shape = array.shape
            if self.max_batch > 0:
                if not shape:
                    raise InferError(f"input '{name}' for model '{model}' has no batch dimension")
                if batch is None:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise InferError(
                        f"input '{name}' for model '{model}' has batch size {shape[0]}, "
                        f"other inputs have {batch}"
                    )
                shape = shape[1:]
            if not _matches(shape, dims):
                full = ([-1] if self.max_batch > 0 else []) + list(dims)
                raise InferError(
                    f"unexpected shape for input '{name}' for model '{model}'. "
                    f"Expected {_fmt(full)}, got {_fmt(array.shape)}"
                )
            if reshape is not None:
                lead = array.shape[:1] if self.max_batch > 0 else ()
                try:
                    request.inputs[name] = array.reshape(lead + reshape)
                except ValueError:  # variable dims whose sizes do not fit the reshape
                    raise InferError(
                        f"input '{name}' for model '{model}' of shape {_fmt(array.shape)} "
                        f"cannot be reshaped to {_fmt(lead + reshape)}"
                    ) from None
        for name in self.required:
            if name not in request.inputs:
                raise InferError(f"expected input '{name}' for model '{model}' was not provided")
        if self.max_batch > 0:
            batch = batch or 0
            if batch < 1 or batch > self.max_batch:
                raise InferError(
                    f"inference request batch-size must be <= {self.max_batch} for "
                    f"'{model}', got {batch}"
                )
            request.batch_size = batch
        else:
            request.batch_size = 1
        if request.requested_outputs:
            for name in request.requested_outputs:
                if name not in self.outputs:
                    raise InferError(
                        f"unexpected inference output '{name}' for model '{model}'"
                    )
            if len(set(request.requested_outputs)) < len(request.requested_outputs):
                # each copy was sent: a 155 KB request naming an output 1,000 times was answered
                # with 393 MB (Triton refuses a requested output added twice)
                twice = next(n for n in request.requested_outputs
                             if request.requested_outputs.count(n) > 1)  # fmt: skip
                raise InferError(f"output '{twice}' is requested more than once")


def check_once(
    validator: RequestValidator, request: InferRequest, verdicts: dict[RequestValidator, int]
) -> None:
    """Check a request whose layout repeats: a pure validator's verdict is kept in `verdicts`.

    `verdicts` maps the validators that accepted this layout to the batch size they found; it
    holds at most MAX_VERDICTS (the oldest goes). Raises InferError as `check` does.
    """
    batch = verdicts.get(validator)
    if batch is not None:
        request.batch_size = batch
        return
    validator.check(request)
    if validator.pure:
        if len(verdicts) >= MAX_VERDICTS:
            del verdicts[next(iter(verdicts))]
        verdicts[validator] = request.batch_size


MAX_VERDICTS = 16


def model_type_name(data_type: int) -> str:
    return str(model_config_pb2.DataType.Name(data_type))


def _matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _fmt(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"
