# Shared by bench/http.sh and bench/cost.sh: tools, temporary directory, processes stopped by
# PID on exit, free loopback ports, the nginx backends, both proxies in every mode, the checks
# that they balance and pin, and the load tools (wrk, h2load). Sourced, not run.
#
# The sourcing script sets before sourcing: bench_name (for messages), repo, proxy_core,
# client_core, limpet_bin, keep (1: keep the temporary directory). After sourcing it calls
# bench_setup once its options are parsed.
# shellcheck shell=bash
# shellcheck disable=SC2034 # variables set here are read by the sourcing scripts

die() {
    echo "$bench_name: $*" >&2
    exit 1
}
say() { echo "$*" >&2; }
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# ---- modes -------------------------------------------------------------------------------
# Every mode both proxies are driven in. `group` is the listener a mode needs (the proxy is
# started once per group); `tool` what drives it.
all_modes=(sticky plain close tcp tcp-close h2c-m10 h2c-m1 h2c-c4m16 https h2-tls)
declare -A mode_desc=(
    [sticky]="HTTP/1.1 keep-alive, pinned by cookie"
    [plain]="HTTP/1.1 keep-alive, no cookie: fresh pin + Set-Cookie each request"
    [close]="HTTP/1.1 'Connection: close' on every request, pinned by cookie"
    [tcp]="TCP listener, source-ip affinity table, HTTP/1.1 keep-alive through it"
    [tcp-close]="TCP listener, source-ip affinity table, 'Connection: close' through it"
    [h2c-m10]="HTTP/2 cleartext (prior knowledge), h2load -c16 -m10, pinned by cookie"
    [h2c-m1]="HTTP/2 cleartext (prior knowledge), h2load -c16 -m1, pinned by cookie"
    [h2c-c4m16]="HTTP/2 cleartext (prior knowledge), h2load -c4 -m16, pinned by cookie"
    [https]="HTTPS/1.1 keep-alive (TLS to the proxy only), pinned by cookie"
    [h2-tls]="HTTP/2 over TLS (ALPN h2), h2load -c16 -m10, pinned by cookie"
)
# bench_option "$@": takes one option that bench/http.sh and bench/cost.sh share (the modes,
# the load, the cores, the binary, the output) into its variable, and sets opt_words to the
# words it took: 0 when "$1" is not one of them (the script's own, or unknown).
bench_option() {
    opt_words=2
    case $1 in
        --modes) mode_list=${2:?} ;;
        --duration) duration=${2:?} ;;
        --warmup) warmup=${2:?} ;;
        --connections) connections=${2:?} ;;
        --proxy-core) proxy_core=${2:?} ;;
        --client-core) client_core=${2:?} ;;
        --nginx-core) nginx_core=${2:?} ;;
        --limpet) limpet_bin=${2:?} ;;
        --only) only=${2:?} ;;
        --quiet-wait) quiet_wait=${2:?} ;;
        --build) build=1; opt_words=1 ;;
        --json) json=1; opt_words=1 ;;
        --keep) keep=1; opt_words=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) opt_words=0 ;;
    esac
}

mode_group() { case $1 in tcp | tcp-close) echo tcp ;; https | h2-tls) echo tls ;; *) echo http ;; esac; }
mode_tool() { case $1 in h2c-* | h2-tls) echo h2load ;; *) echo wrk ;; esac; }

