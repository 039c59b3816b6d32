"""Our worker vs KServe's python ModelServer: the same models, the same client, both protocols.

    python3.11 -m venv .venv-kserve
    .venv-kserve/bin/pip install kserve==0.21.0 tritonclient[grpc]==2.41.0 [torch==2.13.0]
    .venv/bin/python benchmarks/vs_kserve.py [--rounds 5] [--concurrency 16] [--models ...]

KServe runs in its own virtualenv (`--kserve-python`), never in ours. Both servers are pinned to
core 1 and NVIDIA's perf_analyzer to core 0 (../shared/BENCHMARKING.md). add_sub is the bundled
example on our side (python backend, dynamic batching) and the same arithmetic in a
`kserve.Model.predict` on KServe's; tiny_cnn (when torch is importable in KServe's venv) is the
same TorchScript file, one torch thread on both sides; with `--gpu` tiny_cnn runs on the GPU on
both sides (placement.py). Every round measures, per protocol,
ours / KServe / ours again in a rotating order; reported: ours/KServe throughput and the A/A
floor (ours-again/ours) as median (min-max), and p99 medians.

perf_analyzer asks a server for the model's configuration before it sends load; KServe has no
such call, so the KServe side answers `ModelConfig` (gRPC) and `/v2/models/<m>/config` (REST)
with the model's inputs and outputs. That is control plane only: inference goes through KServe's
own REST and gRPC paths. Outputs are returned as binary (raw_output_contents over gRPC):
perf_analyzer 2.41 crashes on typed `contents` answers. KServe's per-request log lines (access
log, traces, the gRPC interceptor's) are turned off: our worker writes none.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from grpc_vs_http import measure, rotating_rounds, spread  # noqa: E402
from placement import PLACEMENT  # noqa: E402
from serving import EXAMPLES, start_worker  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402

KSERVE_SERVER = r'''
import sys, numpy as np, grpc, kserve
from fastapi import FastAPI
from kserve import Model, ModelServer, InferRequest, InferResponse, InferOutput
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as generated
from kserve.protocol.rest.server import RESTServer

http_port, grpc_port, tiny_cnn = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
device = sys.argv[6]  # torch device of tiny_cnn
def tensors(names, dims):
    return [dict(name=n, data_type="TYPE_FP32", dims=dims) for n in names]

CONFIGS = {
    "add_sub": dict(name="add_sub", max_batch_size=0, input=tensors(("INPUT0", "INPUT1"), [1, 4]),
                    output=tensors(("OUTPUT0", "OUTPUT1"), [1, 4])),
    "tiny_cnn": dict(name="tiny_cnn", max_batch_size=0,
                     input=[dict(name="INPUT__0", data_type="TYPE_FP32", dims=[1, 3, 32, 32])],
                     output=[dict(name="OUTPUT__0", data_type="TYPE_FP32", dims=[1, 10])]),
}

class Described(Model):
    """Metadata from CONFIGS: perf_analyzer reads the model's tensors from it."""

    def get_input_types(self):
        return [dict(name=t["name"], datatype="FP32", shape=t["dims"])
                for t in CONFIGS[self.name]["input"]]

    def get_output_types(self):
        return [dict(name=t["name"], datatype="FP32", shape=t["dims"])
                for t in CONFIGS[self.name]["output"]]

class AddSub(Described):
    def __init__(self):
        super().__init__("add_sub")
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None):
        a, b = payload.inputs[0].as_numpy(), payload.inputs[1].as_numpy()
        outputs = []
        for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            out = InferOutput(name, list(value.shape), "FP32")
            out.set_data_from_numpy(value, binary_data=True)
            outputs.append(out)
        return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id,
                             use_binary_outputs=True)

class TinyCnn(Described):
    def __init__(self, path):
        super().__init__("tiny_cnn")
        import torch
        torch.set_num_threads(1)
        self.torch, self.device = torch, torch.device(device)
        self.model = torch.jit.load(path, map_location=self.device).eval()
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None):
        with self.torch.inference_mode():
            x = self.torch.from_numpy(payload.inputs[0].as_numpy()).to(self.device)
            y = self.model(x).cpu().numpy()
        out = InferOutput("OUTPUT__0", list(y.shape), "FP32")
        out.set_data_from_numpy(y, binary_data=True)
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id,
                             use_binary_outputs=True)

# control plane for perf_analyzer: ModelConfig over gRPC (the answer's bytes were serialized
# by the benchmark: Triton's and KServe's protos cannot share one process) and REST
ANSWERS = {name: bytes.fromhex(sys.argv[4 + i]) for i, name in enumerate(("add_sub", "tiny_cnn"))}

async def model_config(request: bytes, context):
    return next(ANSWERS[n] for n in ANSWERS if n.encode() in request)

original_add = generated.add_GRPCInferenceServiceServicer_to_server
def add(servicer, server):
    original_add(servicer, server)
    handler = grpc.unary_unary_rpc_method_handler(model_config)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelConfig": handler}),))
