"""tritonserver's flags that `model-analyzer serve` has no use for. They are accepted, so that
MA's `triton_server_flags` and scripts written for tritonserver start our worker, and each one
given is named in a note at start instead of ending the worker (Triton 2.41's flag names, as
Model Analyzer 1.58 passes them)."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

# tritonserver's flags that serve does not have under the same name (serve's own are its
# parameters); every one may be repeated, as several of Triton's are
NO_EFFECT = """
id model-store
model-load-thread-count model-load-retry-count
model-namespacing reuse-http-port http-header-forward-pattern http-thread-count grpc-address
reuse-grpc-port grpc-header-forward-pattern grpc-infer-allocation-pool-size
grpc-infer-response-compression-level grpc-keepalive-time grpc-keepalive-timeout
grpc-keepalive-permit-without-calls grpc-http2-max-pings-without-data
grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes
grpc-max-connection-age grpc-max-connection-age-grace allow-sagemaker sagemaker-port
sagemaker-safe-port-range sagemaker-thread-count allow-vertex-ai vertex-ai-port
vertex-ai-thread-count vertex-ai-default-model
metrics-address metrics-config trace-config backend-directory backend-config
repoagent-directory cache-config cache-directory rate-limit rate-limit-resource
pinned-memory-pool-byte-size cuda-memory-pool-byte-size cuda-virtual-address-size
min-supported-compute-capability buffer-management-thread-count host-policy model-load-gpu-limit
response-cache-byte-size trace-file trace-level trace-rate trace-count
trace-log-frequency
""".split()


def _name(flag: str) -> str:
    return "triton_" + flag.replace("-", "_")


def parameters() -> list[inspect.Parameter]:
    """One repeatable option per flag of NO_EFFECT, taking any value (hidden from --help, which
    says so in one sentence)."""
    out = []
    for flag in NO_EFFECT:
        option = typer.Option(f"--{flag}", hidden=True)
        out.append(inspect.Parameter(_name(flag), inspect.Parameter.KEYWORD_ONLY, default=None,
                                     annotation=Annotated[list[str] | None, option]))
    return out


def notes(flags: dict[str, Any]) -> list[str]:
    """A note for each of these flags given."""
    return [f"note: --{flag} has no effect here (tritonserver's flag; model-analyzer serve has "
            "no use for it)" for flag in NO_EFFECT if flags.get(_name(flag))]  # fmt: skip
