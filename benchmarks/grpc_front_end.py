"""The ceiling of each way to serve gRPC from Python: what the worker's gRPC front end can reach.

    .venv/bin/python benchmarks/grpc_front_end.py [--rounds 5] [--concurrency 16]

Three minimal servers of Triton's GRPCInferenceService (the calls perf_analyzer makes; ModelInfer
echoes an add_sub-shaped answer at once, so only the front end costs anything), each in its own
process pinned to core 1 and driven by NVIDIA perf_analyzer on core 0, in a rotating order per
round:

- `aio`: grpc.aio, handlers as coroutines (the worker's front end before issue 17);
- `sync`: grpcio's thread-pool server (4 threads);
- `core`: one thread polling a completion queue of grpcio's core (`grpc._cython.cygrpc`):
  receive, parse, answer with one batch of operations; no thread pool and no event loop.

Each also runs with `+hop`: the answer is produced on a second thread, as the worker's model
instances do, and handed back the way that server would (a future resolved through the loop, an
event, or a batch started from the model thread). Reported: infer/s medians and each server's
ratio to `aio` (median, min-max over rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"
SERVER_CPU, CLIENT_CPU = "1", "0"
SERVERS = ("aio", "sync", "core", "aio+hop", "sync+hop", "core+hop")
SERVICE = "/inference.GRPCInferenceService/"


def handlers():
    """method path -> (request class, answer function) for the calls perf_analyzer makes."""
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.grpc import service_pb2 as pb

    config = mc.ModelConfig(name="add_sub", backend="python", max_batch_size=0)
    tensors = [pb.ModelMetadataResponse.TensorMetadata(name=n, datatype="FP32", shape=[4])
               for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]  # fmt: skip
    for t in tensors[:2]:
        config.input.add(name=t.name, data_type=mc.TYPE_FP32, dims=[4])
    for t in tensors[2:]:
        config.output.add(name=t.name, data_type=mc.TYPE_FP32, dims=[4])
    metadata = pb.ModelMetadataResponse(
        name="add_sub", versions=["1"], platform="python", inputs=tensors[:2], outputs=tensors[2:]
    )

    def infer(request):
        response = pb.ModelInferResponse(model_name="add_sub", model_version="1", id=request.id)
        for name in ("OUTPUT0", "OUTPUT1"):
            response.outputs.add(name=name, datatype="FP32", shape=[4])
            response.raw_output_contents.append(request.raw_input_contents[0])
        return response

    return {
        "ServerMetadata": (pb.ServerMetadataRequest,
                           lambda r: pb.ServerMetadataResponse(name="x", version="2.41.0")),
        "ServerLive": (pb.ServerLiveRequest, lambda r: pb.ServerLiveResponse(live=True)),
        "ServerReady": (pb.ServerReadyRequest, lambda r: pb.ServerReadyResponse(ready=True)),
        "ModelMetadata": (pb.ModelMetadataRequest, lambda r: metadata),
        "ModelConfig": (pb.ModelConfigRequest, lambda r: pb.ModelConfigResponse(config=config)),
        "ModelInfer": (pb.ModelInferRequest, infer),
    }  # fmt: skip


class ModelThread:
    """Stands in for a model instance: answers queued requests on its own thread."""

    def __init__(self, answer) -> None:
        self.answer, self.work, self.ready = answer, [], threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, request, done) -> None:
        with self.ready:
            self.work.append((request, done))
            self.ready.notify()

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.work:
                    self.ready.wait()
                items, self.work = self.work, []
            for request, done in items:
                done(self.answer(request))


def serve_aio(port: int, hop: bool) -> None:
    import grpc

    table = handlers()
    infer = table["ModelInfer"][1]
    model = ModelThread(infer) if hop else None

    def unary(name, kind, fn):
        async def call(request, context):
            if model is None or name != "ModelInfer":
                return fn(request)
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            model.submit(request, lambda r: loop.call_soon_threadsafe(future.set_result, r))
            return await future

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=kind.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )  # fmt: skip

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {name: unary(name, kind, fn) for name, (kind, fn) in table.items()}),))  # fmt: skip
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def serve_sync(port: int, hop: bool) -> None:
    import grpc

    table = handlers()
    model = ModelThread(table["ModelInfer"][1]) if hop else None

    def unary(name, kind, fn):
        def call(request, context):
            if model is None or name != "ModelInfer":
                return fn(request)
            done, box = threading.Event(), []
            model.submit(request, lambda r: (box.append(r), done.set()))
            done.wait()
            return box[0]

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=kind.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )  # fmt: skip

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {name: unary(name, kind, fn) for name, (kind, fn) in table.items()}),))  # fmt: skip
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def serve_core(port: int, hop: bool) -> None:
    from grpc._cython import cygrpc

    table = {SERVICE + name: entry for name, entry in handlers().items()}
    queue = cygrpc.CompletionQueue()
    server = cygrpc.Server((), False)
    server.register_completion_queue(queue)
    server.add_http2_port(f"127.0.0.1:{port}".encode())
    server.start()

    def reply(call, message) -> None:
        call.start_server_batch((
            cygrpc.SendInitialMetadataOperation(None, 0),
            cygrpc.SendMessageOperation(message.SerializeToString(), 0),
            cygrpc.SendStatusFromServerOperation(None, cygrpc.StatusCode.ok, b"", 0),
            cygrpc.ReceiveCloseOnServerOperation(0),
        ), None)  # fmt: skip

    model = ModelThread(table[SERVICE + "ModelInfer"][1]) if hop else None
    new_call = object()
    server.request_call(queue, queue, new_call)
    print("ready", flush=True)
    while True:
        event = queue.poll()
        if event.tag is new_call:
            server.request_call(queue, queue, new_call)
            method = event.call_details.method.decode()
            event.call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(0),), (event.call, method)
            )
        elif event.tag is not None:
            call, method = event.tag
            kind, fn = table[method]
            request = kind.FromString(event.batch_operations[0].message())
            if model is not None and method.endswith("/ModelInfer"):
                model.submit(request, lambda r, call=call: reply(call, r))
            else:
                reply(call, fn(request))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(server: str, concurrency: int, window_ms: int, port: int) -> float:
    cmd = ["taskset", "-c", SERVER_CPU, sys.executable, __file__, "--serve", server, str(port)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        run = subprocess.run(
            ["taskset", "-c", CLIENT_CPU, str(PERF_ANALYZER), "-m", "add_sub", "-i", "grpc",
             "-u", f"127.0.0.1:{port}", "--concurrency-range", str(concurrency),
             "-p", str(window_ms), "-s", "50"], capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode != 0:
            raise RuntimeError(run.stdout + run.stderr)
        line = next(x for x in run.stdout.splitlines() if "Throughput:" in x)
        return float(line.split()[1])
    finally:
        process.kill()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--serve", nargs=2, metavar=("SERVER", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        name, port = args.serve[0], int(args.serve[1])
        kind, _, hop = name.partition("+")
        {"aio": serve_aio, "sync": serve_sync, "core": serve_core}[kind](port, bool(hop))
        return 0
    got: dict[str, list[float]] = {s: [] for s in SERVERS}
    for i in range(args.rounds):
        order = SERVERS[i % len(SERVERS):] + SERVERS[: i % len(SERVERS)]
        for server in order:
            got[server].append(measure(server, args.concurrency, args.window_ms, free_port()))
    for server in SERVERS:
        base = got[server.replace(server.split("+")[0], "aio")]
        ratio = [x / y for x, y in zip(got[server], base, strict=True)]
        print(f"{server:>9}: {statistics.median(got[server]):7.0f} infer/s; /aio "
              f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