generated.add_GRPCInferenceServiceServicer_to_server = add
import kserve.protocol.grpc.server as grpc_server_module
grpc_server_module.grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server = add

original_register = RESTServer._register_endpoints
def register(self, app: FastAPI):
    original_register(self, app)
    app.add_api_route("/v2/models/{name}/config", lambda name: CONFIGS[name], methods=["GET"])
RESTServer._register_endpoints = register

models = [AddSub()] + ([TinyCnn(tiny_cnn)] if tiny_cnn != "-" else [])
server = ModelServer(http_port=http_port, grpc_port=grpc_port, workers=1,
                     enable_latency_logging=False)
# no line per request (access log, traces, the gRPC interceptor's): our worker writes none either
import logging
for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
    logging.getLogger(name).setLevel(logging.WARNING)
server.start(models)
'''


def config_answer(model: str) -> bytes:
    """ModelConfigResponse bytes for KServe's side: the same tensors as its REST answer."""
    names = {"add_sub": (("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"), [1, 4]),
             "tiny_cnn": (("INPUT__0",), ("OUTPUT__0",), None)}[model]  # fmt: skip
    inputs, outputs, dims = names
    in_dims, out_dims = (dims, dims) if dims else ([1, 3, 32, 32], [1, 10])
    config = {"name": model, "max_batch_size": 0,
              "input": [{"name": n, "data_type": "TYPE_FP32", "dims": in_dims} for n in inputs],
              "output": [{"name": n, "data_type": "TYPE_FP32", "dims": out_dims} for n in outputs]}
    response = pb.ModelConfigResponse()
    json_format.ParseDict({"config": config}, response)
    return response.SerializeToString()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KServe:
    def __init__(self, python: Path, with_torch: bool, tmp: Path) -> None:
        script = tmp / "kserve_server.py"
        script.write_text(KSERVE_SERVER)
        self.http_port, self.grpc_port = free_port(), free_port()
        model = str(EXAMPLES / "tiny_cnn" / "1" / "model.pt") if with_torch else "-"
        answers = [config_answer(name).hex() for name in ("add_sub", "tiny_cnn")]
        cmd = ["taskset", "-c", PLACEMENT.server_cpus, str(python), str(script),
               str(self.http_port), str(self.grpc_port), model, *answers,
               PLACEMENT.torch_device]  # fmt: skip
        self.log = (tmp / "kserve.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.http_port}/v2/models/add_sub/ready", timeout=2
                ) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"KServe did not start: see {tmp / 'kserve.log'}")

    def address(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--models", default="add_sub,tiny_cnn")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--kserve-python", default=str(ROOT / ".venv-kserve" / "bin" / "python"))
    placement.add_arguments(parser)
    args = parser.parse_args()
    placement.apply(args)
    python = Path(args.kserve_python)
    has_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    models = [m for m in args.models.split(",") if m != "tiny_cnn" or has_torch.returncode == 0]
    if len(models) < len(args.models.split(",")):
        print("tiny_cnn left out: torch is not installed in KServe's venv", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="vs-kserve-"))
    ours = start_worker(placement.examples(tmp), cpus=PLACEMENT.server_cpus)
    kserve = None
    try:
        kserve = KServe(python, "tiny_cnn" in models, tmp)
        servers = {
            "ours": lambda p: ours.http if p == "http" else ours.grpc,
            "kserve": kserve.address,
            "ours-again": lambda p: ours.http if p == "http" else ours.grpc,
        }
        legs = list(servers)
        for model in models:
            for protocol in args.protocols.split(","):
                for leg in legs:  # warm-up
                    measure(servers[leg](protocol), model, protocol, args.concurrency, 1000,
                            tmp / "p.csv")  # fmt: skip
                got = rotating_rounds(legs, args.rounds, lambda leg, m=model, p=protocol: measure(
                    servers[leg](p), m, p, args.concurrency, args.window_ms, tmp / "p.csv"
                ))  # fmt: skip
                rate = {leg: [t for t, _ in got[leg]] for leg in legs}
                p99 = {leg: statistics.median(p for _, p in got[leg]) for leg in legs}
                ratio = [a / b for a, b in zip(rate["ours"], rate["kserve"], strict=True)]
                floor = [a / b for a, b in zip(rate["ours-again"], rate["ours"], strict=True)]
                medians = ", ".join(f"{leg} {statistics.median(rate[leg]):.0f}" for leg in legs)
                print(f"{model:>8} {protocol:>4} c={args.concurrency}: ours/KServe {spread(ratio)};"
                      f" A/A {spread(floor)}; infer/s medians: {medians}; p99 µs medians: "
                      + ", ".join(f"{leg} {p99[leg]:.0f}" for leg in legs), flush=True)  # fmt: skip
    finally:
        if kserve is not None:
            kserve.stop()
        ours.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
