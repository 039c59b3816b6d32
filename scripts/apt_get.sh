#!/usr/bin/env bash
# apt-get, one at a time: scripts/setup_venv.sh runs install_system_packages.sh while
# install_perf_analyzer.sh may install libb64-0d, and two apt-gets would refuse each other's lock.
exec flock -w 900 /tmp/model-analyzer-apt.lock apt-get "$@"
