#!/usr/bin/env bash
# Whole-process throughput of `limpet sim`: generate an input file of typical REQUEST commands
# (browser-like heads, 3 in 4 carrying a pin), then time the release binary reading it.
# Usage: bench/sim.sh [REQUESTS]   (default 2,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --release -q -p limpet
python3 - "$n" "$work/input" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
heads = [
    "GET /cart/items?page=2 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\r\nAccept: text/html\r\nCookie: theme=dark; _ga=GA1.2.1234.1700000000; route=b2; lang=en\r\nConnection: keep-alive\r\n\r\n",
    "GET /cart HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
    "POST /api/claim HTTP/1.1\r\nHost: shop.example\r\nContent-Type: application/json\r\nCookie: route=b1\r\nContent-Length: 17\r\n\r\n",
    "GET /ws HTTP/1.1\r\nHost: shop.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\ncookie: lang=en\r\nCookie: route=b3\r\n\r\n",
]
with open(path, "w", newline="") as f:
    f.write("POOL b1 b2 b3\n")
    block = "".join("REQUEST\n" + h for h in heads)
    f.write(block * (n // len(heads)))
PY
python3 - "$n" "$work" <<'PY'
import os, subprocess, sys, time
n, work = int(sys.argv[1]), sys.argv[2]
inp, out = os.path.join(work, "input"), os.path.join(work, "out")
best = None
for _ in range(3):  # best of three
    with open(inp, "rb") as i, open(out, "wb") as o:
        t0 = time.perf_counter()
        subprocess.run(["./target/release/limpet", "sim"], stdin=i, stdout=o, check=True)
        t = time.perf_counter() - t0
    best = t if best is None else min(best, t)
with open(out, "rb") as o:
    answers = o.read().count(b"\n") - 1  # the first answer is POOL's OK
want = n // 4 * 4
if answers != want:
    sys.exit(f"expected {want} answers, got {answers}")
mb = os.path.getsize(inp) / 1e6
print(f"limpet sim: {answers} REQUEST commands ({mb:.1f} MB) in {best:.3f} s = {answers / best / 1e6:.2f} M requests/s")
PY
