"""Do the final comparison's short rounds order configs as long windows do? (issue 16)

In the winner-stability runs of 2026-11-26 the final rounds put tiny_cnn's max-batch-16 configs
up to 9% behind max-batch-8 configs that the reference put level. A final round is one fixed
0.3-s window after a 75-ms warm-up, with the finalists loaded side by side in one worker and one
load generator switching between them. The reference uses 4-s windows, one config at a time.
This script serves the same four configs side by side in one worker, as the final comparison
does. It measures them at c=16 in interleaved rounds, each round twice: the round's kind of
window first (warm-up 75 ms, 0.3 s), then a long one (warm-up 1 s, 4 s). It reports each config
against the mean of the max-batch-8 ones, in both kinds of window.

    .venv/bin/python benchmarks/round_windows.py [--rounds 6] [--short-ms 300] [--long-ms 4000]
        [--configs mbs16_d0,mbs16_d200,mbs8_d0,mbs8_d1000] [--kinds NAME:WARMUP_MS:WINDOW_MS,...]

`--configs` names each served config as mbs<max batch>_d<queue delay us>; the ratios are to the
mean of the configs named in `--baseline` (default: the max-batch-8 ones). `--kinds` replaces
the two kinds of window (short:75:300 and long:1000:4000; `--short-ms`/`--long-ms` set theirs).
`--alone`: the worker in explicit model control, and each measurement loads its config fresh
with no other loaded, as the reference of winner_stability.py serves them (the side-by-side
kinds are measured too, so each round has both).

Worker on core 1, load generator on core 0 (BENCHMARKING.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import placement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serving import start_worker  # noqa: E402

from analyzer.loadgen.client import LoadClient  # noqa: E402
from analyzer.loadgen.control import control_client  # noqa: E402
from analyzer.loadgen.inputs import model_io  # noqa: E402
from analyzer.loadgen.measure import Measurer  # noqa: E402
from analyzer.loadgen.perf import PerfOptions, encode  # noqa: E402
from analyzer.loadgen.point import MeasureSettings  # noqa: E402

CONCURRENCY = 16


def parse_configs(text: str) -> dict[str, tuple[int, int]]:
    """"mbs16_d200,..." -> name -> (max_batch_size, max_queue_delay_microseconds)."""
    out = {}
    for name in text.split(","):
        mbs, delay = name.removeprefix("mbs").split("_d")
        out[name] = (int(mbs), int(delay))
    return out


def make_repository(root: Path, configs: dict[str, tuple[int, int]]) -> None:
    base = (placement.EXAMPLES / "tiny_cnn" / "config.pbtxt").read_text()
    for name, (mbs, delay) in configs.items():
        folder = root / name
        (folder / "1").mkdir(parents=True)
        os.link(placement.EXAMPLES / "tiny_cnn" / "1" / "model.pt", folder / "1" / "model.pt")
        config = base.replace('name: "tiny_cnn"', f'name: "{name}"')
        config = config.replace("max_batch_size: 32", f"max_batch_size: {mbs}")
        config += f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}\n"
        (folder / "config.pbtxt").write_text(placement.placed_config(config))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--short-ms", type=int, default=300)
    parser.add_argument("--long-ms", type=int, default=4000)
    parser.add_argument("--kinds", default="")
    parser.add_argument("--alone", action="store_true")
    parser.add_argument("--configs", default="mbs16_d0,mbs16_d200,mbs8_d0,mbs8_d1000")
    parser.add_argument("--baseline", default="mbs8_d0,mbs8_d1000")
    placement.add_arguments(parser)
    args = parser.parse_args()
    configs = parse_configs(args.configs)
    baseline = args.baseline.split(",")
    where = placement.apply(args)
    os.sched_setaffinity(0, {int(c) for c in where.client_cpus.split(",")})
    root = Path(tempfile.mkdtemp(prefix="round-windows-"))
    make_repository(root, configs)
    worker = start_worker(root, "--model-control-mode", "explicit", "--load-model", "*",
                          cpus=where.server_cpus)  # fmt: skip
    kinds = {
        "short": MeasureSettings(mode="fixed", window_ms=args.short_ms,
                                 min_window_ms=args.short_ms, warmup_ms=75),
        "long": MeasureSettings(mode="fixed", window_ms=args.long_ms,
                                min_window_ms=args.long_ms, warmup_ms=1000),
    }  # fmt: skip
    if args.kinds:
        kinds = {}
        for kind in args.kinds.split(","):
            label, warmup, window = kind.split(":")
            kinds[label] = MeasureSettings(mode="fixed", window_ms=int(window),
                                           min_window_ms=int(window), warmup_ms=int(warmup))
    fresh = {f"alone-{k}": v for k, v in kinds.items()} if args.alone else {}
    got: dict[str, dict[str, list[float]]] = {k: {n: [] for n in configs}
                                              for k in [*kinds, *fresh]}  # fmt: skip
    client: LoadClient | None = None
    try:
        payloads = {}
        for name in configs:
            options = PerfOptions(model=name, url=worker.http, protocol="http")
            control = control_client("http", worker.http, name)
            io = model_io(control.model_metadata(), control.model_config())
            payloads[name] = (encode(options, io, None, None)[0], control)
        names = list(configs)
        for index in range(args.rounds):
            order = names[index % len(names):] + names[: index % len(names)]
            for kind, settings in [*kinds.items(), *fresh.items()]:
                alone = kind in fresh
                if alone:  # one config at a time from here on in this round
                    for other in names:
                        payloads[other][1].unload_model(other)
                for name in order:
                    data, control = payloads[name]
                    if alone:
                        control.load_model(name)
                    if client is None:
                        client = LoadClient("http", worker.http, data, 1, 0)
                        client.start()
                    else:
                        client.set_payloads(data, None, None)
                    point = Measurer(client, control, name, "", 1, settings).measure(
                        "concurrency", CONCURRENCY)
                    got[kind][name].append(point.throughput)
                    if alone:
                        control.unload_model(name)
                if alone:
                    for other in names:
                        payloads[other][1].load_model(other)
            line = ", ".join(f"{k} {n} {got[k][n][-1]:.0f}" for k in got for n in names)
            print(f"round {index + 1}: {line}", flush=True)
    finally:
        if client is not None:
            client.close()
        worker.stop()
    print(f"\ntiny_cnn at c={CONCURRENCY}, {args.rounds} rounds, configs loaded side by side; "
          f"each config / the mean of {', '.join(baseline)} in the same round (median, range):")
    for kind in got:
        cells = []
        for name in names:
            ratios = sorted(
                got[kind][name][i] / statistics.fmean(got[kind][b][i] for b in baseline)
                for i in range(args.rounds))  # fmt: skip
            cells.append(f"{name} {statistics.median(ratios):.3f} ({ratios[0]:.3f}-"
                         f"{ratios[-1]:.3f}), {statistics.median(got[kind][name]):.0f}/s")
        print(f"  {kind:11s} windows: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
