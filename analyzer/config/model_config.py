"""config.pbtxt <-> Triton's ModelConfig protobuf, and the JSON form Triton's HTTP API returns.

Triton's own schema (`model_config_pb2` shipped in tritonclient) is the single source of truth:
every field Triton knows parses, unknown ones are rejected with file, line and field, and a config
written back is lossless.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2

from analyzer.errors import AnalyzerError
from analyzer.fsutil import UserFileError, read_user_text

ModelConfig: Any = model_config_pb2.ModelConfig  # generated protobuf class (no stubs)

_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


class ConfigError(AnalyzerError):
    """A config the user wrote is invalid; the message names the file, line and field."""


class ConfigReadError(ConfigError):
    """A config file that cannot be read as text at all (see fsutil.read_user_text)."""

    def __init__(self, err: UserFileError) -> None:
        super().__init__(str(err))
        self.where, self.problem, self.fix = err.where, err.problem, err.fix


def parse_model_config(text: str, source: str = "<config>") -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ConfigError(_describe_parse_error(source, err)) from None
    return config


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # a terminal must not get these raw


def _describe_parse_error(source: str, err: text_format.ParseError) -> str:
    message = str(err)
    line = err.GetLine() if hasattr(err, "GetLine") else None
    match = re.match(r"^(\d+):(\d+)\s*:\s*(.*)$", message, re.S)
    if match:
        line = int(match.group(1))
        message = match.group(3)
    where = f"{source}, line {line}" if line else source
    message = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message)  # shown, not sent
    return f"{where}: {message}"


def load_model_config(path: str | Path) -> ModelConfig:
    try:
        text = read_user_text(path)
    except UserFileError as err:
        raise ConfigReadError(err) from None
    return parse_model_config(text, str(path))


def format_model_config(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def write_model_config(config: ModelConfig, path: str | Path) -> None:
    Path(path).write_text(format_model_config(config))


def model_config_from_json(data: str | dict[str, Any], source: str = "config JSON") -> ModelConfig:
    """Parse Triton's JSON form (the repository API's `config` override)."""
    config = ModelConfig()
    try:
        payload = json.loads(data) if isinstance(data, str) else data
        json_format.ParseDict(payload, config)
    except (json.JSONDecodeError, json_format.ParseError, TypeError) as err:
        raise ConfigError(f"{source}: {err}") from None
    return config


def model_config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """Triton's HTTP JSON: proto field names, defaults printed, enums as names, int64 as numbers."""
    return proto_to_dict(config)


def proto_to_dict(message: Any) -> dict[str, Any]:
    """Any protobuf message as Triton's HTTP API writes it (64-bit integers as JSON numbers)."""
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _int64_as_numbers(message.DESCRIPTOR, data)
    return data


def _int64_as_numbers(desc: descriptor.Descriptor, data: dict[str, Any]) -> None:
    for key, value in data.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for item in value.values():
                        _int64_as_numbers(value_field.message_type, item)
                elif value_field.type in _INT64_TYPES:
                    for k in list(value):
                        value[k] = int(value[k])
            elif isinstance(value, list):
                for item in value:
                    _int64_as_numbers(field.message_type, item)
            elif isinstance(value, dict):
                _int64_as_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
