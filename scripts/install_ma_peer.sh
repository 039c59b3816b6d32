#!/usr/bin/env bash
# Installs NVIDIA's Model Analyzer 1.58 (PyPI: triton-model-analyzer) into its own virtualenv,
# $VENV/peers/model-analyzer, as a test peer: tests/test_ma_peer.py runs it against our worker in
# its local launch mode (triton_server_path: model-analyzer-server) and its remote mode. It is
# never imported by model-analyzer itself; it lives in its own venv because its pins (tritonclient,
# numpy, optuna) are not ours.
set -euo pipefail
venv=${1:-.venv}
peer="$venv/peers/model-analyzer"
if [ -x "$peer/bin/model-analyzer" ]; then exit 0; fi
"$venv/bin/python" -m venv "$peer"
"$peer/bin/python" -m pip install -q --upgrade pip
"$peer/bin/python" -m pip install -q "triton-model-analyzer==1.58.0"
