"""`make demo`: profile the bundled examples with a capped search, then serve a winner.

This is the main job end to end: `model-analyzer profile` searches instance count, max batch size
and dynamic-batching queue delay for both example models over a concurrency sweep, ranks the
configs and writes them to ./output_models; the demo then serves the TorchScript winner from
there with `model-analyzer serve` and runs one inference on it with NVIDIA's tritonclient.
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
    "--profile-models", "tiny_cnn,add_sub",
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
    tiny = next(m for m in document["models"] if m["name"] == "tiny_cnn")
    winner = tiny["top"][0]
    console.print(f"\n[bold]Serving the winner {winner} from {OUT.relative_to(ROOT)}[/]")
    served = start_worker(OUT, "--model-control-mode", "explicit", "--load-model", winner)
    try:
        client = httpclient.InferenceServerClient(served.http)
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        scores = client.infer(winner, [inp]).as_numpy("OUTPUT__0")
        console.print(f"{winner} answered tritonclient: class scores {np.round(scores[0], 3)}")
        client.close()
    finally:
        served.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
