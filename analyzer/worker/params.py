"""Client values in API requests, checked: the JSON body, and request parameters by their type.

Shared by the REST (http.py, http_tensors.py) and gRPC (grpc.py) APIs; a bad value raises an
`InferError` whose message names it.
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.worker.errors import InferError


def _parse_json(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        data = json.loads(bytes(body))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an int over 4300 digits
        raise InferError(f"malformed JSON in request body: {err}") from None
    except RecursionError:
        raise InferError("malformed JSON in request body: nested too deeply") from None
    if not isinstance(data, dict):
        raise InferError("request body must be a JSON object")
    return data


def show_value(value: Any) -> str:
    """A client's value for an error message, short enough to stay one line."""
    if isinstance(value, str | int | float | None):
        return json.dumps(value)[:64]
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InferError(f"{what} must be a JSON object, got {show_value(value)}")
    return value


def scalar_params(params: dict[str, Any]) -> dict[str, Any]:
    """A REST request's 'parameters', each a bool, an integer, a number or a string, as Triton
    takes them (gRPC's InferParameter can hold nothing else). They travel with the request to
    the model's process in its batch, so one client's deeply nested value failed the whole
    batch, other clients' requests too, when the batch was pickled."""
    for key, value in params.items():
        if not isinstance(value, bool | str | float) and not (
            isinstance(value, int) and -(1 << 63) <= value < (1 << 64)
        ):
            raise InferError(f"parameter '{key}' has invalid type ({show_value(value)}): it "
                             "should be either 'int', 'bool', 'double' or 'string'")  # fmt: skip
    return params


def flag_param(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InferError(f"parameter '{key}' must be true or false, got {show_value(value)}")
    return value


def natural_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferError(
            f"parameter '{key}' must be a non-negative integer, got {show_value(value)}"
        )
    return value


def sequence_param(params: dict[str, Any]) -> int | str:
    value = params.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InferError(
            f"parameter 'sequence_id' must be an integer or a string, got {show_value(value)}"
        )
    return value


SEQUENCE_START, SEQUENCE_END = 1, 2  # Triton's request flags


def sequence_flags(params: dict[str, Any]) -> int:
    """The request's sequence flags from 'sequence_start' and 'sequence_end' (booleans)."""
    flags = 0
    for key, bit in (("sequence_start", SEQUENCE_START), ("sequence_end", SEQUENCE_END)):
        if key in params and flag_param(params, key):
            flags |= bit
    return flags
