"""`make demo`: profile the bundled examples with a capped search, then serve a winner.

This is the main job end to end: `model-analyzer profile` searches instance count, max batch size
and dynamic-batching queue delay for the example models over a concurrency sweep -- tiny_cnn,
add_sub, and the `classifier` ensemble (python preprocessing, then tiny_cnn), whose composing
models are searched together -- ranks the configs and writes them to ./output_models; the demo
then serves the TorchScript winner and the ensemble's winner (with its composing variants) from
there with `model-analyzer serve` and runs one inference on each with NVIDIA's tritonclient.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from serving import EXAMPLES, start_worker  # noqa: E402

OUT = ROOT / "output_models"
EXPORT = ROOT / "results" / "demo"
COMMAND = [
    "model-analyzer", "profile",
    "--model-repository", str(EXAMPLES.relative_to(ROOT)),
    "--profile-models", "tiny_cnn,add_sub,classifier",
    "--output-model-repository-path", str(OUT.relative_to(ROOT)),
    "--export-path", str(EXPORT.relative_to(ROOT)),
    "--override-output-model-repository",
    "--run-config-search-max-concurrency", "4",
    "--run-config-search-max-model-batch-size", "4",
    "--run-config-search-max-instance-count", "2",
    "--measurement-interval", "500",
]  # fmt: skip

console = Console(highlight=False)


def main() -> int:
    console.print("[bold]$ " + " ".join(COMMAND) + "[/]")
    cmd = [sys.executable, "-m", "analyzer", *COMMAND[1:]]
    env = dict(os.environ)
    if not sys.stdout.isatty():
        env.setdefault("COLUMNS", "120")  # logs: room for the ranked table
    run = subprocess.run(cmd, cwd=ROOT, env=env)
    if run.returncode != 0:
        return run.returncode
    document = json.loads((EXPORT / "results" / "profile_results.json").read_text())
    winners = {m["name"]: m["top"][0] for m in document["models"] if m["top"]}
    winner, pipeline = winners["tiny_cnn"], winners["classifier"]
    console.print(f"\n[bold]Serving the winners {winner} and {pipeline} (with its composing "
                  f"models) from {OUT.relative_to(ROOT)}[/]")
    served = start_worker(OUT, "--model-control-mode", "explicit", "--load-model", winner,
                          "--load-model", pipeline)  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(served.http)
        rng = np.random.default_rng(0)
        for model, name, x, datatype, output in (
            (winner, "INPUT__0", rng.standard_normal((1, 3, 32, 32)).astype(np.float32),
             "FP32", "OUTPUT__0"),
            (pipeline, "IMAGE", rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8), "UINT8",
             "SCORES"),
        ):  # fmt: skip
            inp = httpclient.InferInput(name, list(x.shape), datatype)
            inp.set_data_from_numpy(x)
            scores = client.infer(model, [inp]).as_numpy(output)
            console.print(f"{model} answered tritonclient: class scores {np.round(scores[0], 3)}")
        client.close()
    finally:
        served.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
