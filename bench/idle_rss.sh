#!/usr/bin/env bash
# Memory per idle client connection: limpet next to HAProxy (issue 13, finding 6).
#
# Starts each proxy on a free loopback port (one worker thread; limpet in quick mode with an
# unreachable node, HAProxy with a plain HTTP frontend), opens N client connections that send
# nothing, and prints the growth of the proxy's resident memory (VmRSS) per connection. The
# connections are measured within a few seconds of opening, well inside both proxies' request
# head timeouts. Every process started is stopped by its PID on exit.
#
# MODE=silent (default): the clients send nothing. MODE=keepalive: each client sends one
# request, reads the answer, and then stays idle on its keep-alive connection (the proxies
# forward to a small Python node started by the script); measured 2 s after the last one
# connected, then again after 3 s of light traffic on other connections (see below).
#
# Usage: bench/idle_rss.sh [N]        (default 10000)
# HAProxy needs a descriptor limit above 2 N + a few hundred (it reserves one per client and
# one per server side); with a hard limit of 20000, use N = 9000.
#        LIMPET=target/release/limpet bench/idle_rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
limpet="${LIMPET:-target/release/limpet}"
tmp="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

ulimit -n "$((2 * n + 1000))" 2>/dev/null || ulimit -n "$(ulimit -Hn)"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# Opens N idle connections to 127.0.0.1:$1, then prints the proxy's RSS growth per connection.
measure() {
    local name="$1" port="$2" pid="$3"
    python3 - "$port" "$n" "$pid" "$name" "${MODE:-silent}" <<'PY'
import socket, sys, time
port, n, pid, name, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def rss():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
# Let the proxy settle after start, then take the baseline.
time.sleep(0.5)
before = rss()
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    if mode == "keepalive":
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while b"\r\n\r\nok" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    socks.append(s)
# Give the proxy a moment to accept the backlog.
time.sleep(2)
after = rss()
open_ = sum(1 for s in socks if s.fileno() >= 0)
per = (after - before) * 1024 / n
print(f"{name:8} {mode:9} {n} idle connections: RSS {before/1024:.1f} -> {after/1024:.1f} MiB, {per:.0f} bytes per connection")
if mode == "keepalive":
    # Then light traffic beside the idle connections (one short connection every 10 ms for
    # 3 s), as a proxy with idle clients mostly has: an allocator may keep freed memory
    # until it next runs (mimalloc purges freed pages lazily, on later allocator calls).
    t = time.time()
    while time.time() - t < 3:
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        while c.recv(4096):
            pass
        c.close()
        time.sleep(0.01)
    later = rss()
    per = (later - before) * 1024 / n
    print(f"{name:8} {mode:9} {n} idle connections, after 3 s of light traffic beside them: RSS {later/1024:.1f} MiB, {per:.0f} bytes per connection")
for s in socks:
    s.close()
PY
}

# The node: a tiny keep-alive HTTP server answering `ok` (used in MODE=keepalive only).
nport="$(free_port)"
python3 - "$nport" >"$tmp/node.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the head and the body go out as two writes, and with Nagle on the body
    # waited for the ACK of the head, which a proxy's reused node connection delays (about
    # 40 ms per request: 9,000 keep-alive clients took longer than five minutes).
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
pids+=("$!")

# limpet: quick mode, one worker thread.
lport="$(free_port)"
"$limpet" proxy --listen "127.0.0.1:$lport" --to a=127.0.0.1:$nport --threads "${THREADS:-1}" \
    >"$tmp/limpet.log" 2>&1 &
pids+=("$!")
lpid="$!"
for _ in $(seq 50); do grep -q "listening on" "$tmp/limpet.log" && break; sleep 0.1; done
measure limpet "$lport" "$lpid"

# HAProxy: the same idle clients on an HTTP frontend.
if command -v haproxy >/dev/null; then
    hport="$(free_port)"
    cat >"$tmp/haproxy.cfg" <<CFG
global
    maxconn $n
    nbthread 1
defaults
    mode http
    timeout connect 3s
    timeout client 60s
    timeout server 60s
    timeout http-request 60s
frontend fe
    bind 127.0.0.1:$hport
    maxconn $n
    default_backend be
backend be
    server a 127.0.0.1:$nport
CFG
    haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
    pids+=("$!")
    hpid="$!"
    sleep 0.5
    measure haproxy "$hport" "$hpid"
else
    echo "haproxy not installed: limpet only" >&2
fi
