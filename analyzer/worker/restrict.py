"""Triton's endpoint restrictions: `--http-restricted-api` and `--grpc-restricted-protocol`.

`<api>[,<api>...]:<header>=<value>` names API categories (Triton's names) that only answer a
request carrying that header (HTTP) or metadata key (gRPC) with that value; anything else gets
403 / UNAVAILABLE. `profile` uses this to keep the repository API of its workers for itself: it
makes a random key per run and hands it to the worker through the environment variable
REPOSITORY_KEY_ENV (never on the command line, where `ps` shows it to every user), which restricts
`model-repository` on both protocols to the header KEY_HEADER.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.errors import AnalyzerError

# Triton's category names (server/src/restricted_features.h)
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
REPOSITORY_KEY_ENV = "MODEL_ANALYZER_REPOSITORY_KEY"
KEY_HEADER = "model-analyzer-key"


_taken: dict[str, str] = {}  # the key once taken out of os.environ (HTTP and gRPC both need it)


class RestrictionError(AnalyzerError):
    """A restriction flag that does not parse; the message names the flag and the value."""


@dataclass(frozen=True)
class Rule:
    header: str  # lower case: HTTP header names and gRPC metadata keys are case-insensitive
    value: str

    def allows(self, headers: Mapping[str, str]) -> bool:
        given = headers.get(self.header)
        return given is not None and hmac.compare_digest(given.encode(), self.value.encode())


@dataclass
class Restrictions:
    """Which categories need which header; an unrestricted category is open."""

    rules: dict[str, Rule] = field(default_factory=dict)

    def add(self, flag: str, text: str) -> None:
        apis, sep, pair = text.partition(":")
        header, eq, value = pair.partition("=")
        if not sep or not eq or not header.strip() or not apis.strip():
            raise RestrictionError(
                f"{flag} '{text}' is not '<api>[,<api>...]:<header>=<value>'"
            )
        for api in (a.strip() for a in apis.split(",")):
            if api not in CATEGORIES:
                raise RestrictionError(
                    f"{flag} names unknown API '{api}'; known: {', '.join(CATEGORIES)}"
                )
            if api in self.rules:
                raise RestrictionError(f"{flag} restricts '{api}' twice")
            self.rules[api] = Rule(header.strip().lower(), value)

    def check(self, category: str, headers: Mapping[str, str]) -> str | None:
        """None when allowed; otherwise the refusal message (Triton's wording)."""
        rule = self.rules.get(category)
        if rule is None or rule.allows(headers):
            return None
        return f"This API is restricted, expecting header '{rule.header}'"

    @property
    def active(self) -> bool:
        return bool(self.rules)


def build(flag: str, values: list[str], environ: Mapping[str, str] | None = None) -> Restrictions:
    """Parse one protocol's flags and add the profiler's key from the environment, if set."""
    restrictions = Restrictions()
    for text in values:
        restrictions.add(flag, text)
    if environ is None:
        # read once and removed, so that no child (a python model's process) inherits the key
        key = os.environ.pop(REPOSITORY_KEY_ENV, "") or _taken.get(REPOSITORY_KEY_ENV, "")
        _taken[REPOSITORY_KEY_ENV] = key
    else:
        key = environ.get(REPOSITORY_KEY_ENV, "")
    if key:
        if "model-repository" in restrictions.rules:
            raise RestrictionError(
                f"{flag} restricts 'model-repository' and {REPOSITORY_KEY_ENV} is set as well"
            )
        restrictions.rules["model-repository"] = Rule(KEY_HEADER, key)
    return restrictions
