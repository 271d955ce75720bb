#!/usr/bin/env bash
# Fleet mode figures (README): sticky requests/s through a shared table against a local one in
# the same run, the added latency of a first pin, and the store traffic per thousand sessions.
# Loopback only; starts its own redis-server on a free port and stops it by PID; every loop
# is bounded (about 30 s of load in all). Needs redis-server (Debian: apt-get install
# redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "bench/fleet.sh: needs redis-server" >&2; exit 2; }
exec cargo test --release -p limpet --test fleet_bench -- --ignored --nocapture --test-threads 1 "$@"
