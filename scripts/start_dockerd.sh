#!/usr/bin/env bash
# Starts a Docker engine for the docker tests when none answers: Debian's docker.io, logging to
# /var/tmp/dockerd.log. Host networking stays the launcher's default; the default bridge (docker0)
# exists so that `network_mode: bridge` works too, without touching the host's own networking:
# no iptables rules and no IP forwarding (containers on the bridge reach nothing beyond the
# host), and published ports are served by docker-proxy on the host address asked for (the
# launcher asks for 127.0.0.1 only).
set -euo pipefail
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "install Debian's docker.io first (as root)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "starting dockerd needs root" >&2; exit 2; }
setsid dockerd --iptables=false --ip6tables=false --ip-forward=false --userland-proxy=true \
  > /var/tmp/dockerd.log 2>&1 < /dev/null &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "dockerd did not start; see /var/tmp/dockerd.log" >&2
tail -20 /var/tmp/dockerd.log >&2
exit 1
