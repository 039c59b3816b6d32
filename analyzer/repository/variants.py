"""Model-config variants made from the model's own config message, and their model folders.

A variant is a copy of the parsed config with fields set (max_batch_size, instance_group, dynamic
batching delay, or any model_config_parameters), never text templating. Each is written as a
ready-to-serve folder: config.pbtxt named after the folder, plus the model's version folders
(hard links when the file system allows, copies otherwise).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from analyzer.config.model_config import ModelConfig, load_model_config, write_model_config
from analyzer.errors import AnalyzerError
from analyzer.repository.repository import CONFIG_FILE

KIND_CPU = 2  # ModelInstanceGroup.Kind values in Triton's schema
KIND_GPU = 1
KIND_AUTO = 0


class VariantError(AnalyzerError):
    """This combination cannot work for the model; the message says why (the search skips it)."""


def default_variant(config: ModelConfig, cpu_only: bool) -> ModelConfig:
    """The model's own config, made servable here: without a GPU, GPU instances become CPU ones
    (MA gets this wrong, its issue #927)."""
    out = ModelConfig()
    out.CopyFrom(config)
    for group in out.instance_group:
        group.count = max(group.count, 1)  # Triton's default, written out: a variant that sets
        # count 1 is then seen to be this same config
    if cpu_only:
        for group in out.instance_group:
            if group.kind in (KIND_GPU, KIND_AUTO):
                group.kind = KIND_CPU
                del group.gpus[:]
    return out


def make_variant(config: ModelConfig, params: dict[str, Any], cpu_only: bool) -> ModelConfig:
    """The model's config with `params` set: the searched keys (instance_count, max_batch_size,
    max_queue_delay_microseconds) and/or model_config_parameters fields."""
    out = default_variant(config, cpu_only)
    params = dict(params)
    count = params.pop("instance_count", None)
    mbs = params.pop("max_batch_size", None)
    delay = params.pop("max_queue_delay_microseconds", None)
    if params:
        _apply(out, params, "model_config_parameters")
        if cpu_only:
            out.CopyFrom(default_variant(out, True))
    if mbs is not None:
        if config.max_batch_size <= 0 and mbs > 0:
            raise VariantError(f"model '{config.name}' does not batch (max_batch_size 0)")
        out.max_batch_size = mbs
    if count is not None:
        del out.instance_group[:]
        group = out.instance_group.add()
        group.count = count
        group.kind = KIND_CPU if cpu_only else KIND_GPU
    # the sequence batcher schedules a sequence model: Triton takes one scheduler per model
    if delay is not None and out.max_batch_size > 0 and not out.HasField("sequence_batching"):
        out.dynamic_batching.max_queue_delay_microseconds = delay
    _check(out)
    return out


def _check(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        too_big = [p for p in config.dynamic_batching.preferred_batch_size
                   if p > config.max_batch_size]  # fmt: skip
        if too_big:
            raise VariantError(
                f"preferred_batch_size {too_big[0]} is larger than max_batch_size "
                f"{config.max_batch_size}"
            )
    for group in config.instance_group:
        if group.count < 0:
            raise VariantError(f"instance_group count {group.count} must be >= 1")


def _apply(message: Any, values: dict[str, Any], where: str) -> None:
    """Set fields from a JSON-like mapping; repeated fields are replaced, not appended to."""
    descriptor = message.DESCRIPTOR
    for key, value in values.items():
        fd = descriptor.fields_by_name.get(key)
        if fd is None:
            raise VariantError(f"{where}: '{key}' is not a field of {descriptor.name}")
        is_message = fd.type == FieldDescriptor.TYPE_MESSAGE
        repeated = _is_repeated(fd)
        if is_message and not repeated and isinstance(value, dict) and not _is_map(fd):
            _apply(getattr(message, key), value, f"{where}.{key}")
            continue
        message.ClearField(key)
        try:
            json_format.ParseDict({key: value}, message)
        except json_format.ParseError as err:
            raise VariantError(f"{where}.{key} = {value!r}: {err}") from None


def check_parameter(key: str, value: Any) -> None:
    """VariantError when model_config_parameters' `key` set to `value` (one of its choices) is
    not a valid ModelConfig field and value for any model: an unknown field, a value of the
    wrong type, an enum name Triton does not have. Such a choice can never load; checked before
    the run, it is an error in the user's file rather than combinations skipped."""
    _apply(ModelConfig(), {key: value}, "model_config_parameters")


def close_field(key: str) -> str:
    """' (did you mean 'max_batch_size'?)' for a near miss of a ModelConfig field, else ''."""
    import difflib

    names = list(ModelConfig.DESCRIPTOR.fields_by_name)
    near = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _is_repeated(fd: FieldDescriptor) -> bool:
    flag = getattr(fd, "is_repeated", None)  # protobuf >= 6 (label() is deprecated there)
    if flag is None:
        return fd.label == FieldDescriptor.LABEL_REPEATED
    return bool(flag() if callable(flag) else flag)


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def describe(config: ModelConfig) -> dict[str, Any]:
    """The fields a search changes, for tables and CSVs."""
    kinds: dict[str, int] = {}
    for group in config.instance_group or []:
        kind = "GPU" if group.kind in (KIND_GPU, KIND_AUTO) else "CPU"
        kinds[kind] = kinds.get(kind, 0) + max(1, group.count or 1)
    if not config.instance_group:
        kinds = {"CPU": 1}
    batching = config.HasField("dynamic_batching")
    return {
        "max_batch_size": config.max_batch_size,
        "instance_count": sum(kinds.values()),
        "instance_group": " + ".join(f"{n}:{k}" for k, n in kinds.items()),
        "dynamic_batching": batching,
        "max_queue_delay_us": (
            config.dynamic_batching.max_queue_delay_microseconds if batching else None
        ),
        "preferred_batch_size": list(config.dynamic_batching.preferred_batch_size),
    }


def composed_variant(config: ModelConfig, variants: dict[str, tuple[str, ModelConfig]]
                     ) -> ModelConfig:  # fmt: skip
    """An ensemble's config whose steps call the composing variants `variants` (model name ->
    (variant folder name, its config)) instead of the models themselves. A batching ensemble
    takes no bigger batch than its smallest composing variant (every step gets the whole batch)."""
    out = ModelConfig()
    out.CopyFrom(config)
    for step in out.ensemble_scheduling.step:
        if step.model_name in variants:
            step.model_name = variants[step.model_name][0]
            step.model_version = -1
    if out.max_batch_size > 0:
        sizes = [c.max_batch_size for _, c in variants.values() if c.max_batch_size > 0]
        out.max_batch_size = min([out.max_batch_size, *sizes])
    return out


def describe_composed(parts: dict[str, tuple[str, ModelConfig]],
                      composing: list[str]) -> dict[str, Any]:  # fmt: skip
    """A variant with composing models for tables and CSVs: each model's values, in step order
    (as MA lists them), with the totals the tie rule compares (all instances, the largest max
    batch size); `composing`: the composing variants' folders, for MA's config path."""
    each = {part: describe(config) for part, (_, config) in parts.items()}
    delays = [d["max_queue_delay_us"] for d in each.values()]
    return {
        "max_batch_size": max((d["max_batch_size"] for d in each.values()), default=0),
        "instance_count": sum(d["instance_count"] for d in each.values()),
        "instance_group": ", ".join(f"{p} {d['instance_group']}" for p, d in each.items()),
        "dynamic_batching": any(d["dynamic_batching"] for d in each.values()),
        "max_queue_delay_us": max((x for x in delays if x is not None), default=None),
        "preferred_batch_size": [],
        "max_batch_size_text": ", ".join(f"{p} {d['max_batch_size']}" for p, d in each.items()),
        "max_queue_delay_text": ", ".join(
            f"{p} {'-' if d['max_queue_delay_us'] is None else d['max_queue_delay_us']}"
            for p, d in each.items()),
        "composing_configs": composing,
    }


def serve_as(repository: Path, variant: str, name: str) -> None:
    """`repository/name` becomes a copy of the variant folder `repository/variant` (its config
    named `name`): a BLS model calls its composing models by their own names."""
    folder = repository / variant
    config = load_model_config(folder / CONFIG_FILE)
    write_variant(folder, config, repository / name)


def write_variant(source: Path, config: ModelConfig, folder: Path) -> None:
    """`folder` becomes a servable model: config.pbtxt (name = folder name) + the model's files."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    named = ModelConfig()
    named.CopyFrom(config)
    named.name = folder.name
    for entry in source.iterdir():
        if entry.name == CONFIG_FILE or entry.name.startswith("."):
            continue
        target = folder / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, copy_function=_link_or_copy, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            _link_or_copy(entry, target)
    write_model_config(named, folder / CONFIG_FILE)


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
