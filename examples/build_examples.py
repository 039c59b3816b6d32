"""Build the generated files of the example model repository (they are not committed).

    python examples/build_examples.py [--repository DIR] [--measure]

`tiny_cnn/1/model.pt` is a small TorchScript CNN with deterministic weights (seed 0): heavy
enough that its compute dominates a serving framework's per-request overhead, cheap enough for
fast tests. A stamp file holds a hash of this script's recipe, so reruns are instant until the
recipe changes. `build_onnx_add_mul` writes a tiny ONNX model for tests of the onnx backend.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import time
from pathlib import Path

import torch
from torch import nn

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
TINY_CNN_INPUT_SHAPE = (3, 32, 32)
RECIPE_VERSION = "1"


class TinyCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(128, 128, 3, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def build_tiny_cnn() -> torch.jit.ScriptModule:
    """The example's module, built in-process exactly as model.pt was (for comparisons)."""
    torch.manual_seed(0)
    return torch.jit.script(TinyCnn().eval())


def _stamp() -> str:
    recipe = inspect.getsource(TinyCnn) + inspect.getsource(build_tiny_cnn) + RECIPE_VERSION
    return hashlib.sha256((recipe + torch.__version__).encode()).hexdigest()[:16]


def build(repository: Path = REPOSITORY) -> bool:
    """Write tiny_cnn/1/model.pt unless it is up to date; True when it was (re)built."""
    target = repository / "tiny_cnn" / "1" / "model.pt"
    stamp = target.with_name(".model.pt.stamp")
    if target.exists() and stamp.exists() and stamp.read_text() == _stamp():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    build_tiny_cnn().save(str(target))
    stamp.write_text(_stamp())
    return True


def build_onnx_add_mul(path: Path) -> Path:
    """INPUT0, INPUT1 float [batch, 4] -> OUTPUT0 = sum, OUTPUT1 = product."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name: str):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Mul", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_mul",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def measure() -> None:
    """Per-sample cost of tiny_cnn on one torch thread, in-process."""
    torch.set_num_threads(1)
    module = build_tiny_cnn()
    with torch.inference_mode():
        for batch in (1, 8, 32):
            x = torch.randn(batch, *TINY_CNN_INPUT_SHAPE)
            for _ in range(5):
                module(x)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 2:
                module(x)
                n += 1
            per_sample = (time.perf_counter() - t0) / (n * batch)
            print(f"batch {batch:>2}: {per_sample * 1e3:.3f} ms/sample, {1 / per_sample:.0f}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=REPOSITORY)
    parser.add_argument("--measure", action="store_true", help="print tiny_cnn's in-process cost")
    args = parser.parse_args()
    built = build(args.repository)
    print(f"tiny_cnn/1/model.pt {'built' if built else 'up to date'} in {args.repository}")
    if args.measure:
        measure()


if __name__ == "__main__":
    main()
