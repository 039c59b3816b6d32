"""NVIDIA Model Analyzer keys that mean nothing here. They are accepted in the YAML and on the
command line, spelled as MA spells them, so an MA user's files and scripts run unchanged; each one
given becomes a note saying what happens instead."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ignored:
    why: str  # what happens instead, for the note
    kind: str = "str"  # bool: a switch, as MA's store_true; otherwise a flag with a value
    flags: tuple[str, ...] = ()  # MA's short flags
    cli: bool = True  # False: a YAML-only key in MA, with no flag


_BUILT_IN = "the load generator is built in"
IGNORED = {
    "perf_analyzer_path": Ignored(_BUILT_IN),
    "perf_analyzer_timeout": Ignored(_BUILT_IN),
    "perf_analyzer_cpu_util": Ignored("the load generator measures its own CPU use"),
    "perf_analyzer_max_auto_adjusts": Ignored(_BUILT_IN),
    "triton_server_path": Ignored(
        "the worker is model-analyzer serve (NVIDIA's MA runs it as model-analyzer-server)"
    ),
    "triton_install_path": Ignored("the worker is model-analyzer serve"),
    "dcgm_disable": Ignored("GPUs are read through NVML", "bool"),
    "collect_cpu_metrics": Ignored("CPU metrics are always collected for a local worker", "bool"),
    "reload_model_disable": Ignored("variants are always loaded fresh", "bool"),
    "always_report_gpu_metrics": Ignored(
        "GPU metrics are reported whenever a GPU was sampled", "bool"
    ),
    "log_level": Ignored("output is fixed"),
    "ensemble_composing_models": Ignored(
        "an ensemble's composing models are read from its ensemble_scheduling steps and searched "
        "together with it"
    ),
    "model_type": Ignored(
        "every model is profiled as a generic model with the built-in load generator (LLM "
        "profiling with genai-perf is not built in)"
    ),
    "genai_perf_flags": Ignored("LLM profiling with genai-perf is not built in", cli=False),
    "weighting": Ignored(
        "a model's weight when models are profiled together is set per model "
        "(profile_models.<model>.weighting), as MA requires",
        cli=False,
    ),
}


def note(key: str) -> str:
    return f"'{key}' has no effect here: {IGNORED[key].why}"
