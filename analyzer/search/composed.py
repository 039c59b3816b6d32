"""Quick search over an ensemble's composing models: one hill climb over all of them at once.

An ensemble has no knobs of its own worth turning; its throughput is set by its composing models'
instances, max batch sizes and queue delays. A state holds those axes for every composing model,
plus the concurrency; a neighbour turns one axis of one model one step (as QuickSearch's do for a
single model). The climb, the stopping rule and the final concurrency sweeps of the best configs
are QuickSearch's. A trial's params name each composing model: `{"add_sub": {"instance_count":
2, ...}, "mul": {...}}`; `{}` is the ensemble as written.

MA searches ensembles with its quick search only; so does this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.search.base import SearchLimits
from analyzer.search.quick import QuickSearch
from analyzer.search.space import SearchSpace


@dataclass(frozen=True)
class Part:
    """One composing model's axes: its own max_batch_size (0: it does not batch, only its
    instances are searched)."""

    name: str
    own_max_batch_size: int


@dataclass(frozen=True)
class ComposedState:
    parts: tuple[tuple[int, int, int], ...]  # per part: (instances, batch index, delay index)
    concurrency_index: int


class ComposedQuickSearch(QuickSearch):
    def __init__(self, space: SearchSpace, limits: SearchLimits, parts: list[Part],
                 top_configs: int = 3, min_gain: float = 0.01) -> None:  # fmt: skip
        super().__init__(space, limits, top_configs, min_gain)
        self.parts = parts
        self.part_sizes = [list(self.sizes) for _ in parts]

    def _params(self, state: ComposedState) -> dict[str, Any]:  # type: ignore[override]
        out: dict[str, Any] = {}
        for part, sizes, (count, b, d) in zip(self.parts, self.part_sizes, state.parts,
                                              strict=True):  # fmt: skip
            if part.own_max_batch_size <= 0:
                out[part.name] = {"instance_count": count}
                continue
            mbs = sizes[b]
            out[part.name] = {"instance_count": count, "max_batch_size": mbs,
                              "max_queue_delay_microseconds":
                                  self.delays[d] if mbs > 1 else self.delays[0]}  # fmt: skip
        return out

    def _start(self) -> ComposedState:  # type: ignore[override]
        parts = []
        batch = 1
        for part, sizes in zip(self.parts, self.part_sizes, strict=True):
            index = 0
            if part.own_max_batch_size > 0:
                own = min(part.own_max_batch_size, sizes[-1])
                index = max(i for i, s in enumerate(sizes) if s <= max(own, sizes[0]))
                batch = max(batch, sizes[index])
            parts.append((self.counts[0], index, 0))
        return ComposedState(tuple(parts), self._start_level(2 * batch * self.counts[0]))

    def _neighbours(self, s: ComposedState) -> list[ComposedState]:  # type: ignore[override]
        out = []

        def with_part(p: int, value: tuple[int, int, int]) -> ComposedState:
            return ComposedState(s.parts[:p] + (value,) + s.parts[p + 1 :], s.concurrency_index)

        for p, (part, sizes) in enumerate(zip(self.parts, self.part_sizes, strict=True)):
            count, b, d = s.parts[p]
            i = self.counts.index(count)
            out += [with_part(p, (self.counts[j], b, d)) for j in (i - 1, i + 1)
                    if 0 <= j < len(self.counts)]  # fmt: skip
            if part.own_max_batch_size <= 0:
                continue
            out += [with_part(p, (count, j, d)) for j in (b - 1, b + 1) if 0 <= j < len(sizes)]
            if sizes[b] > 1:
                out += [with_part(p, (count, b, j)) for j in (d - 1, d + 1)
                        if 0 <= j < len(self.delays)]  # fmt: skip
        for c in (s.concurrency_index - 1, s.concurrency_index + 1):
            if 0 <= c < len(self.levels):
                out.append(ComposedState(s.parts, c))
        return out
