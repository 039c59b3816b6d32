"""Raw setting values (a YAML value or a flag's text) to typed ones, one rule per kind.

Every setting is declared once in config/settings.py; `FIELDS` is the loader's view of it. A bad
value becomes a ProfileConfigError that names the setting, where it came from and the value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analyzer.config.settings import Settings
from analyzer.errors import AnalyzerError

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class ProfileConfigError(AnalyzerError):
    """A profile setting is unknown or has a bad value; the message names it."""


def parse_bool(text: str) -> bool:
    """The one reading of a boolean flag or key (tritonserver's `--allow-grpc=false`, MA's YAML
    `true`); ValueError for anything else."""
    low = text.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise ValueError(f"'{text}' is not true or false")


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # str | path | int | float | bool | ints | strs | multi | choice | mapping | object
    default: Any = None
    help: str = ""
    flags: tuple[str, ...] = ()  # extra short flags, e.g. ("-m",)
    choices: tuple[str, ...] = ()
    cli: bool = True  # objects (objectives, constraints, ...) are YAML-only, as in MA


def _field(f: dataclasses.Field[Any]) -> Field:
    m = f.metadata
    if m["kind"] == "object":  # YAML-only objects: None = not given, normalised by the loader
        default = None
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = f.default
    return Field(f.name, m["kind"], default, m["help"], m["flags"], m["choices"], m["cli"])


# the loader's view of Settings (config/settings.py), where every setting is declared
FIELDS: tuple[Field, ...] = tuple(_field(f) for f in dataclasses.fields(Settings))
BY_NAME = {f.name: f for f in FIELDS}


# lists whose MA default is [] (none): an MA file that spells the default out is accepted
_EMPTY_IS_NONE = {"bls_composing_models", "cpu_only_composing_models"}


def convert(f: Field, value: Any, where: str) -> Any:
    """`value` of setting `f` (from `where`: the command line or a file) as its kind."""

    def bad(expected: str) -> ProfileConfigError:
        return ProfileConfigError(f"{where}: '{f.name}' is {value!r}; expected {expected}")

    if value is None:
        return None
    if f.kind in ("str", "path"):
        if isinstance(value, bool | dict | list):
            raise bad("a string")
        return str(value)
    if f.kind == "choice":
        text = str(value).strip().lower()
        if text not in f.choices:
            raise bad("one of " + ", ".join(f.choices))
        return text
    if f.kind == "bool":
        try:
            return value if isinstance(value, bool) else parse_bool(str(value))
        except ValueError:
            raise bad("true or false") from None
    if f.kind in ("int", "float"):
        return _number(int if f.kind == "int" else float, value, bad)
    if f.kind == "multi":
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str | int) for v in items):
            raise bad("a string or a list of strings")
        return [str(v) for v in items]
    if f.kind in ("ints", "strs"):
        if value == [] and f.name in _EMPTY_IS_NONE:
            return None
        return as_list(f.name, value, int if f.kind == "ints" else str, where)
    if f.kind == "mapping":
        return _as_mapping(value, bad)
    return value  # objects are validated where they are interpreted


def _number(kind: type[int] | type[float], value: Any,
            bad: Callable[[str], ProfileConfigError]) -> int | float:  # fmt: skip
    """A number >= 0 of `kind`; a float with a fraction is not an int."""
    if isinstance(value, bool):
        raise bad(f"a number ({kind.__name__})")
    try:
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise bad(f"a number ({kind.__name__})") from None
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise bad("a whole number")
    if not math.isfinite(number):  # nan passed `< 0`; inf made a sampler sleep past time_t
        raise bad("a finite number")
    if number < 0:
        raise bad("a number >= 0")
    return number


def _as_mapping(value: Any, bad: Callable[[str], ProfileConfigError]) -> dict[str, Any]:
    """A YAML mapping, or on the command line a JSON object or k=v,k2=v2."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, str):
        raise bad("a mapping")
    text = value.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            raise bad("a JSON object") from None
        if not isinstance(parsed, dict):
            raise bad("a JSON object")
        return parsed
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise bad("k=v pairs separated by commas, or a JSON object")
        out[key.strip()] = val.strip()
    return out


RANGE_LIMIT = 10_000  # values one {start, stop, step} may give: each is a measured point


def as_list(name: str, value: Any, kind: type, where: str) -> list[Any]:
    """MA list syntax: a list, a comma-separated string, one value, or {start, stop, step}."""
    if isinstance(value, dict):
        return _as_range(name, value, where)
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        items = [items]
    out: list[Any] = []
    for item in items:
        text = str(item).strip()
        if kind is int:
            try:
                number = int(text)
            except ValueError:
                raise ProfileConfigError(
                    f"{where}: '{name}' has {item!r}; expected whole numbers"
                ) from None
            if number <= 0:
                raise ProfileConfigError(f"{where}: '{name}' has {number}; values must be > 0")
            out.append(number)
        elif text:
            out.append(text)
    if not out:
        raise ProfileConfigError(f"{where}: '{name}' is empty")
    return out


def _as_range(name: str, value: dict[str, Any], where: str) -> list[int]:
    try:
        start, stop = int(value["start"]), int(value["stop"])
        step = int(value.get("step", 1))
    except (KeyError, TypeError, ValueError):
        raise ProfileConfigError(
            f"{where}: '{name}' is {value!r}; a range needs integer start, stop (and step)"
        ) from None
    if step <= 0 or stop < start:
        raise ProfileConfigError(f"{where}: '{name}' range {value!r} is empty")
    if start <= 0:  # as in the list form
        raise ProfileConfigError(f"{where}: '{name}' range starts at {start}; values must be > 0")
    count = (stop - start) // step + 1
    if count > RANGE_LIMIT:  # (a stop of 10**12 was a MemoryError)
        raise ProfileConfigError(f"{where}: '{name}' range {value!r} has {count:,} values; at "
                                 f"most {RANGE_LIMIT:,}")  # fmt: skip
    return list(range(start, stop + 1, step))
