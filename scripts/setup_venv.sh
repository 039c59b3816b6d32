#!/usr/bin/env bash
# Creates the project's virtualenv: the package with its test extras, torch pinned to the local
# CPU build, and the test peers (not runtime dependencies): the real perf_analyzer, NVIDIA's Model
# Analyzer and KServe in venvs of their own, and Debian's packages the tests use. The peers' venvs
# and the Debian packages are installed while the main venv is (a fresh set-up here: 167 s
# instead of 238), each into a log of its own, shown when the step fails or has something to say.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
logs=$(mktemp -d)
steps=(install_ma_peer install_kserve_peer install_system_packages)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
for step in "${steps[@]}"; do
  bash "scripts/$step.sh" "$venv" > "$logs/$step.log" 2>&1 &
  pids+=($!)
done
"$venv/bin/python" -m pip install -q --upgrade pip
# torch first and alone, so nothing later can pull a CUDA build from the registry.
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q -e ".[test]"
bash scripts/install_perf_analyzer.sh "$venv"
failed=0
for i in "${!steps[@]}"; do
  if wait "${pids[$i]}"; then
    grep -v '^WARNING: Location ' "$logs/${steps[$i]}.log" >&2 || true  # pip's mirror noise
  else
    echo "scripts/${steps[$i]}.sh failed:" >&2
    tail -30 "$logs/${steps[$i]}.log" >&2
    failed=1
  fi
done
pids=()
exit "$failed"
