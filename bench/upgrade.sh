#!/usr/bin/env bash
# What clients see while the proxy is replaced under load: a limpet restart (SIGTERM, then the
# new process started once the old no longer listens), a limpet upgrade (`limpet run
# --upgrade-socket`: the new process takes the running one's listening sockets), the same
# upgrade started by SIGUSR2 to the running limpet (it starts its successor itself, as under
# systemd) and, beside them, HAProxy's seamless reload (master-worker, `expose-fd
# listeners`, SIGUSR2 to the master). Same setup as bench/http.sh (bench/lib.sh): two nginx backends, the proxy on one
# core, wrk on the other with `Connection: close` (every request a new connection, so every
# request meets the switch if it can).
#
# Each round: wrk runs --duration s; at half time the proxy is replaced once; wrk's socket
# errors (connect, read, write, timeout) and non-2xx answers are counted. Rounds alternate
# between the four ways. Loopback only; every process stopped by its PID; bounded.
#
# Usage: bench/upgrade.sh [--rounds N] [--duration SECS] [--connections N] [--limpet BIN]
#                         [--keep]
# Needs: nginx, wrk, haproxy (apt-get install -y nginx-light wrk haproxy).
set -euo pipefail
cd "$(dirname "$0")/.."
bench_name=bench/upgrade.sh
# shellcheck source=bench/lib.sh
source bench/lib.sh

rounds=3
duration=6
connections=16
keep=0
limpet_bin=${LIMPET:-target/release/limpet}
while (($#)); do
    case $1 in
        --rounds) rounds=${2:?}; shift 2 ;;
        --duration) duration=${2:?}; shift 2 ;;
        --connections) connections=${2:?}; shift 2 ;;
        --limpet) limpet_bin=${2:?}; shift 2 ;;
        --keep) keep=1; shift ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
done
is_uint "$rounds" && is_uint "$duration" && is_uint "$connections" || die "numbers, please"
((duration >= 2 && duration <= 60 && rounds >= 1 && rounds <= 20)) ||
    die "--duration 2..60, --rounds 1..20"
need_tools nginx wrk haproxy taskset ss
[[ -x $limpet_bin ]] || die "no limpet binary at $limpet_bin (cargo build --release -p limpet)"
proxy_core=0
client_core=1
nginx_core=1
bench_setup
start_backends

# One config file for limpet (a source-ip table, the plain HTTP listener) and one for HAProxy.
limpet_cfg=$work/limpet.toml
{
    limpet_nodes_toml
    cat <<EOF

[[listeners]]
name = "web"
bind = "127.0.0.1:$proxy_port"
node_port = $backend_port
timeouts = { drain = "5s" }
EOF
} >"$limpet_cfg"
"$limpet_bin" check -c "$limpet_cfg" >"$work/check.log" 2>&1 || die "limpet check: $(cat "$work/check.log")"
haproxy_cfg=$work/haproxy.cfg
cat >"$haproxy_cfg" <<EOF
global
    master-worker
    nbthread 1
    stats socket $work/haproxy.sock mode 600 level admin expose-fd listeners
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend web
    bind 127.0.0.1:$proxy_port
    default_backend nodes
backend nodes
    balance roundrobin
    server a $backend_addr_a:$backend_port
    server b $backend_addr_b:$backend_port
EOF
haproxy -c -f "$haproxy_cfg" >"$work/haproxy-check.log" 2>&1 || die "haproxy -c: $(cat "$work/haproxy-check.log")"

# start_run NAME [ARGS...]: a limpet run on the proxy core; sets run_pid.
start_run() {
    local name=$1
    shift
    RUST_LOG=warn taskset -c "$proxy_core" "$limpet_bin" run -c "$limpet_cfg" --threads 1 "$@" \
        >"$work/$name.log" 2>&1 &
    run_pid=$!
    pids+=("$run_pid")
}

# until_not_listening PORT: bounded wait (10 s) until nothing listens on the port.
until_not_listening() {
    local i
    for ((i = 0; i < 1000; i++)); do
        [[ -z $(ss -Hltn "sport = :$1" 2>/dev/null) ]] && return 0
        sleep 0.01
    done
    die "port $1 still listened on after 10 s"
}

# successor_of PID: the limpet that PID started on SIGUSR2 (not this script's child: stopped
# by its PID like the others): the other process with this config on its command line (by
# then PID may have handed over and exited, its child gone to init); bounded wait (10 s).
successor_of() {
    local i p
    for ((i = 0; i < 1000; i++)); do
        p=$(pgrep -f -- "run -c $limpet_cfg " | grep -vx "$1" | head -n1 || true)
        [[ -n $p ]] && { echo "$p"; return 0; }
        sleep 0.01
    done
    die "no successor of pid $1 after 10 s"
}

# wrk's counts: requests, then socket errors and non-2xx, from its report.
wrk_counts() {
    local out=$1 req conn read write timeout non2xx
    req=$(awk '/requests in/ {print $1}' "$out")
    # "  Socket errors: connect 12, read 0, write 0, timeout 0" (absent when all are 0).
    read -r conn read write timeout < <(awk -F'[ ,]+' '/Socket errors/ {print $5, $7, $9, $11}' "$out")
    non2xx=$(awk '/Non-2xx/ {print $NF}' "$out")
    echo "${req:-0} ${conn:-0} ${read:-0} ${write:-0} ${timeout:-0} ${non2xx:-0}"
}

# round WAY N: wrk for $duration s, the proxy replaced at half time.
round() {
    local way=$1 n=$2 out=$work/wrk-$1-$2.txt old new wrk_pid
    case $way in
        restart) start_run "$way-$n-old"; old=$run_pid ;;
        upgrade | usr2) start_run "$way-$n-old" --upgrade-socket "$work/upgrade.sock"; old=$run_pid ;;
        haproxy)
            taskset -c "$proxy_core" haproxy -W -f "$haproxy_cfg" -p "$work/haproxy.pid" \
                >"$work/haproxy-$n.log" 2>&1 &
            old=$!
            pids+=("$old")
            ;;
    esac
    wait_port 127.0.0.1 "$proxy_port" "$old" "$work/$way-$n-old.log" "$way (old)"
    taskset -c "$client_core" wrk -t1 -c"$connections" -d"${duration}s" -H "Connection: close" \
        "http://127.0.0.1:$proxy_port/" >"$out" 2>&1 &
    wrk_pid=$!
    pids+=("$wrk_pid")
    sleep "$((duration / 2))"
    case $way in
        restart)
            kill -TERM "$old"
            until_not_listening "$proxy_port"
            start_run "$way-$n-new"
            new=$run_pid
            ;;
        upgrade)
            start_run "$way-$n-new" --upgrade-socket "$work/upgrade.sock"
            new=$run_pid
            ;;
        usr2)
            kill -USR2 "$old"
            new=$(successor_of "$old")
            pids+=("$new")
            ;;
        haproxy)
            kill -USR2 "$old"
            new=$old
            ;;
    esac
    wait "$wrk_pid" || true
    forget_pid "$wrk_pid"
    [[ $way == haproxy ]] || stop_proxy "$old"
    stop_proxy "$new"
    until_not_listening "$proxy_port"
    printf '%-8s %2d  %s\n' "$way" "$n" "$(wrk_counts "$out")"
}

say "limpet: $limpet_bin; $rounds rounds of ${duration}s per way, wrk -c$connections, Connection: close"
printf '%-8s %2s  %s\n' way round "requests connect-errors read-errors write-errors timeouts non-2xx"
for ((n = 1; n <= rounds; n++)); do
    for way in restart upgrade usr2 haproxy; do round "$way" "$n"; done
done
