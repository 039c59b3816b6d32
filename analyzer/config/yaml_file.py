"""The user's YAML files (profile and report settings, search spaces), read strictly.

PyYAML keeps the last of two equal keys in a mapping and says nothing, so a setting written
twice in a long file (`concurrency` near the top and again under a later comment) silently lost
its first value. Here a repeated key is an error at its line, naming the line of the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from analyzer.fsutil import UserFileError, read_user_text


class YamlFileError(Exception):
    """A user's YAML file that cannot be read or is not YAML; the message is one sentence that
    names the file (callers raise it again as their own error type)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may repeat keys
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            seen[key] = key_node.start_mark.line if first is None else first
            if first is not None:
                raise ConstructorError(
                    None, None, f"key '{key}' is given twice (first at line {first + 1})",
                    key_node.start_mark)  # fmt: skip
        return super().construct_mapping(node, deep=deep)


def load_user_yaml(text: str) -> Any:
    """The document in `text`; yaml.YAMLError when it is not YAML or repeats a key."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(err: yaml.YAMLError) -> str:
    """' at line 7: key 'concurrency' is given twice (first at line 3)', or '' when PyYAML
    knows neither where nor what."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    where = f" at line {mark.line + 1}" if mark else ""
    return f"{where}: {problem}" if problem else where


def read_user_yaml(path: str | Path, what: str) -> Any:
    """The document in the user's file `path` ({} when empty); YamlFileError, its sentence
    starting with `what` ("config file", "search space"), when the file cannot be read as text
    or is not YAML."""
    try:
        return load_user_yaml(read_user_text(path)) or {}
    except UserFileError as err:
        raise YamlFileError(f"{what} {err}") from None
    except yaml.YAMLError as err:
        raise YamlFileError(f"{what} '{path}' is not valid YAML{yaml_problem(err)}") from None
