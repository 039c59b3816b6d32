#!/usr/bin/env bash
# Creates the project's virtualenv: the package with its test extras, torch pinned to the local
# CPU build, and the real perf_analyzer (a test peer, not a runtime dependency).
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# torch first and alone, so nothing later can pull a CUDA build from the registry.
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q -e ".[test]"
bash scripts/install_perf_analyzer.sh "$venv"
bash scripts/install_ma_peer.sh "$venv"
bash scripts/install_kserve_peer.sh "$venv"
bash scripts/install_system_packages.sh
