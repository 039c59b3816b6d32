"""How long one large request of one Python value per element keeps the worker from
answering anyone else.

    .venv/bin/python benchmarks/bytes_stall.py [--elements 16000000] [--compare-tree /tmp/before]
        [--rounds 2] [--kinds http,grpc,json,contents]

A python model takes a BYTES tensor of `--elements` empty elements (4 bytes each on the wire:
16 million fill a 64 MiB body, the default cap) and answers its size, or echoes it back
(`echo`): over HTTP (binary data) and gRPC (raw contents). `json` sends a quarter as many FP32
values as REST JSON 'data' (`0.5,`: 40 MiB), `contents` as gRPC fp32_contents (~20 MiB), to a
model that answers their count. While one such request is served, a second client asks
`/v2/health/live` every 20 ms on its own connection; the figure is the longest wait of those
probes, which is how long the worker's event loop was busy elsewhere. Each (tree, kind, echo)
runs in its own fresh worker, trees alternating round by round. With `--compare-tree`, the
other checkout's `analyzer` is measured the same way beside this one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serving import python_models, start_worker  # noqa: E402

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            echo = text if ECHO else np.array([b"x"], dtype=object)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("N", np.array([text.size], dtype=np.int64)),
                pb_utils.Tensor("ECHO", echo)]))
        return out
"""
CONFIG = ('max_batch_size: 0 input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ] '
          'output [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] }, '
          '{ name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] } ]')  # fmt: skip
FLOATS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array(
            [pb_utils.get_input_tensor_by_name(r, "X").as_numpy().size], dtype=np.int64))])
            for r in requests]
"""
FLOATS_CONFIG = ('max_batch_size: 0 input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ] '
                 'output [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]')  # fmt: skip
PROBE_EVERY_S = 0.02


def _probe(address: str, stop: threading.Event, waits: list[float]) -> None:
    conn = http.client.HTTPConnection(address, timeout=600)
    while not stop.is_set():
        start = time.perf_counter()
        conn.request("GET", "/v2/health/live")
        conn.getresponse().read()
        waits.append(time.perf_counter() - start)
        time.sleep(PROBE_EVERY_S)
    conn.close()


def _http(address: str, count: int) -> None:
    blob = b"\0\0\0\0" * count
    header = json.dumps({
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [count],
                    "parameters": {"binary_data_size": len(blob)}}],
        "outputs": [{"name": "N"}, {"name": "ECHO", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    _post(address, "bytes", header + blob, {"Inference-Header-Content-Length": str(len(header))})


def _post(address: str, model: str, body: bytes, headers: dict[str, str]) -> None:
    conn = http.client.HTTPConnection(address, timeout=600)
    conn.request("POST", f"/v2/models/{model}/infer", body, headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}")


def _infer(address: str, request: pb.ModelInferRequest) -> None:
    size = 1 << 28
    options = [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]
    with grpc.insecure_channel(address, options=options) as channel:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=600)


def _grpc(address: str, count: int) -> None:
    request = pb.ModelInferRequest(model_name="bytes", raw_input_contents=[b"\0\0\0\0" * count])
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[count])
    _infer(address, request)


def _json(address: str, count: int) -> None:
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[%d],"data":[' % count
    body += b"0.5," * (count - 1) + b"0.5]}]}"
    _post(address, "floats", body, {})


def _contents(address: str, count: int) -> None:
    request = pb.ModelInferRequest(model_name="floats")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[count])
    tensor.contents.fp32_contents.extend([0.5] * count)
    _infer(address, request)


SENDERS = {"http": (_http, "http", 1), "grpc": (_grpc, "grpc", 1),
           "json": (_json, "http", 4), "contents": (_contents, "grpc", 4)}  # fmt: skip


def measure(tree: Path | None, repo: Path, kind: str, count: int) -> tuple[float, float]:
    """(longest probe wait, the large request's own time), in seconds."""
    served = start_worker(repo, "--http-max-input-size", "128MB", "--grpc-max-message-size",
                          "128MB", source_tree=tree)  # fmt: skip
    try:
        waits: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(served.http, stop, waits))
        prober.start()
        time.sleep(0.5)
        send, protocol, divisor = SENDERS[kind]
        start = time.perf_counter()
        send(served.http if protocol == "http" else served.grpc, count // divisor)
        took = time.perf_counter() - start
        time.sleep(0.3)
        stop.set()
        prober.join()
        return max(waits), took
    finally:
        served.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=16_000_000)
    parser.add_argument("--compare-tree", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="http,grpc,json,contents")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.compare_tree:
        trees.append(("compared tree", args.compare_tree.resolve()))
    results: dict[tuple[str, str, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        repos = {}
        for echo in (False, True):
            repo = Path(scratch) / ("echo" if echo else "count")
            python_models(repo, {"bytes": MODEL.replace("ECHO else", f"{echo} else")}, CONFIG)
            python_models(repo, {"floats": FLOATS}, FLOATS_CONFIG)
            repos[echo] = repo
        for round_ in range(args.rounds):
            for kind in kinds:
                for echo in (False, True) if kind in ("http", "grpc") else (False,):
                    order = trees if round_ % 2 == 0 else trees[::-1]
                    for label, tree in order:
                        wait, took = measure(tree, repos[echo], kind, args.elements)
                        results.setdefault((label, kind, echo), []).append((wait, took))
                        print(f"round {round_ + 1} {label} {kind} echo={echo}: longest "
                              f"health-check wait {wait * 1000:.0f} ms, request {took:.1f} s",
                              flush=True)  # fmt: skip
    print(f"\n{args.elements:,} empty BYTES elements (a quarter as many FP32 values for json and "
          f"contents); medians of {args.rounds} rounds")  # fmt: skip
    for (label, protocol, echo), values in sorted(results.items()):
        wait = statistics.median(v[0] for v in values)
        took = statistics.median(v[1] for v in values)
        print(f"{label:14} {protocol:8} {'echo' if echo else 'count':6} longest wait "
              f"{wait * 1000:7.0f} ms   request {took:5.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
