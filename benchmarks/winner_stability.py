"""How often each search mode recommends the true best config, and how much its reported winner
throughput moves between repeats (issue 16, item 6).

    .venv/bin/python benchmarks/winner_stability.py --work DIR [--models cost_model,tiny_cnn]
        [--modes quick,optuna,brute] [--repeats 10] [--brute-repeats N] [--reference-rounds 3]
        [--rule kept|current]

Three phases, all resumable from DIR (a finished run is never repeated, so the job can be split
over several sittings; delete DIR to start over):

1. **Searches.** `--repeats` independent `model-analyzer profile` runs per mode and model, each
   with its own seed, export folder and checkpoint, with the product's defaults (adaptive points,
   calibrated final comparison) and the held-out-like caps of issue 16: instances 1..2,
   max_batch_size 1..16, queue delays 0/200/1000 us, concurrency 1..16, HTTP. Modes alternate
   within a repeat (quick, optuna, brute), so the machine's drift falls on all modes alike.
2. **The true best.** Every config any brute run measured, plus every run's winner, is measured
   again at concurrency 16 (the sweep's top: the objective is throughput with no constraint, and a
   closed loop's throughput does not fall with concurrency before saturation), in
   `--reference-rounds` rounds of one profile run each, the configs in a new shuffled order per
   round, each point 3 time windows of 4 s (>= 36 s per config with 3 rounds).
   A config's reference is the mean of its rounds; the true best is the config with the highest.
   Configs whose 95% interval (t, over the rounds) reaches the best's mean are listed as tied.
3. **Report.** Per model and mode: how many runs recommend a config within 5% of the true best by
   the reference (goal >= 9 of 10), and the spread of the winner throughput the runs reported
   (coefficient of variation and (max - min) / median; goal <= 5%), and of the winner's gain
   over the default that each run's final comparison measured side by side (paired rounds, so
   the machine's drift between runs cancels).
4. **perf_analyzer's view** (issue 16's acceptance): the first three quick winners and the
   default config, served by one worker and measured side by side by NVIDIA perf_analyzer in
   `--perf-analyzer-rounds` rotating rounds: are the winners within 5% of each other, and is the
   best of them at least the default?

The runs of 2026-11-24 (tiny_cnn: 1 brute, 10 quick, 10 optuna, the reference) are kept in
benchmarks/results/winner_stability: `--work benchmarks/results/winner_stability` reports them
again, and goes on with what is missing (cost_model, more brute runs) without repeating them.

`--rule current` draws each run's recommendation again from the final rounds its results file
kept, by this tree's rule (the tie rule, the cheapest of the tied): a rule change is seen on the
same runs and the same reference, with no new search.

As BENCHMARKING.md asks, the worker and the load generator run on separate cores (the product's
default placement on this 2-core machine: load generator CPU 0, worker CPU 1).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import placement
from grpc_vs_http import measure, rotating_rounds
from search_efficiency import REPOS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serving import start_worker  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CAPS = ["--run-config-search-max-instance-count", "2", "--run-config-search-max-model-batch-size",
        "16", "--run-config-search-max-concurrency", "16", "--client-protocol", "http"]  # fmt: skip
KEY = ("instance_group", "max_batch_size", "max_queue_delay_us", "preferred_batch_size")
REFERENCE_LOAD = 16
REFERENCE_POINT = ["--measurement-mode", "time_windows", "--measurement-interval", "4000",
                   "--stability-percentage", "100", "--max-trials", "3",
                   "--final-rounds", "0"]  # fmt: skip
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def run_profile(args: list[str], what: str) -> dict:
    run = subprocess.run([sys.executable, "-m", "analyzer", "profile", *args],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    export = Path(args[args.index("--export-path") + 1])
    if run.returncode != 0:
        raise SystemExit(f"{what} failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return json.loads((export / "results" / "profile_results.json").read_text())


def search(model: str, mode: str, seed: int, work: Path) -> dict:
    """One search, summarised to what the report needs (kept in work/runs/*.json)."""
    done = work / "runs" / f"{model}-{mode}-{seed}.json"
    if done.exists():
        return json.loads(done.read_text())
    export = work / "exports" / f"{model}-{mode}-{seed}"
    shutil.rmtree(export, ignore_errors=True)
    document = run_profile(
        ["--model-repository", str(REPOS[model]), "--profile-models", model,
         "--output-model-repository-path", str(export / "out"), "--export-path", str(export),
         "--run-config-search-mode", mode, "--seed", str(seed), *CAPS],
        f"{model} {mode} seed {seed}",
    )  # fmt: skip
    entry = document["models"][0]
    configs = [c for c in entry["configs"] if c["measurements"]]
    best = min(configs, key=lambda c: c["rank"])
    comparison = entry.get("final_comparison") or {}
    summary = {
        "model": model, "mode": mode, "seed": seed,
        "measured": document["stats"]["measured"], "wall_s": document["stats"]["wall_s"],
        "winner": {k: best["description"][k] for k in KEY},
        "winner_name": best["name"],
        "winner_throughput": best["best"]["metrics"]["perf_throughput"],
        "winner_load": best["best"]["value"],
        "rounds_note": comparison.get("rounds_note", ""),
        # the recommendation's gain over the default, measured side by side in the same minutes
        # (paired final rounds): free of the drift between runs that moves raw throughput
        "vs_default": (comparison.get("throughput_vs_default") or {}).get("estimate"),
        "configs": [{"key": {k: c["description"][k] for k in KEY},
                     "config_pbtxt": c["description"]["config_pbtxt"], "name": c["name"],
                     "default": c["name"].endswith("_config_default"),
                     "load": c["best"]["value"]} for c in configs],
    }  # fmt: skip
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(summary, indent=1))
    shutil.copy(export / "results" / "profile_results.json",
                done.with_name(done.stem + ".results.json"))  # the whole run, beside its summary
    shutil.rmtree(export, ignore_errors=True)  # made by this script: the summary is kept
    return summary


def reconcluded(run: dict, work: Path) -> dict:
    """The run with its recommendation drawn again from its own final rounds (kept in
    work/runs/*.results.json) by this tree's rule: what a rule change alone would have
    recommended, with no new measurement."""
    from analyzer.final_comparison import _conclude
    from analyzer.results.outcome import outcome_from_document
    from analyzer.results.ranking import Ranker

    kept = work / "runs" / f"{run['model']}-{run['mode']}-{run['seed']}.results.json"
    model = outcome_from_document(json.loads(kept.read_text())).models[0]
    comparison = model.comparison
    finals = {r.name: r.final for r in model.results if r.final is not None}
    if comparison is None or len(finals) < 2:
        return run
    ranker = Ranker(model.spec.objectives, model.spec.constraints, model.pareto)
    ranker.rank(model.results)
    by_name = {r.name: r for r in model.results}
    _conclude(comparison, ranker, by_name, finals, model.default)
    chosen = by_name[comparison.recommended]
    assert chosen.best is not None
    return {**run, "winner": {k: chosen.description[k] for k in KEY},
            "winner_name": chosen.name, "winner_load": chosen.best.value,
            "winner_throughput": chosen.best.metrics["perf_throughput"],
            "vs_default": comparison.vs_default.estimate if comparison.vs_default else None}


def key_text(key: dict) -> str:
    return (f"{key['instance_group']}, mbs {key['max_batch_size']}, delay "
            f"{key['max_queue_delay_us']} us"
            + (f", preferred {key['preferred_batch_size']}" if key["preferred_batch_size"]
               else ""))  # fmt: skip


def reference(model: str, runs: list[dict], rounds: int, work: Path) -> dict[str, list[float]]:
    """Every config of brute's runs and every winner, measured in shuffled rounds at c=16. The set
    is fixed when the reference is first made (work/reference/MODEL/configs.json); a winner of a
    later run outside it is reported as such (delete that folder to measure a new set)."""
    folder = work / "reference" / model
    listing = folder / "configs.json"
    if not listing.exists():
        configs: dict[str, dict] = {}
        for run in runs:
            for config in run["configs"]:
                if run["mode"] == "brute" or config["key"] == run["winner"]:
                    configs.setdefault(key_text(config["key"]), config)
        folder.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps(dict(sorted(configs.items())), indent=1))
    return measure_rounds(model, folder, rounds, 0)


def contenders(model: str, runs: list[dict], ref: dict[str, list[float]], count: int,
               rounds: int, work: Path) -> dict[str, list[float]]:  # fmt: skip
    """The broad reference's top `count` configs and every run's winner, measured again in
    `rounds` short rounds of their own (one config loaded at a time, shuffled order, the same
    3 x 4-s windows): a round of 8 configs takes 2 minutes where one of all 27 takes 5, so the
    machine drifts less within a round, and the drift between rounds cancels in `paired`."""
    def pick(everything: dict) -> list[str]:
        means = {text: statistics.mean(values) for text, values in ref.items()}
        chosen = sorted(means, key=means.__getitem__, reverse=True)[:count]
        chosen += [key_text(r["winner"]) for r in runs if key_text(r["winner"]) in everything]
        return sorted(set(chosen))

    return subset_rounds(model, work, "contenders", pick, rounds, 1000)


def focus(model: str, texts: list[str], rounds: int, work: Path) -> dict[str, list[float]]:
    """The few configs that decide the count (named as the report names them), in `rounds`
    rounds of their own: a round of 4 takes under a minute, so little drift falls inside it."""
    def pick(everything: dict) -> list[str]:
        unknown = [t for t in texts if t not in everything]
        if unknown:
            raise SystemExit(f"--focus: '{unknown[0]}' is not a reference config")
        return texts

    return subset_rounds(model, work, "focus", pick, rounds, 2000)


def subset_rounds(model: str, work: Path, kind: str, pick: Callable[[dict], list[str]],
                  rounds: int, seed: int) -> dict[str, list[float]]:  # fmt: skip
    """Rounds of the reference's configs that `pick` chooses, fixed when first made
    (work/KIND/MODEL/configs.json)."""
    folder = work / kind / model
    listing = folder / "configs.json"
    if not listing.exists():
        everything = json.loads((work / "reference" / model / "configs.json").read_text())
        chosen = pick(everything)
        folder.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps({t: everything[t] for t in chosen}, indent=1))
    return measure_rounds(model, folder, rounds, seed)


def paired(ref: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each config's rounds as a share of its round's geometric mean over all configs: the
    machine's drift between rounds, shared by every config of a round, cancels."""
    count = min(len(values) for values in ref.values())
    means = [math.exp(statistics.fmean(math.log(v[i]) for v in ref.values()))
             for i in range(count)]  # fmt: skip
    return {text: [v / m for v, m in zip(values, means, strict=False)]
            for text, values in ref.items()}  # fmt: skip


def measure_rounds(model: str, folder: Path, rounds: int, seed: int) -> dict[str, list[float]]:
    """The configs of folder/configs.json measured at c=16 in `rounds` profile runs, each over
    all of them in a new shuffled order (random seed `seed` + the round's number)."""
    configs = json.loads((folder / "configs.json").read_text())
    names = {f"r{i}": text for i, text in enumerate(configs)}
    repo = folder / "repository"
    source = REPOS[model] / model
    # results keep each config.pbtxt, not the model files (results/.gitignore): a clone restages
    model_files = [f.relative_to(source) for f in source.glob("[0-9]*/*")
                   if f.is_file() and not f.name.startswith(".")]  # fmt: skip
    if not all((repo / n / f).is_file() for n in names for f in model_files):
        shutil.rmtree(repo, ignore_errors=True)
        staging = folder / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        for name, text in names.items():
            config = configs[text]
            for version in (p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
                shutil.copytree(version, staging / name / version.name)
            pbtxt = config["config_pbtxt"].replace(f'name: "{config["name"]}"', f'name: "{name}"')
            (staging / name / "config.pbtxt").write_text(pbtxt)
        staging.rename(repo)
    out: dict[str, list[float]] = {text: [] for text in configs}
    for number in range(rounds):
        done = folder / f"round-{number}.json"
        if not done.exists():
            order = list(names)
            random.Random(seed + number).shuffle(order)
            export = folder / f"export-{number}"
            shutil.rmtree(export, ignore_errors=True)
            document = run_profile(
                ["--model-repository", str(repo), "--profile-models", ",".join(order),
                 "--run-config-search-disable", "-c", str(REFERENCE_LOAD), *CAPS[-2:],
                 "--output-model-repository-path", str(export / "out"),
                 "--export-path", str(export), *REFERENCE_POINT],
                f"{model} reference round {number}",
            )  # fmt: skip
            values = {}
            for entry in document["models"]:
                measured = [c for c in entry["configs"] if c["measurements"]]
                if not measured:
                    raise SystemExit(f"{model} reference: {entry['name']} was not measured")
                values[names[entry["name"]]] = measured[0]["best"]["metrics"]["perf_throughput"]
            done.write_text(json.dumps(values, indent=1))
            shutil.rmtree(export, ignore_errors=True)
        for text, value in json.loads(done.read_text()).items():
            out[text].append(value)
    return out


def perf_analyzer_check(model: str, runs: list[dict], rounds: int, work: Path,
                        rule: str = "kept") -> None:  # fmt: skip
    """Issue 16's acceptance: the first three quick searches' winners and the default config,
    served by one worker and measured by NVIDIA perf_analyzer side by side (rotating order, the
    first winner twice for the A/A floor), each at the load its search chose."""
    quick = [r for r in runs if r["mode"] == "quick"][:3]
    if len(quick) < 3 or rounds <= 0:  # --perf-analyzer-rounds 0: no check
        return
    default = next(c for r in runs for c in r["configs"] if c["default"])
    loads = [c["load"] for r in runs for c in r["configs"] if c["default"]]
    entries = {f"q{i}": (next(c for c in r["configs"] if c["key"] == r["winner"]), r["winner_load"])
               for i, r in enumerate(quick)}  # fmt: skip
    entries["default"] = (default, int(statistics.median(loads)))
    repo = work / "perf_analyzer" / model
    shutil.rmtree(repo, ignore_errors=True)
    source = REPOS[model] / model
    for name, (config, _) in entries.items():
        for version in (p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
            shutil.copytree(version, repo / name / version.name)
        (repo / name / "config.pbtxt").write_text(
            config["config_pbtxt"].replace(f'name: "{config["name"]}"', f'name: "{name}"'))
    out = work / "perf_analyzer" / f"{model}.csv"
    legs = [*entries, "q0-again"]
    # the winners differ by rule: each rule's measurement is kept apart
    done = work / "perf_analyzer" / (f"{model}.json" if rule == "kept" else f"{model}-{rule}.json")
    if done.exists():
        got = json.loads(done.read_text())
    else:
        worker = start_worker(repo, cpus=placement.PLACEMENT.server_cpus)
        try:
            got = rotating_rounds(legs, rounds, lambda leg: measure(
                worker.http, leg.split("-")[0], "http", entries[leg.split("-")[0]][1], 3000,
                out)[0])  # fmt: skip
        finally:
            worker.stop()
        done.write_text(json.dumps(got, indent=1))
    med = {leg: statistics.median(values) for leg, values in got.items()}
    winners = [med[f"q{i}"] for i in range(3)]
    print(f"\n## {model}: three quick winners and the default by perf_analyzer, {rounds} rounds "
          "(median infer/s; each at its search's load)")
    for leg in legs:
        config, load = entries[leg.split("-")[0]]
        print(f"    {leg:9s} {med[leg]:7.0f}  ({min(got[leg]):.0f}-{max(got[leg]):.0f})  "
              f"c={load}  {key_text(config['key'])}")
    print(f"  winners within {(max(winners) - min(winners)) / max(winners):.1%} of each other "
          f"(goal <= 5%); best winner / default {max(winners) / med['default']:.3f} (goal >= 1); "
          f"A/A floor {abs(1 - med['q0-again'] / med['q0']):.1%}", flush=True)


def half_width(values: list[float]) -> float:
    if len(values) < 2:
        return float("inf")
    return T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / len(values) ** 0.5


def report(model: str, runs: list[dict], ref: dict[str, list[float]], what: str = "") -> None:
    means = {text: statistics.mean(values) for text, values in ref.items()}
    best_text = max(means, key=means.__getitem__)
    best = means[best_text]
    tied = [t for t in means if t != best_text and means[t] + half_width(ref[t]) >= best]
    ranked = sorted(means, key=means.__getitem__, reverse=True)
    print(f"\n## {model}{what}: true best {best_text} = {best:.4g} "
          f"(+/- {half_width(ref[best_text]) / best:.1%}, {len(ref[best_text])} rounds); "
          f"{len(means)} configs measured; tied within noise: {len(tied)}", flush=True)
    for text in ranked[:8]:
        print(f"    {means[text] / best:6.3f}  {means[text]:7.3f} +/- "
              f"{half_width(ref[text]) / means[text]:5.1%}  {text}")
    print("| mode | runs | within 5% of the true best | points (median) | winner throughput "
          "reported: median | CV | (max-min)/median | winner / default, paired: median (CV) | "
          "winners (reference / best) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ("brute", "quick", "optuna"):
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        missing = [r for r in mine if key_text(r["winner"]) not in means]
        if missing:
            print(f"  {mode}: {len(missing)} winner(s) outside the reference set, e.g. "
                  f"{key_text(missing[0]['winner'])}: delete the reference folder and rerun")
        shares = [means[key_text(r["winner"])] / best for r in mine if r not in missing]
        within = sum(share >= 0.95 for share in shares)
        reported = [r["winner_throughput"] for r in mine]
        med = statistics.median(reported)
        cv = statistics.stdev(reported) / statistics.mean(reported) if len(reported) > 1 else 0
        points = statistics.median(r["measured"] for r in mine)
        gains = [r["vs_default"] for r in mine if r.get("vs_default")]
        gain_cv = (statistics.stdev(gains) / statistics.mean(gains)) if len(gains) > 1 else 0.0
        gain = f"{statistics.median(gains):.3f} (CV {gain_cv:.1%})" if gains else "n/a"
        print(f"| {mode} | {len(mine)} | **{within} of {len(mine)}** | {points:.0f} | {med:.0f} | "
              f"{cv:.1%} | {(max(reported) - min(reported)) / med:.1%} | {gain} | "
              f"{', '.join(f'{s:.2f}' for s in shares)} |", flush=True)


def focus_counts(runs: list[dict], against: dict[str, tuple[float, float, float]]) -> None:
    """Per mode, the winners within 5% of the focus's first config by the focus's estimates, and
    by its intervals: surely (low >= 0.95), possibly (high >= 0.95); winners outside the focus
    are counted apart."""
    for mode in ("brute", "quick", "optuna"):
        mine = [key_text(r["winner"]) for r in runs if r["mode"] == mode]
        if not mine:
            continue
        inside = [t for t in mine if t in against]
        within = sum(against[t][0] >= 0.95 for t in inside)
        surely = sum(against[t][1] >= 0.95 for t in inside)
        possibly = sum(against[t][2] >= 0.95 for t in inside)
        print(f"    {mode}: within 5% by the estimates {within} of {len(mine)} (surely {surely}, "
              f"possibly {possibly}); outside the focus {len(mine) - len(inside)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--models", default="cost_model,tiny_cnn")
    parser.add_argument("--modes", default="quick,optuna,brute")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--brute-repeats", type=int, default=None,
                        help="brute runs (default: --repeats); one is enough to fix the config set")
    parser.add_argument("--reference-rounds", type=int, default=3)
    parser.add_argument("--contenders", type=int, default=0,
                        help="then the reference's top N and every winner in rounds of their own")
    parser.add_argument("--contender-rounds", type=int, default=10)
    parser.add_argument("--focus", default="",
                        help="'|'-separated configs (as reported) measured in rounds of their own")
    parser.add_argument("--focus-rounds", type=int, default=20)
    parser.add_argument("--perf-analyzer-rounds", type=int, default=5,
                        help="0: no perf_analyzer check")
    parser.add_argument("--rule", choices=("kept", "current"), default="kept",
                        help="current: each run's recommendation drawn again from its kept final "
                             "rounds by this tree's rule (to see a rule change without new runs)")
    parser.add_argument("--searches-only", action="store_true",
                        help="run (or finish) the searches and stop before the reference")
    args = parser.parse_args()
    work = args.work.resolve()
    for model in args.models.split(","):
        if model not in REPOS:
            raise SystemExit(f"--models: '{model}' is not one of {', '.join(REPOS)}")
        runs = []
        for seed in range(args.repeats):
            for mode in args.modes.split(","):
                if mode == "brute" and seed >= (args.brute_repeats or args.repeats):
                    continue
                run = search(model, mode, seed, work)
                if args.rule == "current":
                    run = reconcluded(run, work)
                runs.append(run)
                print(f"{model} {mode} seed {seed}: {run['measured']} points, "
                      f"{run['wall_s']:.0f} s, winner {key_text(run['winner'])} at "
                      f"c={run['winner_load']}, {run['winner_throughput']:.0f} infer/s",
                      flush=True)  # fmt: skip
        if args.searches_only:
            continue
        ref = reference(model, runs, args.reference_rounds, work)
        report(model, runs, ref, f" (all configs, {args.reference_rounds} rounds, infer/s)")
        report(model, runs, paired(ref), " (all configs, paired by round: share of the round)")
        if args.contenders:
            top = contenders(model, runs, ref, args.contenders, args.contender_rounds, work)
            report(model, runs, paired(top), f" (contenders, {args.contender_rounds} rounds of "
                                             "their own, paired by round)")  # fmt: skip
        if args.focus:
            few = focus(model, args.focus.split("|"), args.focus_rounds, work)
            print(f"\n## {model}, the focus: {args.focus_rounds} rounds of "
                  f"{len(few)} configs, paired by round; each / the first (median, range)")
            first = args.focus.split("|")[0]
            share = paired(few)
            against: dict[str, tuple[float, float, float]] = {}  # mean, low, high / the first
            for text in few:
                ratios = sorted(a / b for a, b in zip(share[text], share[first], strict=False))
                interval = half_width([math.log(r) for r in ratios])
                mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
                against[text] = (mean, mean * math.exp(-interval), mean * math.exp(interval))
                print(f"    {mean:6.3f} (95% CI {mean * math.exp(-interval):.3f}-"
                      f"{mean * math.exp(interval):.3f}; median {statistics.median(ratios):.3f})"
                      f"  {text}", flush=True)  # fmt: skip
            focus_counts(runs, against)
        perf_analyzer_check(model, runs, args.perf_analyzer_rounds, work, args.rule)
    return 0


if __name__ == "__main__":
    sys.exit(main())
