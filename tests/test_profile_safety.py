"""The profiler's files and secrets (issue 12): only a folder it made is ever deleted, never one
that overlaps the user's; one run per output folder; results written whole; a storage password in
no file, console line or argv."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from postgres import postgres_server
from test_profile import EXAMPLES, FAST, profile, results

from analyzer.commands.profile import _hide
from analyzer.fsutil import LOCK, MARKER, atomic_write_bytes, atomic_write_text
from analyzer.search.ledger import redact_url, url_secrets

# add_sub, concurrency 1, small caps: the shortest real search
SEARCH = [
    "--model-repository", str(EXAMPLES), "--profile-models", "add_sub", "-c", "1",
    "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
    "1", "--client-protocol", "http", "--export-path", "EXP", *FAST,
]  # fmt: skip
QUICK = [*SEARCH, "--run-config-search-disable"]  # its own config only: the shortest real run


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` with a digest of its content: equal snapshots, equal trees."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def user_folder(path: Path) -> dict[str, str]:
    """A folder of the user's: files at two levels, one read-only."""
    (path / "notes").mkdir(parents=True)
    (path / "model.onnx").write_bytes(os.urandom(2048))
    (path / "notes" / "todo.txt").write_text("keep me\n")
    (path / "notes" / "todo.txt").chmod(0o444)
    return snapshot(path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def one_line(run: subprocess.CompletedProcess) -> str:
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stdout + run.stderr
    return lines[0]


# ---- --override-output-model-repository --------------------------------------------------------
def test_override_keeps_every_file_of_a_folder_it_did_not_create(tmp_path):
    before = user_folder(tmp_path / "OUT")
    for override in ([], ["--override-output-model-repository"]):
        run = profile(tmp_path, *QUICK, "--output-model-repository-path", "OUT", *override,
                      timeout=120)  # fmt: skip
        line = one_line(run)
        assert f"'{tmp_path / 'OUT'}'" in line
        assert "was not created by model-analyzer" in line and "every file in it is kept" in line
        assert snapshot(tmp_path / "OUT") == before  # not even a marker or a lock file added


def test_override_replaces_a_folder_it_made_and_an_empty_folder_becomes_its_own(tmp_path):
    (tmp_path / "OUT").mkdir()  # empty: safe to use
    run = profile(tmp_path, *QUICK, "--output-model-repository-path", "OUT", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "OUT"
    assert "model-analyzer" in (out / MARKER).read_text()
    (out / "add_sub_config_7").mkdir()  # left over from an older run
    (out / "add_sub_config_7" / "config.pbtxt").write_text('name: "add_sub_config_7"\n')

    again = profile(tmp_path, *QUICK, "--output-model-repository-path", "OUT", "-e", "EXP2",
                    timeout=120)  # another run (not a resume of the first)  # fmt: skip
    assert "already exists; pass --override-output-model-repository" in one_line(again)
    assert (out / "add_sub_config_7").exists()

    run = profile(tmp_path, *QUICK, "--output-model-repository-path", "OUT",
                  "--override-output-model-repository", timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (out / "add_sub_config_7").exists()
    assert (out / "add_sub_config_default" / "config.pbtxt").exists()
    assert (out / MARKER).exists()


# ---- folders that overlap ----------------------------------------------------------------------
OVERLAPS = {  # output path (from the working directory A/WORK), export path, the refusal
    "repository": ("{repo}", "EXP", "is the model repository"),
    "inside the repository": ("{repo}/add_sub", "EXP", "lies inside the model repository"),
    "a symlink to the repository": ("LINK", "EXP", "is the model repository"),
    "the results folder": ("EXP/results", "EXP", "is the results folder"),
    "in checkpoints": ("EXP/checkpoints/models", "EXP", "lies inside the checkpoint folder"),
    "the working directory": (".", "EXP", "is the working directory"),
    "a parent of it": ("..", "{tmp}/EXP2", "contains the working directory"),
    "home": ("{home}", "{tmp}/EXP2", "is the home folder"),
    "root": ("/", "{tmp}/EXP2", "is the root folder"),
}


@pytest.mark.parametrize("case", list(OVERLAPS))
def test_an_output_folder_that_overlaps_is_refused_and_nothing_is_deleted(tmp_path, case):
    repo, work, home = tmp_path / "REPO", tmp_path / "A" / "WORK", tmp_path / "HOME"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    (work / "EXP" / "results").mkdir(parents=True)
    (work / "EXP" / "results" / "profile_results.json").write_text("{}")
    (work / "EXP" / "checkpoints" / "models").mkdir(parents=True)
    (work / "LINK").symlink_to(repo)
    user_folder(home)
    names = {"repo": repo, "home": home, "tmp": tmp_path}
    output, export, needle = (text.format(**names) for text in OVERLAPS[case])
    before = [snapshot(folder) for folder in (repo, tmp_path / "A", home)]
    args = [a if a != str(EXAMPLES) else str(repo) for a in QUICK]
    caches = tmp_path / "caches"  # matplotlib and fontconfig write theirs under HOME otherwise
    run = subprocess.run(
        [sys.executable, "-m", "analyzer", "profile", *args, "--export-path", export,
         "--output-model-repository-path", output, "--override-output-model-repository"],
        cwd=work, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(home), "COLUMNS": "160", "MPLCONFIGDIR": str(caches),
             "XDG_CACHE_HOME": str(caches), "XDG_CONFIG_HOME": str(caches)},
    )  # fmt: skip
    line = one_line(run)
    assert f"output_model_repository_path '{(work / output).resolve()}' {needle}" in line, line
    assert [snapshot(folder) for folder in (repo, tmp_path / "A", home)] == before


def test_an_export_path_inside_the_model_repository_is_refused(tmp_path):
    repo = tmp_path / "REPO"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    before = snapshot(repo)
    args = [a if a != str(EXAMPLES) else str(repo) for a in QUICK]
    run = profile(tmp_path, *args, "-e", str(repo / "exports"), "--output-model-repository-path",
                  "OUT", timeout=120)  # fmt: skip
    line = one_line(run)
    assert f"export_path '{repo / 'exports'}' lies inside the model repository" in line
    assert snapshot(repo) == before and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize(("where", "needle"), [
    ("OUT/worker.log", "lies inside the output model repository"),
    ("{repo}/add_sub/worker.log", "lies inside the model repository"),
    ("LOGS", "is a folder"),
])  # fmt: skip
def test_a_worker_log_where_it_would_be_lost_or_clutter_the_models_is_refused(tmp_path, where,
                                                                               needle):
    repo = tmp_path / "REPO"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    (tmp_path / "LOGS").mkdir()
    before = snapshot(repo)
    args = [a if a != str(EXAMPLES) else str(repo) for a in QUICK]
    run = profile(tmp_path, *args, "--output-model-repository-path", "OUT",
                  "--triton-output-path", where.format(repo=repo), timeout=120)  # fmt: skip
    line = one_line(run)
    assert "triton_output_path" in line and needle in line, line
    assert snapshot(repo) == before and not (tmp_path / "OUT").exists()


# ---- one run per output folder -----------------------------------------------------------------
def test_a_second_run_on_a_locked_output_folder_is_refused(tmp_path):
    out = tmp_path / "OUT"
    out.mkdir()
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running profile holds it
        run = profile(tmp_path, *QUICK, "--output-model-repository-path", "OUT",
                      "--override-output-model-repository", timeout=120)  # fmt: skip
        line = one_line(run)
        assert f"output model repository '{out}' is in use by another model-analyzer run" in line
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing written into it
    finally:
        os.close(fd)


# ---- atomic files ------------------------------------------------------------------------------
def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "profile_results.json"
    atomic_write_text(path, "old\n")
    atomic_write_bytes(path, b"new\n")
    assert path.read_bytes() == b"new\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path):
    """A real failure mid-write: the file-size limit is hit after the first megabyte."""
    path = tmp_path / "metrics-model-inference.csv"
    atomic_write_text(path, "Model,Batch\nadd_sub,1\n")
    script = (
        "import resource, signal, sys\n"
        "from analyzer.fsutil import atomic_write_bytes\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    atomic_write_bytes(sys.argv[1], b'x' * (8 << 20))\n"
        "except OSError as err:\n"
        "    print(err.errno)\n"
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parent.parent)  # fmt: skip
    assert done.stdout.strip() == "27", done.stdout + done.stderr  # EFBIG, raised mid-write
    assert path.read_text() == "Model,Batch\nadd_sub,1\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


# ---- secrets -----------------------------------------------------------------------------------
def test_redact_url_hides_every_form_of_password():
    cases = {
        "postgresql://u:secret@h:5/db": "postgresql://u:***@h:5/db",
        "postgresql+psycopg2://u@h/db?password=secret": "postgresql+psycopg2://u@h/db?password=***",
        "postgresql://u:se%40cret@h/db?sslmode=require": "postgresql://u:***@h/db?sslmode=require",
        "postgresql://u:sec@ret@h/db": "postgresql://u:***@h/db",  # an unquoted @
        "not a url; password=secret": "not a url; password=***",
        "sqlite:////tmp/optuna.db": "sqlite:////tmp/optuna.db",
    }
    for url, shown in cases.items():
        assert redact_url(url) == shown
        assert "secret" not in redact_url(url) and "se@cret" not in redact_url(url)
    assert "se@cret" in url_secrets("postgresql://u:se%40cret@h/db")


def test_secrets_are_scrubbed_from_console_and_log_handlers(capsys):
    logger = logging.getLogger("test_profile_safety.driver")
    handler = logging.StreamHandler(sys.stderr)  # as optuna's, made before the run
    logger.addHandler(handler)
    try:
        with _hide(url_secrets("postgresql://u:secret@h/db")):
            print("connecting with secret")
            logger.warning("driver said: password 'secret' refused")
            sys.stderr.write("traceback ... secret\n")
        assert handler.stream is sys.stderr  # given back after the run
    finally:
        logger.removeHandler(handler)
    out, err = capsys.readouterr()
    assert "secret" not in out + err
    assert "connecting with ***" in out and "password '***' refused" in err


def _no_secret_anywhere(tmp_path: Path, *texts: str) -> None:
    for text in texts:
        assert "secret" not in text, text
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"secret" not in path.read_bytes(), path


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2://u:secret@127.0.0.1:{port}/db",
        "postgresql+psycopg2://u@127.0.0.1:{port}/db?password=secret",
        "postgresql://u:secret@127.0.0.1:{port}/db",  # SQLAlchemy 2.1's default driver: psycopg
    ],
)
def test_an_unreachable_storage_shows_no_password(tmp_path, url):
    url = url.format(port=closed_port())
    run = profile(tmp_path, *SEARCH, "--output-model-repository-path", "OUT",
                  "--run-config-search-mode", "optuna", "--storage", url, timeout=120)  # fmt: skip
    line = one_line(run)  # today's behaviour: the run ends with one sentence
    assert f"--storage '{redact_url(url)}'" in line
    _no_secret_anywhere(tmp_path, run.stdout, run.stderr)


