"""Two `model-analyzer profile` processes sharing one Optuna study in PostgreSQL, as two hosts
would: they divide the points, a killed one loses nothing it finished, and one report shows all."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
from postgres import postgres_server
from test_profile import EXAMPLES, FAST, profile, results, workers_serving

STUDY = "shared-add_sub"


def _args(url: str, trials: int = 10) -> list[str]:
    return [
        "--model-repository", str(EXAMPLES), "--profile-models", "add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP",
        "--run-config-search-mode", "optuna", "--storage", url, "--study-name", STUDY,
        "--run-config-search-max-concurrency", "4", "--run-config-search-max-model-batch-size",
        "2", "--run-config-search-max-instance-count", "2", "--optuna-min-trials", str(trials - 2),
        "--optuna-max-trials", str(trials), "--max-percentage-of-search-space", "100",
        "--num-configs-per-model", "1", "--client-protocol", "http", *FAST,
    ]  # fmt: skip


def _ledger(url: str) -> list[optuna.trial.FrozenTrial]:
    try:
        study = optuna.load_study(study_name=f"{STUDY}:points", storage=url)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False)


def _finished(url: str, pid: int | None = None) -> list[str]:
    owner = f"{socket.gethostname()}:{pid}"
    return [t.user_attrs["point"] for t in _ledger(url)
            if t.state.name == "COMPLETE" and (pid is None or t.user_attrs["host"] == owner)]


def _checkpointed(folder: Path) -> int:
    path = folder / "EXP" / "checkpoints" / "profile.ckpt.jsonl"
    return path.read_text().count('"type": "point"') if path.exists() else 0


def test_two_processes_share_a_postgresql_study_and_one_report_shows_all(tmp_path):
    with postgres_server() as url:
        hosts = {name: tmp_path / name for name in ("a", "b")}  # separate folders, as two hosts
        for folder in hosts.values():
            folder.mkdir()
        command = [sys.executable, "-m", "analyzer", "profile", *_args(url)]
        env = {**os.environ, "COLUMNS": "160"}
        a = subprocess.Popen(command, cwd=hosts["a"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
        b = subprocess.Popen(command, cwd=hosts["b"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while len(_finished(url, a.pid)) < 2:  # kill a mid-run, after two finished points
                assert a.poll() is None, "a ended before it could be killed"
                assert time.monotonic() < deadline, "a finished no points in 300 s"
                time.sleep(0.1)
            a.send_signal(signal.SIGKILL)
            a.wait(30)
            by_a = set(_finished(url, a.pid))
            output, _ = b.communicate(timeout=600)
        finally:
            for process in (a, b):
                if process.poll() is None:
                    process.kill()
                    process.wait(30)
        assert b.returncode == 0, output
        for _ in range(100):
            if not workers_serving(hosts["a"] / "OUT"):
                break
            time.sleep(0.1)
        assert not workers_serving(hosts["a"] / "OUT")

        # a's finished points are in the study, and b took them into its results
        assert by_a <= set(_finished(url))
        document = results(hosts["b"] / "EXP")
        points = [m for c in document["models"][0]["configs"] for m in c["measurements"]]
        assert document["stats"]["shared"] >= len(by_a) >= 2
        assert len({m["host"] for m in points}) == 2

        # a again, with a larger budget: it resumes, and measures only what nobody finished. The
        # budget counts the study's distinct points (a re-proposed point is told again but uses
        # none); whether any is left to measure depends on what the sweeps of the first runs
        # covered of this 12-point space, so the rerun's own work is asserted, not its count.
        study = optuna.load_study(study_name=STUDY, storage=url)
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        trials = len({t.user_attrs.get("point", t.number) for t in done}) + 2
        rerun = profile(hosts["a"], *_args(url, trials))
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        finished = _finished(url)
        assert len(finished) == len(set(finished))  # no point measured twice
        measured = _checkpointed(hosts["a"]) + _checkpointed(hosts["b"])
        assert measured == len(finished)  # every measurement taken is one finished point
        stats = results(hosts["a"] / "EXP")["stats"]
        assert stats["reused"] + stats["shared"] >= 1  # its baseline, finished, was not remeasured

        # one report, from b's folder (b ended first), shows every process's points. Whether a's
        # rerun added any depends on the space; so one of a's first points is also taken out of
        # b's results, as if b had ended before a finished it: the report must bring it back.
        path = hosts["b"] / "EXP" / "results" / "profile_results.json"
        document = json.loads(path.read_text())
        b_host = f"{socket.gethostname()}:{b.pid}"
        config = next(c for c in document["models"][0]["configs"]
                      if any(m["host"] != b_host for m in c["measurements"]))  # fmt: skip
        config["measurements"] = [m for m in config["measurements"] if m["host"] == b_host]
        path.write_text(json.dumps(document))
        report = subprocess.run([sys.executable, "-m", "analyzer", "report", "-e", "EXP"],
                                cwd=hosts["b"], capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        assert report.returncode == 0, report.stdout + report.stderr
        assert "merged into the results" in report.stdout
        document = results(hosts["b"] / "EXP")
        points = [m for c in document["models"][0]["configs"] for m in c["measurements"]]
        assert len(points) == len(finished)
        page = (hosts["b"] / "EXP" / "reports" / "summaries" / "add_sub" /
                "result_summary.html").read_text()  # fmt: skip
        assert len(json.dumps(document)) > 0 and "add_sub" in page
        rows = (hosts["b"] / "EXP" / "results" / "metrics-model-inference.csv").read_text()
        assert len(rows.strip().splitlines()) == 1 + len(finished)
