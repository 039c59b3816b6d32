"""Triton's own load-time rules for a model config (the checks its core runs on a config before
a model loads): a config Triton refuses is refused here too, by the repository check and by the
worker's load, with the field named -- not accepted and later seen as a wrong answer, a shape
error inside the model, or a batcher that silently drops a preferred size."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2

WILDCARD = -1
# dynamic_batching.priority_levels: the batcher keeps a queue per level and walks them per batch;
# Triton sets no bound (its configs use a handful of levels), but 10^6 took 755 MiB and made
# every inference 30x slower, and 2^64-1 never finished loading
MAX_PRIORITY_LEVELS = 1000
_TYPE_INVALID = model_config_pb2.DataType.Value("TYPE_INVALID")


def config_problems(config: Any, data_types: bool = True) -> list[str]:
    """What Triton would refuse in `config`, one phrase per problem naming its field. Without
    `data_types`, a tensor with no data_type passes (auto-complete may fill it later)."""
    problems: list[str] = []
    mbs = config.max_batch_size
    if mbs < 0:
        problems.append(f"max_batch_size is {mbs}; it must be 0 (no batching) or more")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for index, tensor in enumerate(tensors):
            label = f"{kind} '{tensor.name}'" if tensor.name else f"{kind} #{index + 1}"
            if not tensor.name:
                problems.append(f"{label} has no 'name'")
            if data_types and tensor.data_type == _TYPE_INVALID:
                problems.append(f"{label} has no 'data_type'")
            if any(d < 1 and d != WILDCARD for d in tensor.dims):
                problems.append(f"{label} has dims {list(tensor.dims)}; each must be 1 or more, "
                                "or -1 for a size that varies")  # fmt: skip
            if tensor.HasField("reshape") and any(
                d < 1 and d != WILDCARD for d in tensor.reshape.shape
            ):
                problems.append(f"{label} has reshape {list(tensor.reshape.shape)}; each must be "
                                "1 or more, or -1 for a size that varies")  # fmt: skip
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        levels, default = db.priority_levels, db.default_priority_level
        if levels > MAX_PRIORITY_LEVELS:
            problems.append(f"dynamic_batching.priority_levels {levels} is over the worker's "
                            f"limit of {MAX_PRIORITY_LEVELS}")  # fmt: skip
        elif levels and default > levels:  # Triton's own rule (0 here: the lowest level)
            problems.append(f"dynamic_batching.default_priority_level {default} is not one of "
                            f"the {levels} priority_levels")  # fmt: skip
    batchers = []
    if config.HasField("dynamic_batching"):
        batchers.append(("dynamic_batching", config.dynamic_batching.preferred_batch_size))
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        batchers.append(("sequence_batching.oldest",
                         config.sequence_batching.oldest.preferred_batch_size))  # fmt: skip
    for where, sizes in batchers:
        for size in sizes:
            if size <= 0:
                problems.append(f"{where}.preferred_batch_size {size} must be 1 or more")
            elif size > mbs:
                problems.append(f"{where}.preferred_batch_size {size} is larger than "
                                f"max_batch_size {mbs}")  # fmt: skip
    return problems
