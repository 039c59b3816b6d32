"""The native floor: served/offline with no interpreter per request, beside our worker (issue 17).

    .venv/bin/python benchmarks/native_floor.py [--rounds 3] [--window-ms 2000]

Issue 17 asks for client batch 1 at c=16 under the dynamic batcher to reach 0.85 of offline
torch at the batch the batcher executed. This measures how much of that a front end can reach
at all on this machine: `native_floor.c` (compiled here with the system's cc) parses
perf_analyzer's binary HTTP requests in C on its own pthread, copies each input into a
preallocated ring, and a Python thread runs tiny_cnn on the ring's slots through ctypes, with
one intra-op thread, as the worker and the offline loop do. Per request there is no Python at
all: what is left is the kernel's socket work, the batch hand-off, and the server's idle time
while perf_analyzer turns the answers around.

For three dynamic-batching settings of `serving_efficiency.py` (`b1_dynamic16`: preferred 16,
one group of 16 at c=16; `b1_pref8`: preferred 8, two groups of 8 that pipeline; `b1_dynamic0`:
`dynamic_batching { }`, no delay, what the instance finds queued when it is free), three legs
run in a rotating order every round: the native floor, our worker with that setting, and the
native floor again (the A/A noise floor). Server side (worker, native thread, model thread,
offline loop) on core 1, perf_analyzer on core 0. Reported per setting: each leg's
served/offline (the offline limit measured in the same round at the batch it executed),
worker/native, and native-again/native, as median (min-max). perf_analyzer gets `-x 1`: the
worker, which answers its metadata and statistics requests, executes nothing during a native
leg.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from analyzer.cpulist import parse_cpu_list

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import placement  # noqa: E402
import serving_efficiency as se  # noqa: E402
from grpc_vs_http import spread  # noqa: E402
from serving import free_port, start_worker  # noqa: E402

# setting -> (the batch it launches at, its max_queue_delay_microseconds)
SETTINGS = {"b1_dynamic16": (16, 2000), "b1_pref8": (8, 2000), "b1_dynamic0": (32, 0)}
INPUT_BYTES = 3 * 32 * 32 * 4  # tiny_cnn: INPUT__0 FP32 [3, 32, 32]
OUTPUT_FLOATS = 10  # OUTPUT__0 FP32 [10]


def build(folder: Path) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("native_floor.py needs a C compiler (cc or gcc) on PATH")
    library = folder / "native_floor.so"
    source = ROOT / "benchmarks" / "native_floor.c"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-lpthread"],
                   check=True)  # fmt: skip
    lib = ctypes.CDLL(str(library))
    lib.nf_wait_batch.restype = ctypes.c_long
    lib.nf_wait_batch.argtypes = [ctypes.POINTER(ctypes.c_long)]
    lib.nf_inputs.restype = ctypes.c_void_p
    lib.nf_outputs.restype = ctypes.c_void_p
    lib.nf_ring.restype = ctypes.c_long
    lib.nf_done.argtypes = [ctypes.c_long]
    lib.nf_start.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long,
                             ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p,
                             ctypes.c_char_p, ctypes.c_long]  # fmt: skip
    return lib


class NativeServer:
    """One native front end for one model name, and the Python thread that runs its batches."""

    def __init__(self, folder: Path, model: str, setting: str, worker_port: int, model_file: Path):
        import torch

        self.lib = build(folder)
        self.port = free_port()
        batch, delay_us = SETTINGS[setting]
        if self.lib.nf_start(self.port, worker_port, batch, delay_us, INPUT_BYTES,
                             OUTPUT_FLOATS * 4, model.encode(), b"OUTPUT__0", b"FP32",
                             OUTPUT_FLOATS) != 0:  # fmt: skip
            raise SystemExit(f"native_floor.py: cannot listen on 127.0.0.1:{self.port}")
        ring = self.lib.nf_ring()
        self.inputs = np.ctypeslib.as_array(
            (ctypes.c_float * (ring * INPUT_BYTES // 4)).from_address(self.lib.nf_inputs())
        ).reshape(ring, 3, 32, 32)
        self.outputs = np.ctypeslib.as_array(
            (ctypes.c_float * (ring * OUTPUT_FLOATS)).from_address(self.lib.nf_outputs())
        ).reshape(ring, OUTPUT_FLOATS)
        self.module = torch.jit.load(str(model_file)).eval()
        self.samples = 0
        self.batches = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import torch

        torch.set_num_threads(1)  # pinned already: threads inherit main()'s CPUs
        count = ctypes.c_long()
        ring = len(self.inputs)
        with torch.inference_mode():
            while True:
                first = self.lib.nf_wait_batch(ctypes.byref(count))
                n = count.value
                if first + n <= ring:  # contiguous slots: the ring itself is the batch
                    batch = self.inputs[first : first + n]
                    self.outputs[first : first + n] = self.module(torch.from_numpy(batch)).numpy()
                else:
                    where = (first + np.arange(n)) % ring
                    self.outputs[where] = self.module(torch.from_numpy(self.inputs[where])).numpy()
                self.samples += n
                self.batches += 1
                self.lib.nf_done(n)


def drive(model: str, port: int, concurrency: int, window_ms: int, out: Path) -> float:
    """perf_analyzer's throughput against the native server (the worker's legs use `se.served`)."""
    cmd = ["taskset", "-c", placement.PLACEMENT.client_cpus, str(placement.perf_analyzer()),
           "-m", model, "-x", "1", "-u", f"127.0.0.1:{port}", "-i", "http", "-b", "1",
           "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "50",
           "-f", str(out)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(run.stdout[-3000:] + run.stderr[-3000:])
    with out.open() as f:
        return float(next(csv.DictReader(f))["Inferences/Second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    os.sched_setaffinity(0, parse_cpu_list(placement.PLACEMENT.server_cpus, "--server-cpus"))
    settings = [s for s in se.SETTINGS if s.name in SETTINGS]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        se.make_repository(tmp / "repo", settings)
        worker = start_worker(tmp / "repo", cpus=placement.PLACEMENT.server_cpus)
        offline = se.Offline()
        natives: dict[str, NativeServer] = {}
        try:
            for s in settings:
                model = f"tiny_cnn_{s.name}"
                (tmp / s.name).mkdir()
                natives[s.name] = NativeServer(tmp / s.name, model, s.name,
                                               worker.ports["http"],
                                               tmp / "repo" / model / "1" / "model.pt")  # fmt: skip
            legs = ["native", "worker", "native-again"]
            got = {(s.name, leg): [] for s in settings for leg in legs}
            for i in range(args.rounds):
                for s in settings:
                    model = f"tiny_cnn_{s.name}"
                    native = natives[s.name]
                    for leg in legs[i % 3 :] + legs[: i % 3]:
                        if leg == "worker":
                            rate, batch, _ = se.served(worker, s, args.window_ms, tmp / "p.csv")
                        else:
                            samples, batches = native.samples, native.batches
                            rate = drive(model, native.port, s.concurrency, args.window_ms,
                                         tmp / "p.csv")  # fmt: skip
                            batch = (native.samples - samples) / max(native.batches - batches, 1)
                        limit = offline.measure(max(1, round(batch)), args.window_ms / 1000 * 2)
                        got[(s.name, leg)].append((rate, batch, rate / limit))
                    last = {leg: got[(s.name, leg)][-1] for leg in legs}
                    line = ", ".join(
                        f"{leg} {last[leg][0]:.0f} infer/s (batch {last[leg][1]:.1f}, "
                        f"served/offline {last[leg][2]:.3f})" for leg in legs)  # fmt: skip
                    print(f"round {i + 1} {s.name}: {line}", flush=True)
        finally:
            offline.close()
            worker.stop()
    for s in settings:
        rows = {leg: got[(s.name, leg)] for leg in legs}
        ratio = [w[0] / n[0] for w, n in zip(rows["worker"], rows["native"], strict=True)]
        floor = [a[0] / n[0] for a, n in zip(rows["native-again"], rows["native"], strict=True)]
        print(f"{s.name} (c={s.concurrency}): served/offline native "
              f"{spread([r[2] for r in rows['native']])}, worker "
              f"{spread([r[2] for r in rows['worker']])}; worker/native {spread(ratio)}, "
              f"A/A native-again/native {spread(floor)}; infer/s medians native "
              f"{statistics.median(r[0] for r in rows['native']):.0f}, worker "
              f"{statistics.median(r[0] for r in rows['worker']):.0f}")  # fmt: skip
    # the native threads block in C for ever: leave without joining them
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
