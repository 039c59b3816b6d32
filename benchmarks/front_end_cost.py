"""CPU per request of the worker's inference front ends alone, in-process: HTTP and gRPC.

    .venv/bin/python benchmarks/front_end_cost.py [--protocols http,grpc] [--model tiny_cnn]
        [--compare-tree /tmp/before] [--rounds 5]

Feeds the request perf_analyzer sends (tiny_cnn: 12 KiB of FP32 at client batch 1; add_sub: two
FP32[1,4]) to the worker's protocol object again and again -- for HTTP its headers, JSON header
and binary inputs; for gRPC the HEADERS (HPACK-indexed, as a client repeats them), DATA and
WINDOW_UPDATE frames of one call on a new stream each time: parsing, routing, decoding,
validation against the model config, response encoding and writing, with a model that answers
at once and a transport that drops the bytes, so neither threads, sockets nor the model are
measured. Each (tree, protocol) runs in its own process pinned to core 1; they alternate round
by round; the figure per round is the best of 7 repetitions of 20,000 requests. Reported: µs per
request, the A/A floor (this tree measured twice), gRPC/HTTP, and after/before per protocol.
(Named http_front_end.py until gRPC got its own fast path; `--protocols http` is the same run.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMON = r"""
import asyncio, json, sys, time
import numpy as np
from analyzer.config.model_config import parse_model_config
from analyzer.worker.limits import Limits
from analyzer.worker.validate import RequestValidator

MODELS = {  # name: (inputs as (name, shape), outputs as (name, shape)); all FP32
    "tiny_cnn": ([("INPUT__0", (1, 3, 32, 32))], [("OUTPUT__0", (1, 10))]),
    "add_sub": ([("INPUT0", (1, 4)), ("INPUT1", (1, 4))],
                [("OUTPUT0", (1, 4)), ("OUTPUT1", (1, 4))]),
}
NAME, PROTOCOL = sys.argv[2], sys.argv[3]
INPUTS, OUTPUTS = MODELS[NAME]
config = parse_model_config(sys.argv[1])
answer = {name: np.zeros(shape, np.float32) for name, shape in OUTPUTS}
rng = np.random.default_rng(0)
values = [rng.standard_normal(shape).astype(np.float32).tobytes() for _, shape in INPUTS]

class Model:
    name, version = NAME, 1
    validator = RequestValidator(config)
    def submit(self, request, checked=False):
        if not checked:
            self.validator.check(request)
        request.on_done(answer, None)

class Manager:
    model = Model()
    def get(self, name, version=""):
        return self.model

class Handle:
    def cancel(self):
        pass

class Loop:  # callbacks run when the test says a loop pass ends
    def __init__(self):
        self.soon = []
    def call_soon_threadsafe(self, f, *args):
        self.soon.append((f, args))
    call_soon = call_soon_threadsafe
    def call_later(self, delay, f, *args):
        return Handle()
    def run(self):
        while self.soon:
            soon, self.soon = self.soon, []
            for f, args in soon:
                f(*args)

class Transport:
    written = 0
    def writelines(self, parts):
        self.written += 1
    def write(self, data):
        self.written += 1
    def is_closing(self):
        return False
    def get_extra_info(self, key):
        return None
    def set_write_buffer_limits(self, high):
        pass
    def pause_reading(self):
        pass
    def resume_reading(self):
        pass

loop, transport = Loop(), Transport()
if PROTOCOL == "http":
    from analyzer.worker import http_server
    from analyzer.worker.http import RestApi
    header = json.dumps({"id": "", "inputs": [{"name": n, "datatype": "FP32", "shape": list(s),
        "parameters": {"binary_data_size": 4 * int(np.prod(s))}} for n, s in INPUTS],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n, _ in OUTPUTS]},
        separators=(",", ":")).encode()
    body = header + b"".join(values)
    one = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"User-Agent: libcurl-agent/1.0\r\nAccept: */*\r\n"
           b"Inference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\n"
           b"Content-Length: %d\r\n\r\n" % (NAME.encode(), len(header), len(body))) + body
    server = http_server._Server(Limits(), asyncio.new_event_loop())
    protocol = http_server._Protocol(RestApi(Manager(), loop, "bench"), server)
    protocol.connection_made(transport)
    requests = lambda n: [one] * n
