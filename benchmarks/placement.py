"""Where a benchmark's server and client run: their cores, and whether tiny_cnn runs on the GPU.

On a CPU machine the server and the load generator get one core each (../shared/BENCHMARKING.md):
server on core 1, client on core 0. On a GPU machine `--gpu` puts tiny_cnn's instances on the
GPU (KIND_GPU; the offline limit runs on cuda too, inputs copied from host memory each call as a
served request's are), and `--server-cpus`/`--client-cpus` give both sides more cores.
`PERF_ANALYZER` names another perf_analyzer than the venv's (a machine without our venv).
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"


@dataclass
class Placement:
    server_cpus: str = "1"
    client_cpus: str = "0"
    gpu: bool = False

    @property
    def torch_device(self) -> str:
        return "cuda" if self.gpu else "cpu"


PLACEMENT = Placement()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-cpus", default="1", help="taskset list for the server(s)")
    parser.add_argument("--client-cpus", default="0", help="taskset list for perf_analyzer")
    parser.add_argument("--gpu", action="store_true",
                        help="tiny_cnn on KIND_GPU and the offline limit on cuda")  # fmt: skip


def apply(args: argparse.Namespace) -> Placement:
    PLACEMENT.server_cpus, PLACEMENT.client_cpus = args.server_cpus, args.client_cpus
    PLACEMENT.gpu = args.gpu
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu: torch sees no CUDA device on this machine")
    return PLACEMENT


def perf_analyzer() -> Path:
    return Path(os.environ.get("PERF_ANALYZER") or ROOT / ".venv" / "bin" / "perf_analyzer")


def placed_config(text: str) -> str:
    """tiny_cnn's config.pbtxt with its instances where the placement says."""
    return text.replace("KIND_CPU", "KIND_GPU") if PLACEMENT.gpu else text


def examples(tmp: Path) -> Path:
    """The bundled repository, or a copy of it whose tiny_cnn runs on the GPU."""
    if not PLACEMENT.gpu:
        return EXAMPLES
    copy = tmp / "examples"
    shutil.copytree(EXAMPLES, copy)
    config = copy / "tiny_cnn" / "config.pbtxt"
    config.write_text(placed_config(config.read_text()))
    return copy
