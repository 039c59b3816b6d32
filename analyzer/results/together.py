"""Models profiled together (MA's `run_config_profile_models_concurrently_enable`): one worker
serves a variant of every model at once, each model driven by its own load at the same time.

A joint config is ranked as MA ranks it: each model by its own objectives, the models weighted
by their `weighting`. Its measurement carries every model's metrics under "<model>:<tag>" (the
tags the joint objectives and constraints name, so the ordinary `Ranker` ranks it: the weighted
sum of the log of each model's objectives, i.e. relative gains, so a config that balances the
models can beat one with more total throughput, as in MA), and the plain tags as the whole
server's figures for tables: throughput summed over the models, latencies and times the worst
model's, the worker's memory and utilisation as sampled.
"""

from __future__ import annotations

from analyzer.config.profile_config import ModelSpec
from analyzer.results.measurement import Measurement

SEPARATOR = ","  # MA names a joint run "model_a,model_b"
# summed over the models; every other plain tag is the largest of them
SUMMED = frozenset({"perf_throughput", "achieved_request_rate", "effective_concurrency",
                    "client_cpu_pct"})  # fmt: skip


def joint_name(specs: list[ModelSpec]) -> str:
    return SEPARATOR.join(spec.name for spec in specs)


def joint_spec(specs: list[ModelSpec]) -> ModelSpec:
    """The spec the joint config is ranked by: every model's objectives (weights normalised per
    model, then scaled by its share of the weighting) and constraints, on "<model>:<tag>"."""
    total = sum(spec.weighting for spec in specs) or 1.0
    objectives: dict[str, float] = {}
    constraints: dict[str, dict[str, float]] = {}
    for spec in specs:
        own = sum(spec.objectives.values()) or 1.0
        for tag, weight in spec.objectives.items():
            objectives[f"{spec.name}:{tag}"] = spec.weighting / total * weight / own
        for tag, bounds in spec.constraints.items():
            constraints[f"{spec.name}:{tag}"] = dict(bounds)
    first = specs[0]
    return ModelSpec(
        name=joint_name(specs), cpu_only=all(spec.cpu_only for spec in specs),
        batch_sizes=list(first.batch_sizes), concurrency=list(first.concurrency),
        request_rate=list(first.request_rate), objectives=objectives, constraints=constraints,
    )  # fmt: skip


def combine_parts(parts: dict[str, Measurement], model: str, config_name: str) -> Measurement:
    """One measurement of a joint config from each model's point of the same load level."""
    points = list(parts.values())
    first = points[0]
    metrics: dict[str, float] = {}
    tags = {tag for point in points for tag in point.metrics}
    for tag in sorted(tags):
        values = [p.metrics[tag] for p in points if tag in p.metrics]
        metrics[tag] = sum(values) if tag in SUMMED else max(values)
    for name, point in parts.items():
        for tag, value in point.metrics.items():
            metrics[f"{name}:{tag}"] = value
    errors: dict[str, int] = {}
    for name, point in parts.items():
        for message, count in point.errors.items():
            errors[f"{name}: {message}"] = count
    return Measurement(
        model=model, config_name=config_name, load=first.load, value=first.value,
        batch_size=first.batch_size, metrics=metrics,
        gpus=max((p.gpus for p in points), key=len),
        stable=all(p.stable for p in points),
        client_saturated=any(p.client_saturated for p in points),
        client_bound=any(p.client_bound for p in points),
        warnings=[f"{name}: {w}" for name, p in parts.items() for w in p.warnings],
        errors=errors, wall_s=max(p.wall_s for p in points),
        taken_at=max(p.taken_at for p in points), host=first.host,
    )  # fmt: skip


def per_model(measurement: Measurement, tag: str) -> dict[str, float]:
    """Each model's value of `tag` in a joint measurement (empty for one model's)."""
    out = {}
    for key, value in measurement.metrics.items():
        name, sep, rest = key.rpartition(":")
        if sep and rest == tag:
            out[name] = value
    return out