# parse_modes "a,b,c": sets the array `modes` (in the order of all_modes), or dies.
parse_modes() {
    local list=$1 m want=() known
    IFS=',' read -r -a want <<<"$list"
    ((${#want[@]})) || die "--modes wants a comma-separated list of: ${all_modes[*]}"
    for m in "${want[@]}"; do
        known=0
        [[ -n ${mode_desc[$m]+x} ]] && known=1
        ((known)) || die "unknown mode '$m' (modes: ${all_modes[*]})"
    done
    modes=()
    for m in "${all_modes[@]}"; do
        [[ ",$list," == *",$m,"* ]] && modes+=("$m")
    done
    return 0
}

# Groups the chosen modes need, in order: http, tcp, then tls (an HTTP listener with TLS to
# clients; plaintext HTTP/1.1 to the nodes, as in the other modes).
mode_groups() {
    local g m need
    for g in http tcp tls; do
        need=0
        for m in "${modes[@]}"; do [[ $(mode_group "$m") == "$g" ]] && need=1; done
        ((need)) && echo "$g"
    done
    return 0
}

# ---- tools -------------------------------------------------------------------------------
# need_tools TOOL...: dies naming the Debian packages that bring the missing ones.
declare -A pkg_of=([nginx]=nginx-light [wrk]=wrk [curl]=curl [ss]=iproute2 [taskset]=util-linux
    [awk]=mawk [haproxy]=haproxy [h2load]=nghttp2-client [strace]=strace [valgrind]=valgrind
    [callgrind_control]=valgrind [perf]=linux-perf [getconf]=libc-bin [timeout]=coreutils
    [openssl]=openssl)
need_tools() {
    local tool missing=() hint=""
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("${pkg_of[$tool]:-$tool}")
    done
    ((${#missing[@]})) || return 0
    if [[ -f /tmp/apt.log ]] && ! grep -q '^done' /tmp/apt.log; then
        hint=" (an apt install may still be running: see /tmp/apt.log)"
    fi
    die "missing: ${missing[*]}. Install with: apt-get install -y $(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')$hint"
}

# check_cores: the cores exist (after collect_versions, which sets ncpu); the nginx backends
# go on the client core unless --nginx-core says otherwise.
check_cores() {
    nginx_core=${nginx_core:-$client_core}
    is_uint "$nginx_core" || die "--nginx-core wants a whole number, got '$nginx_core'"
    ((proxy_core < ncpu && client_core < ncpu && nginx_core < ncpu)) ||
        die "cores $proxy_core/$client_core/$nginx_core do not exist (this machine has $ncpu)"
    ((proxy_core != client_core)) || say "warning: proxy and client share core $proxy_core; figures will be lower and noisier"
    return 0
}

# layout: which core runs what, for the header lines.
layout() {
    if ((nginx_core == client_core)); then
        echo "proxy on core $proxy_core, load+nginx on core $client_core"
    elif ((nginx_core == proxy_core)); then
        echo "proxy+nginx on core $proxy_core, load on core $client_core"
    else
        echo "proxy on core $proxy_core, load on core $client_core, nginx on core $nginx_core"
    fi
}

# check_limpet_bin BUILD(0|1): builds if asked, checks the binary is usable and current.
check_limpet_bin() {
    if (($1)); then
        say "building limpet (release)..."
        (cd "$repo" && cargo build --release -p limpet) >&2 || die "cargo build --release -p limpet failed"
    fi
    [[ -x $limpet_bin ]] || die "no limpet binary at $limpet_bin: run 'cargo build --release -p limpet' (or pass --build, --limpet PATH, or --only haproxy)"
    "$limpet_bin" proxy --help >/dev/null 2>&1 || die "$limpet_bin has no working 'proxy' subcommand"
    [[ $limpet_bin == */debug/* ]] && say "warning: $limpet_bin looks like a debug build; its figures mean nothing"
    # A stale binary would measure old code: say so rather than silently benchmark it.
    if [[ -n $(find "$repo/crates" -name '*.rs' -newer "$limpet_bin" -print -quit 2>/dev/null) ]]; then
        say "warning: $limpet_bin is older than sources under crates/ (pass --build to rebuild)"
    fi
    return 0
}

# Sets haproxy_version nginx_version wrk_version h2load_version limpet_rev limpet_info cpu_model
# ncpu.
collect_versions() {
    haproxy_version=""
    if command -v haproxy >/dev/null 2>&1; then haproxy_version=$(haproxy -v 2>&1 | sed -n 1p || true); fi
    nginx_version=$(nginx -v 2>&1 | sed -n 1p || true)
    # `wrk -v` prints its version then exits 1 (no URL given).
    wrk_version=$(wrk -v 2>&1 | awk 'NR == 1 {print $2}' || true)
    h2load_version=""
    if command -v h2load >/dev/null 2>&1; then h2load_version=$(h2load --version 2>&1 | awk 'NR == 1 {print $2}' || true); fi
    limpet_rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$repo" status --porcelain -- crates 2>/dev/null) ]]; then limpet_rev+="+dirty"; fi
    # The tree's revision says what the binary was built from only if it was built from this
    # tree since: name the binary and its time too.
    limpet_info="tree $limpet_rev, binary $limpet_bin"
    if [[ -e $limpet_bin ]]; then limpet_info+=" ($(date -r "$limpet_bin" '+%Y-%m-%d %H:%M'))"; fi
    cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
    ncpu=$(nproc)
}

# ---- processes and cleanup ---------------------------------------------------------------
pids=()

# running PID: the process exists and is not a zombie (a process this shell did not start,
# such as a limpet started by another on SIGUSR2, is reaped by init, maybe late).
running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ ${stat##*) } != Z* ]]
}

stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        running "$pid" || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
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

# A sourcing script may define bench_on_exit: run on exit once every process is stopped (e.g.
# to remove perf probes, which cannot go while a perf process uses them).
bench_cleanup() {
    local i
    # Newest first: load tools and tracers before proxies, proxies before their backends.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop_pid "${pids[i]}"; done
    if declare -F bench_on_exit >/dev/null; then bench_on_exit || true; fi
    if ((keep)); then say "kept $work"; else rm -rf "$work"; fi
}

bench_setup() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/limpet-bench.XXXXXX")
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

# Free loopback ports, found at run time: a port below the default ephemeral range
# (32768-60999) that nothing listens on or connects from, on any address, so outgoing
# connections cannot take it meanwhile. Sets the variable named $1 (no subshell, so the ports
# already handed out are remembered).
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

# wait_port HOST PORT PID LOG WHAT [SECS]: waits until something accepts on HOST:PORT while the
# process is alive (bounded, default 10 s).
wait_port() {
    local host=$1 port=$2 pid=$3 log=$4 what=$5 secs=${6:-10} i
    for ((i = 0; i < secs * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "---- $log"
            tail -n 20 "$log" >&2 || true
            die "$what exited at start (log above)"
        fi
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    die "$what did not listen on $host:$port within $secs s (log: $log)"
}

# ---- backends ----------------------------------------------------------------------------
# Two identical nginx servers on the same port of two loopback addresses (a config file's
# nodes have an address and each listener one node_port, so a TCP listener needs that):
# 200 with a 2-byte body naming the backend (also in X-Backend, so the checks can see where a
# request landed). No access log; long keep-alive so neither proxy pays for reconnects the
# other does not.
backend_addr_a=127.0.0.2
backend_addr_b=127.0.0.3
start_backend() {
    local name=$1 addr=$2 port=$3 dir=$work/nginx-$1
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
        listen $addr:$port;
        location / {
            add_header X-Backend $name;
            return 200 "$name\n";
        }
    }
}
EOF
    taskset -c "$nginx_core" nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" \
        >"$dir/stdout.log" 2>&1 &
    pids+=($!)
    backend_pids+=($!)
    wait_port "$addr" "$port" "$!" "$dir/error.log" "nginx backend $name"
}

# Sets backend_port, proxy_port, proxy_h2_port and starts both backends.
start_backends() {
    free_port backend_port
    free_port proxy_port
    free_port proxy_h2_port
    start_backend a "$backend_addr_a" "$backend_port"
    start_backend b "$backend_addr_b" "$backend_port"
}

# ---- proxies -----------------------------------------------------------------------------
# start_PROXY GROUP: starts the proxy for a group of modes on proxy_port (and, for HAProxy's
# HTTP/2 bind, proxy_h2_port), pinned to proxy_core, one thread. Sets proxy_pid.
# proxy_wrap (an array, may be empty) is put before the proxy's command, e.g. valgrind;
# proxy_start_secs bounds the wait for its port.
proxy_wrap=()
proxy_start_secs=10
# limpet's pool hands an idle node connection to any client connection: HAProxy's
# `http-reuse always`. With HAProxy's default `safe`, the first request of every client
# connection gets a server connection of its own, which in the `close` mode is one server
# connection per request. HAPROXY_REUSE=safe measures that.
haproxy_reuse=${HAPROXY_REUSE:-always}

# bench_cert: one self-signed certificate (ECDSA P-256, for localhost and 127.0.0.1) for both
# proxies' TLS listeners, made once per run: by `limpet cert` when there is a limpet binary,
# else by openssl (same key type). Sets tls_cert, tls_key and tls_pem (HAProxy's crt file:
# certificate and key in one PEM).
tls_cert=""
bench_cert() {
    local dir=$work/tls
    [[ -n $tls_cert ]] && return 0
    mkdir -p "$dir"
    tls_cert=$dir/bench.pem tls_key=$dir/bench.key tls_pem=$dir/bench-haproxy.pem
    if [[ -x $limpet_bin ]]; then
        "$limpet_bin" cert --out "$dir" --name bench >"$dir/cert.log" 2>&1 ||
            die "limpet cert failed:"$'\n'"$(cat "$dir/cert.log")"
    else
        need_tools openssl
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
            -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
            -keyout "$tls_key" -out "$tls_cert" >"$dir/cert.log" 2>&1 ||
            die "openssl could not make a certificate:"$'\n'"$(cat "$dir/cert.log")"
    fi
    cat "$tls_cert" "$tls_key" >"$tls_pem"
}

# The two nodes of a limpet config file (TCP and TLS groups): nginx a and b, each on its own
# loopback address, on the same port.
limpet_nodes_toml() {
    cat <<EOF
[[nodes]]
name = "a"
address = "$backend_addr_a"

[[nodes]]
name = "b"
address = "$backend_addr_b"
EOF
}

# haproxy_head DIR MODE: the global and defaults sections every bench config of HAProxy
# starts with (one thread; MODE is http or tcp).
haproxy_head() {
    cat <<EOF
global
    nbthread 1
    maxconn 8192
    pidfile $1/haproxy.pid
defaults
    mode $2
    maxconn 8192
    timeout connect 5s
    timeout client 30s
    timeout server 30s
EOF
}

start_haproxy() {
    local group=$1 dir=$work/haproxy-$1 binds proto=http
    mkdir -p "$dir"
    if [[ $group == http || $group == tls ]]; then
        # Matches what limpet does per request: cookie insert + strip (indirect), no-cache on
        # answers that set it (nocache), X-Forwarded-For/-Proto/-Host, keep-alive both sides,
        # no per-request log. One thread. http: HTTP/2 cleartext on its own bind (`proto h2`).
        # tls: one bind terminating TLS, offering h2 and http/1.1 by ALPN (as limpet's TLS
        # listener does); plaintext HTTP/1.1 to the servers as in the http group. Same
        # certificate as limpet (ECDSA P-256). `prefer-client-ciphers`: limpet follows the
        # client's cipher order, HAProxy by default its own, so without it they would negotiate
        # different ciphers with the same client (h2load prefers AES-128-GCM, which limpet
        # takes; HAProxy would pick AES-256-GCM). With it both do the same cipher work: h2load
        # gets AES-128-GCM, wrk (OpenSSL's default order) AES-256-GCM from both. What h2load
        # negotiated is printed ("<proxy> TLS: ..." on stderr, and under the table).
        if [[ $group == http ]]; then
            binds="    bind 127.0.0.1:$proxy_port"$'\n'"    bind 127.0.0.1:$proxy_h2_port proto h2"
        else
            bench_cert
            binds="    bind 127.0.0.1:$proxy_port ssl crt $tls_pem alpn h2,http/1.1"
            binds+=" prefer-client-ciphers"
            proto=https
        fi
        {
            haproxy_head "$dir" http
            cat <<EOF
    option http-keep-alive
    http-reuse $haproxy_reuse
    timeout http-keep-alive 60s
frontend fe
$binds
    option forwardfor
    http-request set-header X-Forwarded-Proto $proto
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    default_backend be
backend be
    balance roundrobin
    cookie SERVERID insert indirect nocache
    server a $backend_addr_a:$backend_port cookie a
    server b $backend_addr_b:$backend_port cookie b
EOF
        } >"$dir/haproxy.cfg"
    else
        # Source-address affinity as limpet's source-ip table: round-robin for a new address,
        # then the table's server (stick-table on src, same size and expiry).
        {
            haproxy_head "$dir" tcp
            cat <<EOF
frontend fe
    bind 127.0.0.1:$proxy_port
    default_backend be
backend be
    balance roundrobin
    stick-table type ip size 100k expire 30m
    stick on src
    server a $backend_addr_a:$backend_port
    server b $backend_addr_b:$backend_port
EOF
        } >"$dir/haproxy.cfg"
    fi
    haproxy -c -q -f "$dir/haproxy.cfg" >"$dir/check.log" 2>&1 || {
        cat "$dir/check.log" >&2
        die "haproxy rejected its config ($dir/haproxy.cfg)"
    }
    taskset -c "$proxy_core" "${proxy_wrap[@]}" haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_port 127.0.0.1 "$proxy_port" "$proxy_pid" "$dir/haproxy.log" "haproxy" "$proxy_start_secs"
    if [[ $group == http ]]; then
        wait_port 127.0.0.1 "$proxy_h2_port" "$proxy_pid" "$dir/haproxy.log" "haproxy (h2 bind)" "$proxy_start_secs"
    fi
}

start_limpet() { start_limpet_as limpet "$limpet_bin" "$1"; }

# The second limpet build of `bench/http.sh --versus BIN`, started exactly as the first.
start_base() { start_limpet_as base "$base_bin" "$1"; }

# start_limpet_as NAME BIN GROUP: limpet binary BIN as the proxy NAME for GROUP's listener.
start_limpet_as() {
    local name=$1 bin=$2 group=$3 dir=$work/$1-$3
    mkdir -p "$dir"
    # Per-request log lines off, as for HAProxy (which has no log target here). Override with
    # LIMPET_RUST_LOG to measure their cost.
    if [[ $group == http ]]; then
        # Quick mode. Its one HTTP listener takes HTTP/1.1 and HTTP/2 prior knowledge alike.
        RUST_LOG=${LIMPET_RUST_LOG:-warn} taskset -c "$proxy_core" "${proxy_wrap[@]}" "$bin" proxy \
            --listen "127.0.0.1:$proxy_port" --to "a=$backend_addr_a:$backend_port" \
            --to "b=$backend_addr_b:$backend_port" --threads 1 >"$dir/limpet.log" 2>&1 &
    else
        if [[ $group == tls ]]; then
            # A TLS listener needs a config file: the two nodes and an HTTP listener with TLS
            # to clients (ALPN h2, http/1.1), the default limpet cookie (`route`) as in quick
            # mode, no table.
            bench_cert
            {
                limpet_nodes_toml
                cat <<EOF

[[listeners]]
name = "https"
bind = "127.0.0.1:$proxy_port"
mode = "http"
node_port = $backend_port
balance = "round-robin"
tls = { cert = "$tls_cert", key = "$tls_key" }
EOF
            } >"$dir/limpet.toml"
        else
            # A TCP listener needs a config file: nodes, a source-ip table, the listener.
            {
                limpet_nodes_toml
                cat <<EOF

# HAProxy: stick-table type ip size 100k expire 30m / stick on src
[[tables]]
name = "src"
key = "source-ip"
expire = "30m"
size = "100k"

[[listeners]]
name = "tcp"
bind = "127.0.0.1:$proxy_port"
mode = "tcp"
node_port = $backend_port
balance = "round-robin"
table = "src"
EOF
            } >"$dir/limpet.toml"
        fi
        "$bin" check -c "$dir/limpet.toml" >"$dir/check.log" 2>&1 || {
            cat "$dir/check.log" >&2
            die "limpet check rejected its config ($dir/limpet.toml)"
        }
        RUST_LOG=${LIMPET_RUST_LOG:-warn} taskset -c "$proxy_core" "${proxy_wrap[@]}" "$bin" run \
            -c "$dir/limpet.toml" --threads 1 >"$dir/limpet.log" 2>&1 &
    fi
    proxy_pid=$!
    pids+=("$proxy_pid")
    wait_port 127.0.0.1 "$proxy_port" "$proxy_pid" "$dir/limpet.log" "$name ($group listener)" "$proxy_start_secs"
}

cookie_name() { if [[ $1 == haproxy ]]; then echo SERVERID; else echo route; fi; }

# The port a mode's load goes to.
mode_port() {
    local proxy=$1 mode=$2
    if [[ $mode == h2c-* && $proxy == haproxy ]]; then echo "$proxy_h2_port"; else echo "$proxy_port"; fi
}

# check_proxy PROXY GROUP: checks that the proxy does the work being measured.
# http: fresh requests get a pin cookie and spread over both backends; a pin cookie sends the
# request to the pinned backend; the same over HTTP/2 prior knowledge (answered in HTTP/2).
# tls: the same over HTTPS/1.1 and, with h2-tls, over HTTP/2 negotiated by ALPN (curl -k: the
# certificate is self-signed).
# tcp: two client addresses land on the two backends, and each stays on its backend.
check_proxy() {
    local proxy=$1 group=$2 cookie out i seen="" h2port first url h1=() h2=()
    local curl_=(curl -sS -m 10 -D - -o /dev/null)
    if [[ $group == tcp ]]; then
        for i in 4 5; do
            first=""
            for _ in 1 2 3; do
                out=$("${curl_[@]}" --interface "127.0.0.$i" "http://127.0.0.1:$proxy_port/") ||
                    die "$proxy tcp: request from 127.0.0.$i failed"
                [[ $out == "HTTP/1.1 200"* ]] || die "$proxy tcp: expected 200, got: ${out%%$'\r'*}"
                out=$(grep -i '^x-backend:' <<<"$out" | tr -d '\r' | awk '{print $2}')
                [[ -z $first ]] && first=$out
                [[ $out == "$first" ]] || die "$proxy tcp: client 127.0.0.$i moved from $first to $out: no source-ip affinity"
            done
            seen+=$first
        done
        [[ $seen == ab || $seen == ba ]] || die "$proxy tcp: two client addresses should land on a and b, got '$seen'"
        return 0
    fi
    cookie=$(cookie_name "$proxy")
    if [[ $group == tls ]]; then
        url="https://127.0.0.1:$proxy_port/" h1=(-k --http1.1) h2=(-k --http2)
    else
        url="http://127.0.0.1:$proxy_port/" h2=(--http2-prior-knowledge)
    fi
    for i in 1 2; do
        out=$("${curl_[@]}" "${h1[@]}" "$url") || die "$proxy: request to $url failed"
        [[ $out == "HTTP/1.1 200"* ]] || die "$proxy: expected 200, got: ${out%%$'\r'*}"
        grep -qi "^set-cookie: $cookie=" <<<"$out" || die "$proxy: fresh request got no '$cookie' cookie:"$'\n'"$out"
        seen+=$(grep -i '^x-backend:' <<<"$out" | tr -d '\r' | awk '{print $2}')
    done
    [[ $seen == ab || $seen == ba ]] || die "$proxy: two fresh requests should land on a and b, got '$seen'"
    for i in a b; do
        out=$("${curl_[@]}" "${h1[@]}" -H "Cookie: $cookie=$i" "$url") || die "$proxy: request failed"
        grep -qi "^x-backend: $i" <<<"$out" || die "$proxy: 'Cookie: $cookie=$i' did not land on $i:"$'\n'"$out"
    done
    if [[ $group == http && " ${modes[*]} " == *" h2c-"* ]]; then
        url="http://127.0.0.1:$(mode_port "$proxy" h2c-m10)/"
    elif [[ $group == tls && " ${modes[*]} " == *" h2-tls "* ]]; then
        url="https://127.0.0.1:$(mode_port "$proxy" h2-tls)/"
    else
        return 0
    fi
    out=$("${curl_[@]}" "${h2[@]}" "$url") || die "$proxy: HTTP/2 request to $url failed (does it take HTTP/2 there?)"
    [[ $out == "HTTP/2 200"* ]] || die "$proxy: expected an HTTP/2 200 from $url, got: ${out%%$'\r'*}"
    grep -qi "^set-cookie: $cookie=" <<<"$out" || die "$proxy: fresh HTTP/2 request got no '$cookie' cookie:"$'\n'"$out"
    for i in a b; do
        out=$("${curl_[@]}" "${h2[@]}" -H "Cookie: $cookie=$i" "$url") || die "$proxy: HTTP/2 request failed"
        grep -qi "^x-backend: $i" <<<"$out" || die "$proxy: HTTP/2 'Cookie: $cookie=$i' did not land on $i:"$'\n'"$out"
    done
    return 0
}

# ---- load --------------------------------------------------------------------------------
# proc_cpu PID: "utime stime" in clock ticks, all threads (fields 14 and 15 of /proc/PID/stat;
# counted after the ") " that ends the command name, which may hold spaces).
proc_cpu() {
    local stat f
    read -r stat <"/proc/$1/stat" || die "cannot read /proc/$1/stat"
    read -r -a f <<<"${stat##*) }"
    echo "${f[11]} ${f[12]}"
}

# core_ticks CORE: "busy total" clock ticks of one core since boot (/proc/stat; steal counts as
# busy: the hypervisor gave the core to someone else).
core_ticks() {
    awk -v c="cpu$1" '$1 == c { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6 }' /proc/stat
}

# other_pct B0 T0 B1 T1 P0 P1: the share of a core that went to anything but our own
# processes on it (other processes, steal), in % of the interval: busy ticks B minus our
# processes' ticks P, over all ticks T.
other_pct() {
    awk -v b0="$1" -v t0="$2" -v b1="$3" -v t1="$4" -v p0="$5" -v p1="$6" \
        'BEGIN { o = (t1 > t0) ? ((b1 - b0) - (p1 - p0)) / (t1 - t0) * 100 : 0; if (o < 0) o = 0; printf "%.0f", o }'
}

# client_ticks: CPU ticks so far of our processes on the client core: the load tools this
# shell has waited for (its cutime and cstime, fields 16 and 17 of /proc/$$/stat: a finished
# wrk or h2load is counted once its `timeout` is reaped), and the nginx backends when they
# run there (the default layout).
backend_pids=()
client_ticks() {
    local stat f n
    read -r stat <"/proc/$$/stat"
    read -r -a f <<<"${stat##*) }"
    n=$((f[13] + f[14]))
    if ((nginx_core == client_core)); then n=$((n + $(backend_ticks))); fi
    echo "$n"
}

# backend_ticks: CPU ticks so far of the nginx backends, masters and their workers.
backend_ticks() {
    local p c stat f n=0
    for p in "${backend_pids[@]}"; do
        for c in "$p" $(cat "/proc/$p/task/$p/children" 2>/dev/null || true); do
            read -r stat <"/proc/$c/stat" 2>/dev/null || continue
            read -r -a f <<<"${stat##*) }"
            n=$((n + f[11] + f[12]))
        done
    done
    echo "$n"
}

# load_snap before|after: the counters other% is computed from. "after" is taken by
# run_load_tool as soon as the load tool is reaped, before its output is parsed.
declare -A snap
load_snap() {
    local b t u s
    read -r b t < <(core_ticks "$proxy_core")
    read -r u s < <(proc_cpu "$proxy_pid")
    snap[$1.pb]=$b snap[$1.pt]=$t snap[$1.p]=$((u + s))
    # Ours on the proxy's core: the proxy, and the backends when they run there.
    snap[$1.po]=${snap[$1.p]}
    if ((nginx_core == proxy_core)); then snap[$1.po]=$((snap[$1.p] + $(backend_ticks))); fi
    read -r b t < <(core_ticks "$client_core")
    snap[$1.cb]=$b snap[$1.ct]=$t snap[$1.c]=$(client_ticks)
}

# wrk reports through this script: one machine-readable line, exact percentiles.
write_wrk_script() {
    cat >"$work/report.lua" <<'EOF'
local cookie = os.getenv("BENCH_COOKIE")
if cookie ~= nil and cookie ~= "" then
  wrk.headers["Cookie"] = cookie
end
if os.getenv("BENCH_CLOSE") == "1" then
  wrk.headers["Connection"] = "close"
end

-- A fixed offered load (BENCH_RATE requests/s for this thread): each request waits for the
-- next slot of an even schedule, one slot per request. A slot missed because every
-- connection was waiting for an answer is not made up for (no burst to catch up): the
-- achieved rate says whether the load was offered whole. wrk's delay() is whole
-- milliseconds, so the sends of one millisecond leave together; the average rate is exact.
local rate = tonumber(os.getenv("BENCH_RATE") or "")
if rate ~= nil and rate > 0 then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
    int clock_gettime(int clk_id, bench_timespec *tp);
  ]]
  local ts = ffi.new("bench_timespec")
  local gap = 1000 / rate
  local next_at = nil
  function delay()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    local now = tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
    if next_at == nil or next_at < now then next_at = now end
    local wait = next_at - now
    next_at = next_at + gap
    return math.floor(wait + 0.5)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH rps=%.1f p50_us=%.0f p99_us=%.0f max_us=%.0f requests=%d errors=%d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max,
    summary.requests, e.connect + e.read + e.write + e.timeout + e.status))
end
EOF
}

# wait_quiet: with quiet_wait > 0, before a measured run, waits until neither core was more
# than 5 % busy over one second (the proxy and the backends are idle between runs, so what
# shows is someone else's work, e.g. a compile), in a bounded poll: quiet_wait is the total
# number of seconds the whole script may spend waiting. Past it, measures anyway (other% in the
# results says how disturbed a run was).
quiet_wait=0
quiet_waited=0
quiet_wait_warned=0
wait_quiet() {
    ((quiet_wait > 0)) || return 0
    local b0 t0 c0 u0 b1 t1 c1 u1 busy said=0
    while ((quiet_waited < quiet_wait)); do
        read -r b0 t0 < <(core_ticks "$proxy_core")
        read -r c0 u0 < <(core_ticks "$client_core")
        sleep 1
        quiet_waited=$((quiet_waited + 1))
        read -r b1 t1 < <(core_ticks "$proxy_core")
        read -r c1 u1 < <(core_ticks "$client_core")
        busy=$(awk -v a=$((b1 - b0)) -v ta=$((t1 - t0)) -v b=$((c1 - c0)) -v tb=$((u1 - u0)) \
            'BEGIN { x = ta > 0 ? a / ta : 0; y = tb > 0 ? b / tb : 0; printf "%.0f", 100 * (x > y ? x : y) }')
        ((busy <= 5)) && return 0
        ((said)) || say "  machine busy ($busy % of a core): waiting for quiet (${quiet_waited}/${quiet_wait} s of --quiet-wait used)"
        said=1
    done
    ((quiet_wait_warned)) || say "  warning: --quiet-wait budget of $quiet_wait s used up; measuring anyway from now on"
    quiet_wait_warned=1
}

# measured_load PROXY MODE SECS [CONNECTIONS]: run_load for a figure that counts. With
# --quiet-wait, waits for quiet first, and redoes a run that something else disturbed (other%
# above 5) while the wait budget lasts, at most twice.
measured_load() {
    local try
    wait_quiet
    run_load "$@"
    for try in 1 2; do
        (($(field other_pct "$load_result") > 5 && quiet_wait > quiet_waited)) || break
        say "  disturbed (other% $(field other_pct "$load_result")): again, $try/2"
        wait_quiet
        run_load "$@"
    done
    return 0
}

# run_load PROXY MODE SECS [CONNECTIONS]: drives the mode for SECS seconds and sets
# load_result to "rps=… p50_us=… p99_us=… max_us=… requests=… errors=… other_pct=…
# other_proxy_pct=… other_client_pct=… cpu_pct=… per_core_rps=…" (errors: socket errors,
# timeouts and non-2xx answers; other_proxy_pct, other_client_pct: CPU of the proxy's core, of
# the client core, taken by anything but our processes during the run; other_pct: the larger;
# client_us: the client core's busy µs per request; cpu_pct: the proxy's own CPU use, 100 =
# one core; per_core_rps: rps * 100 / cpu_pct).
# CONNECTIONS is for wrk modes (h2load modes have theirs in their name). With load_rate set
# (bench/http.sh --same-load), the load tool offers that many requests/s in all instead of
# as many as the proxy takes.
load_rate=""
run_load() {
    local op oc
    load_snap before
    run_load_tool "$@"
    op=$(other_pct "${snap[before.pb]}" "${snap[before.pt]}" "${snap[after.pb]}" "${snap[after.pt]}" \
        "${snap[before.po]}" "${snap[after.po]}")
    oc=$(other_pct "${snap[before.cb]}" "${snap[before.ct]}" "${snap[after.cb]}" "${snap[after.ct]}" \
        "${snap[before.c]}" "${snap[after.c]}")
    load_result+=" other_pct=$((op > oc ? op : oc)) other_proxy_pct=$op other_client_pct=$oc"
    # The client core's busy ticks (all of it, ours or not) per request, in µs: saturated near
    # 1e6 / rps; equal for both proxies, the client core set req/s for both.
    load_result+=" $(awk -v b0="${snap[before.cb]}" -v b1="${snap[after.cb]}" -v n="$(field requests "$load_result")" \
        -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "client_us=%.2f", (n > 0) ? (b1 - b0) * 1e6 / hz / n : 0 }')"
    # The proxy's CPU use in % of one core, and the requests/s it would move with a whole core
    # to itself at that cost: where the load tool's core is the bottleneck (the proxy below
    # ~95 %), req/s says more about the client core than about the proxy; this says what a
    # proxy core buys.
    load_result+=" $(awk -v p0="${snap[before.p]}" -v p1="${snap[after.p]}" -v t0="${snap[before.pt]}" \
        -v t1="${snap[after.pt]}" -v rps="$(field rps "$load_result")" \
        'BEGIN { c = (t1 > t0) ? (p1 - p0) / (t1 - t0) * 100 : 0
                 printf "cpu_pct=%.1f per_core_rps=%.0f", c, (c > 0) ? rps * 100 / c : 0 }')"
}

declare -A tls_info
# The tool runs in the background and is waited for, so a Ctrl-C is handled at once (a trap
# does not run while bash waits on a foreground child) and cleanup stops it. `timeout` bounds
# it whatever happens.
run_load_tool() {
    local proxy=$1 mode=$2 secs=$3 conns=${4:-64} port cookie="" close=0 out=$work/load.out pid c m
    local scheme=http proto=h2c
    port=$(mode_port "$proxy" "$mode")
    [[ $(mode_group "$mode") == tls ]] && scheme=https proto=h2
    [[ $mode == sticky || $mode == close || $mode == h2c-* || $mode == https || $mode == h2-tls ]] &&
        cookie="$(cookie_name "$proxy")=a"
    [[ $mode == close || $mode == tcp-close ]] && close=1
    [[ -f $work/report.lua ]] || write_wrk_script
    if [[ $(mode_tool "$mode") == wrk ]]; then
        # --same-load: each wrk thread offers its share of load_rate.
        BENCH_RATE=$(awk -v r="${load_rate:-0}" -v t="${wrk_threads:-1}" 'BEGIN { print r / t }') \
            BENCH_COOKIE=$cookie BENCH_CLOSE=$close timeout -s KILL $((secs + 30)) taskset -c "$client_core" \
            wrk -t "${wrk_threads:-1}" -c "$conns" -d "${secs}s" --timeout 5s \
            -s "$work/report.lua" "$scheme://127.0.0.1:$port/" >"$out" 2>&1 &
        pid=$!
        pids+=("$pid")
        wait "$pid" || die "wrk failed or timed out ($proxy $mode):"$'\n'"$(cat "$out")"
    load_snap after
        forget_pid "$pid"
        load_result=$(sed -n 's/^BENCH //p' "$out")
        [[ -n $load_result ]] || die "wrk printed no result:"$'\n'"$(cat "$out")"
        return 0
    fi
    case $mode in
        h2c-m10) c=16 m=10 ;;
        h2c-m1) c=16 m=1 ;;
        h2c-c4m16) c=4 m=16 ;;
        h2-tls) c=16 m=10 ;;
        *) die "no h2load settings for mode $mode" ;;
    esac
    rm -f "$work/h2load.log"
    local rps=()
    # --same-load: each of the c clients offers its share of load_rate (h2load's own pacing).
    if [[ -n ${load_rate:-} ]]; then rps=("--rps=$(awk -v r="$load_rate" -v c="$c" 'BEGIN { printf "%.1f", r / c }')"); fi
    timeout -s KILL $((secs + 30)) taskset -c "$client_core" \
        h2load -t 1 -c "$c" -m "$m" -D "$secs" "${rps[@]}" -H "cookie: $cookie" --log-file "$work/h2load.log" \
        "$scheme://127.0.0.1:$port/" >"$out" 2>&1 &
    pid=$!
    pids+=("$pid")
    wait "$pid" || die "h2load failed or timed out ($proxy $mode):"$'\n'"$(cat "$out")"
    load_snap after
    forget_pid "$pid"
    grep -qE "^Application protocol: $proto[[:space:]]*\$" "$out" ||
        die "h2load did not speak $proto to $proxy:"$'\n'"$(cat "$out")"
    # What TLS the two proxies negotiated (version, cipher, key exchange), said once per proxy.
    if [[ $proto == h2 && -z ${tls_info[$proxy]:-} ]]; then
        tls_info[$proxy]=$(awk '/^(TLS Protocol|Cipher|Server Temp Key):/ { sub(/^[^:]*: /, ""); printf "%s%s", sep, $0; sep = ", " }' "$out")
        say "  $proxy TLS: ${tls_info[$proxy]}"
    fi
    # "finished in 5.00s, 12345.60 req/s, ..."; "requests: T total, S started, D done, OK
    # succeeded, F failed, E errored, TO timeout"; "status codes: N 2xx, ...". Latency
    # percentiles from the per-request log (column 3: microseconds to the end of the answer).
    load_result=$(awk -v lf="$work/h2load.log" '
        /^finished in/ { gsub(/,/, ""); rps = $4 }
        /^requests:/ { gsub(/,/, ""); done = $6; failed = $10; errored = $12; tmo = $14 }
        /^status codes:/ { gsub(/,/, ""); ok = $3 }
        END {
            if (rps == "") exit 1
            n = 0
            while ((getline line < lf) > 0) { split(line, f, "\t"); v[++n] = f[3] + 0 }
            if (n == 0) exit 1
            # Percentiles by sorting: an insertion sort is too slow for 10^5 lines, so shell out.
            cmd = "sort -n > \"" lf ".sorted\""
            for (i = 1; i <= n; i++) print v[i] | cmd
            close(cmd)
            i = 0
            while ((getline x < (lf ".sorted")) > 0) s[++i] = x
            p50 = s[int((n - 1) * 0.50) + 1]; p99 = s[int((n - 1) * 0.99) + 1]; mx = s[n]
            printf "rps=%.1f p50_us=%.0f p99_us=%.0f max_us=%.0f requests=%d errors=%d\n",
                rps, p50, p99, mx, done, failed + errored + tmo + (done - ok)
        }' "$out") || die "could not read h2load's result:"$'\n'"$(cat "$out")"
    return 0
}

field() { # field NAME "k=v k=v ..."
    local kv
    for kv in $2; do [[ ${kv%%=*} == "$1" ]] && { echo "${kv#*=}"; return; }; done
    echo 0
}

median() { # median of the arguments, numerically
    printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "null" }'; }