def test_a_storage_url_from_the_environment_stays_out_of_argv_children_and_files(tmp_path):
    with postgres_server() as plain:
        url = plain.replace("@", ":secret@", 1) + "?password=secret"  # trust auth ignores it
        env = {**os.environ, "COLUMNS": "160", "MODEL_ANALYZER_STORAGE": url}
        args = [*SEARCH, "--output-model-repository-path", "OUT", "--run-config-search-mode",
                "optuna", "--study-name", "shared-study",
                "--optuna-min-trials", "1", "--optuna-max-trials", "2",
                "--max-percentage-of-search-space", "100"]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "analyzer", "profile", *args], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: set[str] = set()
        try:
            deadline = time.monotonic() + 300
            while process.poll() is None and time.monotonic() < deadline:
                try:  # the profiler's argv; its worker's and load generators' argv and environment
                    profiler = psutil.Process(process.pid)
                    own = profiler.cmdline()
                    seen.add(" ".join(own))
                    for child in profiler.children(recursive=True):
                        seen.add(" ".join(child.cmdline()))
                        # /proc/PID/environ is the block a process was exec'd with: a fork of
                        # the profiler (same argv, no exec) shows the profiler's own, which only
                        # its user can read; every program started afresh must not have it
                        if child.cmdline() != own:
                            seen.add(repr(child.environ()))
                except psutil.Error:
                    pass  # a process that ended between the listing and the reading
                time.sleep(0.05)
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
        assert process.returncode == 0, out + err
        assert any("--study-name shared-study" in cmd for cmd in seen)
        assert any(" serve " in f" {cmd} " for cmd in seen)  # the worker was seen too
        document = results(tmp_path / "EXP")
        assert document["models"][0]["study"]["storage"] == redact_url(url)
        assert document["settings"]["storage"] == redact_url(url)
        assert any(c["measurements"] for c in document["models"][0]["configs"])

        report = subprocess.run(
            [sys.executable, "-m", "analyzer", "report", "-e", "EXP"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert report.returncode == 0, report.stdout + report.stderr
        assert "pass --storage" not in report.stdout  # the study was opened with the variable's URL
        assert "the Optuna storage is MODEL_ANALYZER_STORAGE's" in out
        _no_secret_anywhere(tmp_path, *seen, out, err, report.stdout, report.stderr)
