#!/usr/bin/env bash
# Builds the worker image (default model-analyzer-worker:latest) from local files only -- no
# registry pull. Two layers of work:
#  - a base image, built once per set of dependencies: a Debian bookworm root filesystem made by
#    debootstrap (from the Debian mirror, a package registry), the interpreter the project's venv
#    runs on and the venv itself, both at their paths on this machine (a venv's paths are
#    absolute), imported with `docker import`;
#  - the image: the base plus this checkout's source and the non-root user `worker` (uid and gid
#    1000) it runs as (seconds; rebuilt whenever asked). The folders above the interpreter and the
#    venv (e.g. /root of a pyenv python) are made traversable to that user, nothing more.
# Needs root (debootstrap) and a running dockerd. With registry access, docker/Dockerfile builds
# the same worker from python:3.11-slim instead (see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
image=${1:-model-analyzer-worker:latest}
venv=${VENV:-$repo/.venv}
py="$venv/bin/python"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ -x "$py" ] || { echo "no virtualenv at $venv: run 'make venv' first" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "the Docker daemon is not running (scripts/start_dockerd.sh starts one)" >&2; exit 2; }
prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
key=$( { cat pyproject.toml; "$py" -m pip freeze --exclude-editable 2>/dev/null; echo "$prefix $venv"; } \
       | sha256sum | cut -c1-16)
base="model-analyzer-base:$key"

# every scratch folder this run makes, removed however it ends (one trap: a second would replace it)
work=
context=
trap 'rm -rf ${work:+"$work"} ${context:+"$context"}' EXIT

free_mib() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }

# Our own leftovers that nothing can use any more, ~1.6 GiB each: earlier builds of an image name
# now given to a newer one (untagged), base images of venvs no longer on this machine (a deleted
# clone) or of this venv's earlier dependency sets (its key can never match again), and scratch
# root filesystems of builds that were killed (hours old). `docker image rm` without --force keeps
# any image a tag or a container still uses. Run before a base is built (to make room) and after
# each build.
prune_stale() {
  find /var/tmp -maxdepth 1 -name 'ma-rootfs.*' -type d -mmin +120 -exec rm -rf {} + 2>/dev/null || true
  docker image prune -f --filter label=model-analyzer.base >/dev/null 2>&1 || true
  docker image ls --filter label=model-analyzer.base --filter reference='model-analyzer-base:*' \
    --format '{{.Repository}}:{{.Tag}}' | while read -r old; do
    [ "$old" = "$base" ] && continue
    from=$(docker image inspect -f '{{index .Config.Labels "model-analyzer.venv"}}' "$old" 2>/dev/null || true)
    [ "$from" = "<no value>" ] && from=
    if [ "$from" = "$venv" ]; then
      why="an earlier dependency set of $venv"
    elif [ -z "$from" ] || [ ! -d "$from" ]; then
      why="built for ${from:-an unlabelled venv}, which is not here"
    else
      continue  # another venv's, still on this machine
    fi
    docker image rm "$old" >/dev/null 2>&1 && echo "removed $old ($why)"
  done || true
}

if ! docker image inspect "$base" >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "building the base image needs root (debootstrap)" >&2; exit 2; }
  command -v debootstrap >/dev/null || { echo "install Debian's debootstrap first" >&2; exit 2; }
  prune_stale
  # the root filesystem (~300 MiB), the interpreter and the venv land twice: in /var/tmp, then in
  # Docker's store; a full disk makes debootstrap fail with a misleading "file already exists"
  need=$(( $(du -sm --exclude=peers "$venv" | cut -f1) + $(du -sm "$prefix" | cut -f1) + 1024 ))
  store=$(docker info -f '{{.DockerRootDir}}')
  for dir in /var/tmp "$store"; do
    have=$(free_mib "$dir")
    if [ "$have" -lt "$need" ]; then
      echo "building the base image needs ${need} MiB free in $dir; it has ${have} MiB (images" \
           "labelled model-analyzer.base that no container uses can be removed: docker image ls" \
           "--filter label=model-analyzer.base)" >&2
      exit 2
    fi
  done
  work=$(mktemp -d /var/tmp/ma-rootfs.XXXXXX)
  include=ca-certificates,libgomp1
  if [ "$prefix" = /usr ]; then  # Debian's own python3.11: the same package in the image
    include="$include,python3.11,libpython3.11"
  fi
  echo "debootstrap bookworm into $work/root (a few minutes, once per dependency set)..."
  debootstrap --variant=minbase --include="$include" bookworm "$work/root" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  if [ "$prefix" != /usr ]; then  # the interpreter, without its own site-packages and tests
    tar -C / -c --exclude="${prefix#/}/lib/python3.*/site-packages" \
      --exclude="${prefix#/}/lib/python3.*/test" "${prefix#/}" | tar -C "$work/root" -x
  fi
  # not the test peers (NVIDIA's Model Analyzer's own venv): the worker never runs them
  tar -C / -c --exclude='__pycache__' --exclude="${venv#/}/peers" "${venv#/}" \
    | tar -C "$work/root" -x
  echo "importing the base image $base..."
  tar -C "$work/root" -c . | docker import \
    -c "ENV PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    -c "ENV PYTHONDONTWRITEBYTECODE=1" -c "LABEL model-analyzer.base=$key" \
    -c "LABEL model-analyzer.venv=$venv" - "$base" >/dev/null
  rm -rf "$work"
fi

context=$(mktemp -d)
mkdir -p "$context/src"
cp -a analyzer templates search_spaces pyproject.toml "$context/src/"
find "$context/src" -name __pycache__ -prune -exec rm -rf {} +
# every folder above the interpreter and the venv, so that uid 1000 can reach them
above=$(for dir in "$prefix" "$venv"; do
  while [ "$dir" != / ]; do dir=$(dirname "$dir"); echo "$dir"; done
done | sort -u | tr '\n' ' ')
cat > "$context/Dockerfile" <<DOCKERFILE
FROM $base
RUN groupadd --gid 1000 worker \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin worker \
 && chmod o+x $above
COPY src/ $repo/
# tritonserver's command line starts the worker, as in a Triton image (MA's docker mode, scripts)
RUN ln -s $venv/bin/model-analyzer-server /usr/local/bin/tritonserver
LABEL model-analyzer.source="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
USER 1000:1000
CMD ["model-analyzer", "serve", "--help"]
DOCKERFILE
docker build --network none -q -t "$image" "$context" >/dev/null
echo "built $image (base $base)"
prune_stale
