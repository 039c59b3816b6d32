"""The wheel carries what the code reads at run time: an installed copy works from any folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from serving import ROOT

SOURCES = ("pyproject.toml", "README.md", "analyzer", "templates", "search_spaces")

# run from a folder outside any source tree, against the installed copy only
CHECK = """
import sys
from pathlib import Path
import analyzer
site = Path(sys.argv[1])
assert Path(analyzer.__file__).is_relative_to(site), analyzer.__file__
from analyzer.report import html
from analyzer.search.space import DEFAULT_SPACE, load_search_space
assert html.TEMPLATES.is_relative_to(site) and DEFAULT_SPACE.is_relative_to(site)
load_search_space()
env = html._environment()
for name in ("result_summary.html.j2", "detailed_report.html.j2"):
    env.get_template(name)
assert (html.TEMPLATES / "base.css").is_file()
print("installed copy works")
"""


def test_wheel_ships_templates_and_search_spaces(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        else:
            shutil.copy(path, source / name)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(source)], check=True, cwd=source, timeout=300)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("analyzer/templates/result_summary.html.j2", "analyzer/templates/base.css",
                 "analyzer/search_spaces/default.yaml"):  # fmt: skip
        assert data in names, f"{data} is missing from {wheel.name}"
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-c", CHECK, str(site)], cwd=elsewhere,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "installed copy works" in run.stdout