else:
    from hpack import Encoder
    from tritonclient.grpc import service_pb2 as pb
    from analyzer.worker import grpc_server
    request = pb.ModelInferRequest(model_name=NAME)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for (n, s), raw in zip(INPUTS, values):
        request.inputs.add(name=n, datatype="FP32", shape=list(s))
        request.raw_input_contents.append(raw)
    for n, _ in OUTPUTS:
        request.outputs.add(name=n)
    message = request.SerializeToString()
    message = b"\x00" + len(message).to_bytes(4, "big") + message
    headers = [(":path", "/inference.GRPCInferenceService/ModelInfer"),
               (":authority", "127.0.0.1:8001"), (":method", "POST"), (":scheme", "http"),
               ("content-type", "application/grpc"), ("te", "trailers"),
               ("grpc-accept-encoding", "identity, deflate, gzip"),
               ("user-agent", "grpc-c++/1.54.3 grpc-c/31.0.0 (linux; chttp2)")]
    encoder = Encoder()
    def frame(kind, flags, stream, payload):
        head = len(payload).to_bytes(3, "big") + bytes((kind, flags))
        return head + stream.to_bytes(4, "big") + payload
    stream = [1]
    def call(block):  # what perf_analyzer's client writes for one call
        sid = stream[0]
        stream[0] += 2
        return (frame(1, 4, sid, block) + frame(8, 0, sid, (5).to_bytes(4, "big"))
                + frame(0, 1, sid, message) + frame(8, 0, 0, (1024).to_bytes(4, "big")))
    server = grpc_server.GrpcServer(Manager(), None, "127.0.0.1", 0, Limits())
    server.loop = loop
    protocol = grpc_server._Connection(server)
    protocol.connection_made(transport)
    first = call(encoder.encode(headers))  # the client's first call fills the HPACK table
    protocol.data_received(grpc_server.PREFACE + frame(4, 0, 0, b"") + first)
    loop.run()
    block = encoder.encode(headers)  # all indexed now
    requests = lambda n: [call(block) for _ in range(n)]
    transport.written = 0
feed = protocol.data_received
for data in requests(2000):
    feed(data)
    loop.run()
assert transport.written == 2000, f"every request must be answered, {transport.written}"
best = float("inf")
for _ in range(7):
    batch = requests(20000)
    t0 = time.process_time()
    for data in batch:
        feed(data)
        loop.run()
    best = min(best, (time.process_time() - t0) / 20000 * 1e6)
print(best)
"""


def measure(tree: Path, model: str, protocol: str) -> float:
    config = (ROOT / "examples" / "model_repository" / model / "config.pbtxt").read_text()
    if "dynamic_batching" not in config:
        config += "\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    run = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", COMMON, config, model, protocol],
        capture_output=True, text=True, cwd=tree, env={"PYTHONPATH": str(tree)},
    )  # fmt: skip
    if run.returncode != 0:
        raise SystemExit(f"{tree} {protocol}: {run.stderr.strip()}")
    return float(run.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--model", default="tiny_cnn", choices=("tiny_cnn", "add_sub"))
    parser.add_argument("--compare-tree", help="another checkout's root: measure after/before")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    trees = {"after": ROOT, "after-again": ROOT}
    if args.compare_tree:
        trees["before"] = Path(args.compare_tree).resolve()
    runs = [(t, p) for p in protocols for t in trees]
    got: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
    for i in range(args.rounds):
        for t, p in runs[i % len(runs):] + runs[: i % len(runs)]:
            got[t, p].append(measure(trees[t], args.model, p))

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> str:
        r = [x / y for x, y in zip(got[a], got[b], strict=True)]
        return f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})"

    for t, p in runs:
        print(f"{p} {t}: {statistics.median(got[t, p]):.1f} µs/request "
              f"(median of {args.rounds} rounds)")  # fmt: skip
    for p in protocols:
        print(f"{p}: A/A after-again/after {ratio(('after-again', p), ('after', p))}")
        if args.compare_tree:
            print(f"{p}: after/before {ratio(('after', p), ('before', p))}")
    if "http" in protocols and "grpc" in protocols:
        print(f"gRPC/HTTP cost (after) {ratio(('after', 'grpc'), ('after', 'http'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
