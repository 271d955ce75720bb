#!/usr/bin/env bash
# Side-by-side HTTP benchmark: limpet vs HAProxy 2.6, same backends, same load, same core.
#
# One run starts two identical nginx backends on loopback, then for each proxy in turn: starts
# it pinned to one core, checks that it really balances and honours pins, warms it up, and
# drives wrk through it twice:
#   plain   no cookie: every request is a fresh assignment answered with Set-Cookie
#   sticky  a valid pin cookie on every request (`route=a` / `SERVERID=a`): the path that
#           matters for affinity, a pinned client going straight to its node
# It prints requests/s and latency (p50, p99) for each, and limpet/HAProxy ratios.
# See bench/README.md for what is measured and how to read it.
#
# Usage: bench/http.sh [options]
#   --duration SECS     length of each measured wrk run (default 10)
#   --warmup SECS       discarded wrk run before measuring each proxy (default 2)
#   --connections N     wrk connections (default 64)
#   --wrk-threads N     wrk threads (default 1)
#   --rounds N          repeat everything N times, report medians (default 1; 3+ for README figures)
#   --proxy-core C      core the proxy runs on (default 0)
#   --client-core C     core wrk and the nginx backends run on (default 1)
#   --limpet PATH       limpet binary (default: $LIMPET, else target/release/limpet)
#   --build             run `cargo build --release -p limpet` first
#   --only NAME         run one proxy only: limpet or haproxy (no ratios)
#   --json              print the results as JSON on stdout (the table goes to stderr)
#   --keep              keep the temporary directory (configs, logs) for inspection
#
# It installs nothing. Missing tools: apt-get install -y haproxy nginx-light wrk
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

duration=10
warmup=2
connections=64
wrk_threads=1
rounds=1
proxy_core=0
client_core=1
limpet_bin=${LIMPET:-$repo/target/release/limpet}
build=0
only=""
json=0
keep=0

die() {
    echo "bench/http.sh: $*" >&2
    exit 1
}
say() { echo "$*" >&2; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --duration) duration=${2:?}; shift 2 ;;
        --warmup) warmup=${2:?}; shift 2 ;;
        --connections) connections=${2:?}; shift 2 ;;
        --wrk-threads) wrk_threads=${2:?}; shift 2 ;;
        --rounds) rounds=${2:?}; shift 2 ;;
        --proxy-core) proxy_core=${2:?}; shift 2 ;;
        --client-core) client_core=${2:?}; shift 2 ;;
        --limpet) limpet_bin=${2:?}; shift 2 ;;
        --build) build=1; shift ;;
        --only) only=${2:?}; shift 2 ;;
        --json) json=1; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
for v in duration warmup connections wrk_threads rounds proxy_core client_core; do
    is_uint "${!v}" || die "--${v//_/-} wants a whole number, got '${!v}'"
done
((duration > 0 && connections > 0 && wrk_threads > 0 && rounds > 0)) || die "duration, connections, threads and rounds must be > 0"
((connections >= wrk_threads)) || die "wrk needs at least one connection per thread"
case $only in
    "") proxies=(limpet haproxy) ;;
    limpet | haproxy) proxies=("$only") ;;
    *) die "--only takes limpet or haproxy" ;;
esac
wants() { [[ " ${proxies[*]} " == *" $1 "* ]]; }

