#!/usr/bin/env bash
# Streams a large body up and down through limpet and prints the peak RSS growth.
#
# The proxy, a demo node and the client run in one process (the ignored test
# `proxy_stream::a_2_gib_body_streams_with_bounded_rss`), so the process's peak RSS (VmHWM)
# bounds what the proxy holds. A flat figure, whatever the body size, shows the bodies stream.
#
# Usage: bench/stream_rss.sh [BYTES]     (default 2 GiB; e.g. $((8<<30)) for 8 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
bytes="${1:-$((2 << 30))}"
LIMPET_STREAM_BYTES="$bytes" cargo test --release -p limpet --test proxy_stream -- \
    --ignored --nocapture --exact a_2_gib_body_streams_with_bounded_rss 2>&1 |
    grep -E "streamed|test result"
