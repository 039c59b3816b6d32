#!/usr/bin/env bash
# Debian packages the tests use as peers: chromium (headless, to check the HTML reports render),
# postgresql (a study shared by several profile processes; the tests start their own server),
# docker.io and debootstrap (docker launch mode: the tests start dockerd and build the worker image
# from a debootstrap root filesystem, since no image can be pulled), and tcpdump (the load-generator
# benchmark's wire part reads both clients' requests off the loopback), and openssl (tests/test_tls.py
# makes its certificates with it).
# WeasyPrint's pango comes with chromium's dependencies. Needs root; otherwise says what to run.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
ldconfig -p | grep -q 'libpango-1.0.so' || need+=(libpango-1.0-0 libpangoft2-1.0-0)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v openssl >/dev/null || need+=(openssl)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "the tests and benchmarks need Debian's ${need[*]}: run 'sudo apt-get install ${need[*]}'" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_get() { bash "$(dirname "$0")/apt_get.sh" "$@"; }  # one apt at a time
(apt_get install -y -qq "${need[@]}" >/dev/null 2>&1) \
  || (apt_get update -qq && apt_get install -y -qq "${need[@]}" >/dev/null)
