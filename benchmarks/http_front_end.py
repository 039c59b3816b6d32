"""CPU per request of the HTTP inference front end alone, in-process: before/after.

    .venv/bin/python benchmarks/http_front_end.py [--compare-tree /tmp/before] [--rounds 5]

Feeds perf_analyzer's own request (its headers, JSON header and 12 KiB of FP32, as it sends
for tiny_cnn at client batch 1) to the worker's HTTP protocol object again and again: parsing,
routing, decoding, validation against the model config, response encoding and writing -- with
a model that answers at once and a transport that drops the bytes, so neither threads, sockets
nor the model are measured. Each tree runs in its own process pinned to core 1; trees alternate
round by round; the figure per round is the best of 7 repetitions of 20,000 requests.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, sys, time
import numpy as np
from analyzer.config.model_config import parse_model_config
from analyzer.worker import http_server
from analyzer.worker.http import RestApi
from analyzer.worker.limits import Limits
from analyzer.worker.validate import RequestValidator

config = parse_model_config(sys.argv[1])
out = np.zeros((1, 10), np.float32)

class Model:
    name, version = "tiny_cnn", 1
    validator = RequestValidator(config)
    def submit(self, request, checked=False):
        if not checked:
            self.validator.check(request)
        request.on_done({"OUTPUT__0": out}, None)

class Manager:
    model = Model()
    def get(self, name, version=""):
        return self.model

class Loop:  # answers come back at once instead of from an instance thread
    def call_soon_threadsafe(self, f, *args):
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

header = json.dumps({"id": "", "inputs": [{"name": "INPUT__0", "datatype": "FP32",
    "shape": [1, 3, 32, 32], "parameters": {"binary_data_size": 12288}}],
    "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]},
    separators=(",", ":")).encode()
body = header + np.random.default_rng(0).standard_normal(3 * 32 * 32).astype(np.float32).tobytes()
request = (b"POST /v2/models/tiny_cnn/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"User-Agent: libcurl-agent/1.0\r\nAccept: */*\r\n"
           b"Inference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\n"
           b"Content-Length: %d\r\n\r\n" % (len(header), len(body))) + body
server = http_server._Server(Limits(), asyncio.new_event_loop())
protocol = http_server._Protocol(RestApi(Manager(), Loop(), "bench"), server)
transport = Transport()
protocol.connection_made(transport)
for _ in range(2000):
    protocol.data_received(request)
assert transport.written == 2000, "every request must be answered"
best = float("inf")
for _ in range(7):
    t0 = time.process_time()
    for _ in range(20000):
        protocol.data_received(request)
    best = min(best, (time.process_time() - t0) / 20000 * 1e6)
print(best)
"""


def measure(tree: Path) -> float:
    config = (ROOT / "examples" / "model_repository" / "tiny_cnn" / "config.pbtxt").read_text()
    config += "\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n"
    run = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", CHILD, config],
        capture_output=True, text=True, cwd=tree, env={"PYTHONPATH": str(tree)},
    )  # fmt: skip
    if run.returncode != 0:
        raise SystemExit(f"{tree}: {run.stderr.strip()}")
    return float(run.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", help="another checkout's root: measure after/before")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"after": ROOT, "after-again": ROOT}
    if args.compare_tree:
        trees["before"] = Path(args.compare_tree).resolve()
    names = list(trees)
    got: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.rounds):
        for n in names[i % len(names):] + names[: i % len(names)]:
            got[n].append(measure(trees[n]))
    for n in names:
        print(f"{n}: {statistics.median(got[n]):.1f} µs/request (median of {args.rounds} rounds)")
    aa = [a / b for a, b in zip(got["after-again"], got["after"], strict=True)]
    print(f"A/A after-again/after {statistics.median(aa):.3f} ({min(aa):.3f}-{max(aa):.3f})")
    if args.compare_tree:
        r = [a / b for a, b in zip(got["after"], got["before"], strict=True)]
        print(f"after/before {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
