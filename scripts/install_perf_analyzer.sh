#!/usr/bin/env bash
# Installs NVIDIA's perf_analyzer 2.41.0 at $VENV/bin/perf_analyzer. The binary ships inside the
# tritonclient 2.41.0 manylinux wheel; it links libb64 (Debian) and libcudart.so.12 (the
# nvidia-cuda-runtime-cu12 wheel), and runs without a GPU.
set -euo pipefail
venv=$(cd "${1:-.venv}" && pwd)
dest="$venv/lib/perf_analyzer"
if [ -x "$dest/perf_analyzer" ] && [ -x "$venv/bin/perf_analyzer" ]; then exit 0; fi
if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if [ "$(id -u)" = 0 ]; then
    apt_get() { bash "$(dirname "$0")/apt_get.sh" "$@"; }
    (apt_get install -y -qq libb64-0d >/dev/null 2>&1) || (apt_get update -qq && apt_get install -y -qq libb64-0d >/dev/null)
  else
    echo "perf_analyzer needs Debian's libb64-0d: run 'sudo apt-get install libb64-0d'" >&2; exit 1
  fi
fi
"$venv/bin/python" -m pip install -q "nvidia-cuda-runtime-cu12>=12,<13"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" -m pip download -q --no-deps "tritonclient==2.41.0" \
  --platform manylinux1_x86_64 --only-binary=:all: -d "$tmp"
mkdir -p "$dest"
"$venv/bin/python" - "$tmp" "$dest" <<'PY'
import pathlib, sys, zipfile
src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(src.glob("tritonclient-2.41.0-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    data = zf.read("tritonclient-2.41.0.data/data/bin/perf_analyzer")
out = dest / "perf_analyzer"
out.write_bytes(data)
out.chmod(0o755)
PY
cudart=$("$venv/bin/python" -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))')
cat > "$venv/bin/perf_analyzer" <<SH
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$dest/perf_analyzer" "\$@"
SH
chmod +x "$venv/bin/perf_analyzer"
"$venv/bin/perf_analyzer" --version >/dev/null 2>&1 || "$venv/bin/perf_analyzer" --help >/dev/null 2>&1 || true
