"""`make demo`: serve the bundled examples, run inferences through both protocols, print results.

Until `model-analyzer profile` lands, this is the main job end to end: a real worker process, the
real Triton clients, and the worker's own statistics for what happened server-side.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serving import EXAMPLES, start_worker  # noqa: E402

console = Console()


def add_sub(client_module, client) -> np.ndarray:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    inputs = [client_module.InferInput(n, [2, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    return result.as_numpy("OUTPUT0")


def tiny_cnn_load(address: str, seconds: float = 3.0, concurrency: int = 8) -> float:
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)

    def loop() -> int:
        client = httpclient.InferenceServerClient(address)
        inp = httpclient.InferInput("INPUT__0", [1, 3, 32, 32], "FP32")
        inp.set_data_from_numpy(x)
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            client.infer("tiny_cnn", [inp])
            n += 1
        client.close()
        return n

    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(lambda _: loop(), range(concurrency)))
    return total / seconds


def main() -> int:
    console.print(f"[bold]Serving[/] {EXAMPLES}")
    served = start_worker(EXAMPLES)
    try:
        console.print(served.output[-1].strip(), markup=False)
        http = httpclient.InferenceServerClient(served.http)
        grpc = grpcclient.InferenceServerClient(served.grpc)
        console.print("add_sub over HTTP:", add_sub(httpclient, http).tolist())
        console.print("add_sub over gRPC:", add_sub(grpcclient, grpc).tolist())
        rate = tiny_cnn_load(served.http)
        console.print(f"tiny_cnn, 8 concurrent HTTP clients for 3 s: {rate:.0f} infer/s")
        table = Table(title="Server-side statistics")
        for col in ("model", "requests", "executions", "avg queue µs", "avg compute µs"):
            table.add_column(col, justify="right")
        for stat in http.get_inference_statistics()["model_stats"]:
            s = stat["inference_stats"]
            n = max(s["success"]["count"], 1)
            table.add_row(
                stat["name"],
                str(s["success"]["count"]),
                str(stat["execution_count"]),
                f"{s['queue']['ns'] / n / 1000:.0f}",
                f"{s['compute_infer']['ns'] / n / 1000:.0f}",
            )
        console.print(table)
        http.close()
        grpc.close()
    finally:
        served.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