# ---- tools -------------------------------------------------------------------------------
# Map each tool to the Debian package that brings it, so the message says exactly what to run.
declare -A pkg_of=([nginx]=nginx-light [wrk]=wrk [curl]=curl [ss]=iproute2 [taskset]=util-linux [awk]=mawk)
wants haproxy && pkg_of[haproxy]=haproxy
missing=()
for tool in "${!pkg_of[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${pkg_of[$tool]}")
done
if ((${#missing[@]})); then
    hint=""
    if [[ -f /tmp/apt.log ]] && ! grep -q '^done' /tmp/apt.log; then
        hint=" (an apt install may still be running: see /tmp/apt.log)"
    fi
    extra=""
    for p in "${missing[@]}"; do [[ " haproxy nginx-light wrk " == *" $p "* ]] || extra+=" $p"; done
    die "missing: ${missing[*]}. Install with: apt-get install -y haproxy nginx-light wrk$extra$hint"
fi

ncpu=$(nproc)
((proxy_core < ncpu && client_core < ncpu)) || die "cores $proxy_core/$client_core do not exist (this machine has $ncpu)"
((proxy_core != client_core)) || say "warning: proxy and client share core $proxy_core; figures will be lower and noisier"

if wants limpet; then
    if ((build)); then
        say "building limpet (release)..."
        (cd "$repo" && cargo build --release -p limpet) >&2 || die "cargo build --release -p limpet failed"
    fi
    [[ -x $limpet_bin ]] || die "no limpet binary at $limpet_bin: run 'cargo build --release -p limpet' (or pass --build, --limpet PATH, or --only haproxy)"
    if ! "$limpet_bin" proxy --help >/dev/null 2>&1; then
        die "$limpet_bin has no working 'proxy' subcommand yet (issue 3). Rebuild it once it lands, or run with --only haproxy"
    fi
    [[ $limpet_bin == */debug/* ]] && say "warning: $limpet_bin looks like a debug build; its figures mean nothing"
    # A stale binary would measure old code: say so rather than silently benchmark it.
    if [[ -n $(find "$repo/crates" -name '*.rs' -newer "$limpet_bin" -print -quit 2>/dev/null) ]]; then
        say "warning: $limpet_bin is older than sources under crates/ (pass --build to rebuild)"
    fi
fi

haproxy_version=""
if wants haproxy; then
    haproxy_version=$(haproxy -v 2>&1 | sed -n 1p || true)
    [[ $haproxy_version == *"version 2.6"* ]] || say "warning: issue 3 compares against HAProxy 2.6; this is: $haproxy_version"
fi
nginx_version=$(nginx -v 2>&1 | sed -n 1p || true)
# `wrk -v` prints its version then exits 1 (no URL given).
wrk_version=$(wrk -v 2>&1 | awk 'NR == 1 {print $2}' || true)
limpet_rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$repo" status --porcelain -- crates 2>/dev/null) ]]; then limpet_rev+="+dirty"; fi
cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)

# ---- processes and cleanup ---------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/limpet-bench.XXXXXX")
pids=()

stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 30; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local pid
    for pid in "${pids[@]}"; do stop_pid "$pid"; done
    if ((keep)); then say "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free loopback ports, found at run time: a port below the default ephemeral range
# (32768-60999) that nothing listens on, so outgoing connections cannot take it meanwhile.
# Sets the variable named $1 (no subshell, so the ports already handed out are remembered).
taken_ports=" "
free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + RANDOM % 12000))
        [[ $taken_ports == *" $p "* ]] && continue
        if [[ -z $(ss -Htan "sport = :$p" 2>/dev/null) ]]; then
            taken_ports+="$p "
            printf -v "$1" '%s' "$p"
            return 0
        fi
    done
    die "found no free port"
}

# Waits until something accepts on 127.0.0.1:port, while the process is alive (bounded).
wait_port() {
    local port=$1 pid=$2 log=$3 what=$4 i
    for ((i = 0; i < 100; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "---- $log"
            tail -n 20 "$log" >&2 || true
            die "$what exited at start (log above)"
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    die "$what did not listen on 127.0.0.1:$port within 10 s (log: $log)"
}

# ---- backends ----------------------------------------------------------------------------
# Two identical nginx servers: 200 with a 2-byte body naming the backend (also in X-Backend, so
# the checks below can see where a request landed). No access log; long keep-alive so neither
# proxy pays for reconnects the other does not.
start_backend() {
    local name=$1 port=$2 dir=$work/nginx-$1
    mkdir -p "$dir"
    cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    server {
        listen 127.0.0.1:$port;
        location / {
            add_header X-Backend $name;
            return 200 "$name\n";
        }
    }
}
EOF
    taskset -c "$client_core" nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" \
        >"$dir/stdout.log" 2>&1 &
    pids+=($!)
    wait_port "$port" "$!" "$dir/error.log" "nginx backend $name"
}

# ---- proxies -----------------------------------------------------------------------------
start_haproxy() {
    local port=$1 dir=$work/haproxy
    mkdir -p "$dir"
    # Matches what limpet does per request: cookie insert + strip (indirect), no-cache on
    # answers that set it (nocache), X-Forwarded-For/-Proto/-Host, keep-alive both sides, no
    # per-request log. One thread.
    cat >"$dir/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 8192
    pidfile $dir/haproxy.pid
defaults
    mode http
    maxconn 8192
    option http-keep-alive
    http-reuse safe
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:$port
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    default_backend be
backend be
    balance roundrobin
    cookie SERVERID insert indirect nocache
    server a 127.0.0.1:$port_a cookie a
    server b 127.0.0.1:$port_b cookie b
EOF
    haproxy -c -q -f "$dir/haproxy.cfg" >"$dir/check.log" 2>&1 || {
        cat "$dir/check.log" >&2
        die "haproxy rejected its config ($dir/haproxy.cfg)"
    }
    taskset -c "$proxy_core" haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_port "$port" "$proxy_pid" "$dir/haproxy.log" "haproxy"
}

start_limpet() {
    local port=$1 dir=$work/limpet
    mkdir -p "$dir"
    # Per-request log lines off, as for HAProxy (which has no log target here). Override with
    # LIMPET_RUST_LOG to measure their cost.
    RUST_LOG=${LIMPET_RUST_LOG:-warn} taskset -c "$proxy_core" "$limpet_bin" proxy \
        --listen "127.0.0.1:$port" --to "a=127.0.0.1:$port_a" --to "b=127.0.0.1:$port_b" \
        --threads 1 >"$dir/limpet.log" 2>&1 &
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_port "$port" "$proxy_pid" "$dir/limpet.log" "limpet proxy"
}

forget_pid() {
    local kept=() p
    for p in "${pids[@]}"; do [[ $p == "$1" ]] || kept+=("$p"); done
    pids=("${kept[@]}")
}

stop_proxy() {
    stop_pid "$1"
    forget_pid "$1"
}

cookie_name() { if [[ $1 == limpet ]]; then echo route; else echo SERVERID; fi; }

# Checks that the proxy is doing the work being measured: fresh requests get a pin cookie and
# spread over both backends; a pin cookie sends the request to the pinned backend.
check_proxy() {
    local proxy=$1 port=$2 cookie out i seen=""
    cookie=$(cookie_name "$proxy")
    for i in 1 2; do
        out=$(curl -sS -m 5 -D - -o /dev/null "http://127.0.0.1:$port/") || die "$proxy: request failed"
        [[ $out == "HTTP/1.1 200"* ]] || die "$proxy: expected 200, got: ${out%%$'\r'*}"
        grep -qi "^set-cookie: $cookie=" <<<"$out" || die "$proxy: fresh request got no '$cookie' cookie:"$'\n'"$out"
        seen+=$(grep -i '^x-backend:' <<<"$out" | tr -d '\r' | awk '{print $2}')
    done
    [[ $seen == ab || $seen == ba ]] || die "$proxy: two fresh requests should land on a and b, got '$seen'"
    for i in a b; do
        out=$(curl -sS -m 5 -D - -o /dev/null -H "Cookie: $cookie=$i" "http://127.0.0.1:$port/") || die "$proxy: request failed"
        grep -qi "^x-backend: $i" <<<"$out" || die "$proxy: 'Cookie: $cookie=$i' did not land on $i:"$'\n'"$out"
    done
}

# wrk reports through this script: one machine-readable line, exact percentiles.
cat >"$work/report.lua" <<'EOF'
local cookie = os.getenv("BENCH_COOKIE")
if cookie ~= nil and cookie ~= "" then
  wrk.headers["Cookie"] = cookie
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH rps=%.1f p50_us=%.0f p99_us=%.0f max_us=%.0f requests=%d socket_errors=%d non_2xx=%d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max,
    summary.requests, e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

# run_wrk SECS PORT COOKIE: sets wrk_result to the BENCH line's fields. wrk runs in the
# background and is waited for, so a Ctrl-C is handled at once (a trap does not run while bash
# waits on a foreground child) and cleanup stops wrk with the rest.
run_wrk() {
    local secs=$1 port=$2 cookie=$3 out=$work/wrk.out pid
    BENCH_COOKIE=$cookie timeout $((secs + 30)) taskset -c "$client_core" \
        wrk -t "$wrk_threads" -c "$connections" -d "${secs}s" --timeout 5s \
        -s "$work/report.lua" "http://127.0.0.1:$port/" >"$out" 2>&1 &
    pid=$!
    pids+=("$pid")
    wait "$pid" || die "wrk failed or timed out:"$'\n'"$(cat "$out")"
    forget_pid "$pid"
    wrk_result=$(sed -n 's/^BENCH //p' "$out")
    [[ -n $wrk_result ]] || die "wrk printed no result:"$'\n'"$(cat "$out")"
}

field() { # field NAME "k=v k=v ..."
    local kv
    for kv in $2; do [[ ${kv%%=*} == "$1" ]] && { echo "${kv#*=}"; return; }; done
    echo 0
}

median() { # median of the arguments, numerically
    printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# ---- run ---------------------------------------------------------------------------------
free_port port_a
free_port port_b
free_port port_proxy
start_backend a "$port_a"
start_backend b "$port_b"

declare -A results # results[proxy.variant] = space-separated "k=v ..." records, one per round
variants=(plain sticky)

say "limpet bench: wrk -t$wrk_threads -c$connections -d${duration}s, $rounds round(s); proxy on core $proxy_core, wrk+nginx on core $client_core"
for ((round = 1; round <= rounds; round++)); do
    order=("${proxies[@]}")
    # Alternate which proxy goes first, so drift (thermal, other load) does not favour one.
    if ((round % 2 == 0 && ${#order[@]} == 2)); then order=("${order[1]}" "${order[0]}"); fi
    for proxy in "${order[@]}"; do
        "start_$proxy" "$port_proxy"
        check_proxy "$proxy" "$port_proxy"
        if ((warmup > 0)); then run_wrk "$warmup" "$port_proxy" ""; fi
        for variant in "${variants[@]}"; do
            cookie=""
            [[ $variant == sticky ]] && cookie="$(cookie_name "$proxy")=a"
            say "round $round/$rounds: $proxy $variant..."
            run_wrk "$duration" "$port_proxy" "$cookie"
            say "  $wrk_result"
            results[$proxy.$variant]+="${wrk_result// /,};"
        done
        stop_proxy "$proxy_pid"
    done
done

# Medians per proxy and variant.
declare -A med
for proxy in "${proxies[@]}"; do
    for variant in "${variants[@]}"; do
        IFS=';' read -r -a recs <<<"${results[$proxy.$variant]%;}"
        for key in rps p50_us p99_us max_us requests socket_errors non_2xx; do
            vals=()
            for rec in "${recs[@]}"; do vals+=("$(field "$key" "${rec//,/ }")"); done
            med[$proxy.$variant.$key]=$(median "${vals[@]}")
        done
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "null" }'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }

table() {
    echo "limpet vs HAProxy: wrk -t$wrk_threads -c$connections -d${duration}s, median of $rounds round(s), proxies on core $proxy_core (1 thread), wrk+nginx on core $client_core"
    [[ -n $haproxy_version ]] && echo "$haproxy_version"
    echo "limpet $limpet_rev; $nginx_version; wrk $wrk_version; ${cpu_model:-unknown cpu}, $ncpu cores"
    echo
    printf '%-7s %-8s %12s %9s %9s %9s %8s\n' variant proxy "req/s" "p50 ms" "p99 ms" "max ms" errors
    for variant in "${variants[@]}"; do
        for proxy in "${proxies[@]}"; do
            local k=$proxy.$variant
            printf '%-7s %-8s %12.0f %9s %9s %9s %8s\n' "$variant" "$proxy" "${med[$k.rps]}" \
                "$(ms "${med[$k.p50_us]}")" "$(ms "${med[$k.p99_us]}")" "$(ms "${med[$k.max_us]}")" \
                "$(awk -v a="${med[$k.socket_errors]}" -v b="${med[$k.non_2xx]}" 'BEGIN {print a + b}')"
        done
        if ((${#proxies[@]} == 2)); then
            printf '%-7s %-8s %11sx %9s %8sx\n' "$variant" "ratio" \
                "$(ratio "${med[limpet.$variant.rps]}" "${med[haproxy.$variant.rps]}")" "" \
                "$(ratio "${med[limpet.$variant.p99_us]}" "${med[haproxy.$variant.p99_us]}")"
        fi
    done
    if ((${#proxies[@]} == 2)); then
        echo
        echo "ratio = limpet / haproxy: req/s above 1 and p99 below 1 favour limpet."
    fi
    echo "errors = socket errors + non-2xx answers (should be 0)."
}

json_out() {
    local first=1 proxy variant k
    printf '{\n  "wrk": {"threads": %d, "connections": %d, "duration_s": %d, "rounds": %d, "version": "%s"},\n' \
        "$wrk_threads" "$connections" "$duration" "$rounds" "$wrk_version"
    printf '  "cores": {"proxy": %d, "client": %d, "total": %d},\n' "$proxy_core" "$client_core" "$ncpu"
    printf '  "haproxy_version": "%s",\n  "nginx_version": "%s",\n  "limpet_rev": "%s",\n' \
        "$haproxy_version" "$nginx_version" "$limpet_rev"
    printf '  "results": ['
    for variant in "${variants[@]}"; do
        for proxy in "${proxies[@]}"; do
            k=$proxy.$variant
            ((first)) || printf ','
            first=0
            printf '\n    {"proxy": "%s", "variant": "%s", "rps": %s, "p50_ms": %s, "p99_ms": %s, "max_ms": %s, "requests": %s, "socket_errors": %s, "non_2xx": %s}' \
                "$proxy" "$variant" "${med[$k.rps]}" "$(ms "${med[$k.p50_us]}")" "$(ms "${med[$k.p99_us]}")" \
                "$(ms "${med[$k.max_us]}")" "${med[$k.requests]}" "${med[$k.socket_errors]}" "${med[$k.non_2xx]}"
        done
    done
    printf '\n  ]'
    if ((${#proxies[@]} == 2)); then
        printf ',\n  "ratios": {'
        first=1
        for variant in "${variants[@]}"; do
            ((first)) || printf ', '
            first=0
            printf '"%s": {"rps": %s, "p99": %s}' "$variant" \
                "$(ratio "${med[limpet.$variant.rps]}" "${med[haproxy.$variant.rps]}")" \
                "$(ratio "${med[limpet.$variant.p99_us]}" "${med[haproxy.$variant.p99_us]}")"
        done
        printf '}'
    fi
    printf '\n}\n'
}

if ((json)); then
    table >&2
    json_out
else
    table
fi
