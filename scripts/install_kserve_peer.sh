#!/usr/bin/env bash
# Installs KServe 0.21 (PyPI: kserve) into its own virtualenv, $VENV/peers/kserve, as a test peer:
# tests/test_plan_export.py checks `model-analyzer export --format kserve` against its
# V1beta1InferenceService model classes. It is never imported by model-analyzer itself; it lives in
# its own venv because its pins (fastapi, kubernetes, protobuf) are not ours.
set -euo pipefail
venv=${1:-.venv}
peer="$venv/peers/kserve"
if [ -x "$peer/bin/python" ] && "$peer/bin/python" -c "import kserve" 2>/dev/null; then exit 0; fi
"$venv/bin/python" -m venv "$peer"
"$peer/bin/python" -m pip install -q --upgrade pip
"$peer/bin/python" -m pip install -q "kserve==0.21.0"
