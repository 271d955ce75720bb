#!/usr/bin/env bash
# Side-by-side HTTP benchmark: limpet vs HAProxy 2.6, same backends, same load, same core.
#
# One run starts two identical nginx backends on loopback, then for each proxy in turn and each
# listener it needs (HTTP, TCP, TLS): starts it pinned to one core, checks that it really balances
# and honours pins, warms it up, and drives every chosen mode through it:
#   sticky     HTTP/1.1 keep-alive, a valid pin cookie on every request (`route=a` /
#              `SERVERID=a`): a pinned client going straight to its node
#   plain      HTTP/1.1 keep-alive, no cookie: every request a fresh pin answered with Set-Cookie
#   close      as sticky, with `Connection: close` on every request (a connection per request)
#   tcp        a TCP listener with source-address affinity (limpet: a source-ip table; HAProxy:
#              mode tcp, stick-table on src), HTTP/1.1 keep-alive through it
#   tcp-close  the same TCP listener, `Connection: close` through it
#   h2c-m10    HTTP/2 cleartext, prior knowledge, pinned by cookie: h2load -c16 -m10
#   h2c-m1     the same, h2load -c16 -m1
#   h2c-c4m16  the same, h2load -c4 -m16
#   https      HTTPS/1.1 keep-alive, pinned by cookie: TLS to the proxy, plaintext HTTP/1.1 to
#              the backends (limpet: a config-file listener with `tls`; HAProxy: `bind ... ssl`)
#   h2-tls     HTTP/2 over TLS (ALPN h2), pinned by cookie: h2load -c16 -m10, same listener
# It prints requests/s and latency (p50, p99) for each, and limpet/HAProxy ratios.
# See bench/README.md for what is measured and how to read it.
#
# Usage: bench/http.sh [options]
#   --modes a,b,c       modes to run (default: all of the above)
#   --duration SECS     length of each measured run (default 10)
#   --warmup SECS       discarded run before measuring each proxy listener (default 2)
#   --connections N     wrk connections (default 64; h2load modes have theirs in their name)
#   --wrk-threads N     wrk threads (default 1)
#   --rounds N          repeat everything N times, report medians (default 1; 3+ for README figures)
#   --order ORDER       interleaved (default): each mode's runs of the two proxies back to back,
#                       the proxy that goes first alternating from mode to mode and round to round,
#                       each run on a freshly started proxy; grouped: all of one proxy's modes, then
#                       all of the other's, each proxy started once per listener group and round
#   --proxy-core C      core the proxy runs on (default 0)
#   --client-core C     core wrk/h2load and the nginx backends run on (default 1)
#   --nginx-core C      core the nginx backends run on instead (default: the client core); with
#                       the proxy's core, the proxy and the backends share one core and the load
#                       tool has the other to itself: the proxy's cost per request then sets
#                       req/s in every mode, where the default layout lets the client core set
#                       it in most
#   --limpet PATH       limpet binary (default: $LIMPET, else target/release/limpet)
#   --build             run `cargo build --release -p limpet` first
#   --only NAME         run one proxy only: limpet or haproxy (no ratios)
#   --versus BIN        measure limpet against another limpet binary (the proxy named "base",
#                       started exactly as limpet) instead of HAProxy: a before/after of two
#                       builds in one sitting, interleaved, with the same ratios and intervals;
#                       with the same binary twice, what this machine's noise alone reads
#   --same-load PCT     after each mode's pair of runs, run both proxies again at one fixed
#                       offered load, PCT % of the lower of the two req/s just measured (wrk:
#                       an even schedule of sends; h2load: --rps), and report their latency
#                       at that same load: the p99 the done-when of issue 12 compares, where a
#                       proxy's cost per request shows as its queueing, not as its throughput
#   --json              print the results as JSON on stdout (the table goes to stderr)
#   --quiet-wait SECS   before each measured run, wait for both cores to be idle (other work,
#                       e.g. a compile, gone), and redo a run disturbed all the same (other%
#                       above 5, twice at most), spending at most SECS waiting in all (default 0)
#   --keep              keep the temporary directory (configs, logs) for inspection
#
# It installs nothing. Missing tools: apt-get install -y haproxy nginx-light wrk nghttp2-client
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
bench_name=bench/http.sh
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

mode_list=$(
    IFS=,
    echo "${all_modes[*]}"
)
duration=10
warmup=2
connections=64
wrk_threads=1
rounds=1
order_kind=interleaved
proxy_core=0
client_core=1
nginx_core=""
limpet_bin=${LIMPET:-$repo/target/release/limpet}
build=0
only=""
base_bin=""
json=0
keep=0
same_load=0

while [[ $# -gt 0 ]]; do
    bench_option "$@"
    if ((opt_words)); then shift "$opt_words"; continue; fi
    case $1 in
        --wrk-threads) wrk_threads=${2:?}; shift 2 ;;
        --rounds) rounds=${2:?}; shift 2 ;;
        --order) order_kind=${2:?}; shift 2 ;;
        --versus) base_bin=${2:?}; shift 2 ;;
        --same-load) same_load=${2:?}; shift 2 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
for v in quiet_wait duration warmup connections wrk_threads rounds proxy_core client_core same_load; do
    is_uint "${!v}" || die "--${v//_/-} wants a whole number, got '${!v}'"
done
((duration > 0 && connections > 0 && wrk_threads > 0 && rounds > 0)) || die "duration, connections, threads and rounds must be > 0"
[[ $order_kind == interleaved || $order_kind == grouped ]] || die "--order takes interleaved or grouped, got '$order_kind'"
((connections >= wrk_threads)) || die "wrk needs at least one connection per thread"
((same_load < 100)) || die "--same-load takes a share of the lower req/s in %, 1 to 99 (0: off)"
((same_load == 0)) || [[ $order_kind == interleaved ]] || die "--same-load needs --order interleaved"
parse_modes "$mode_list"
case $only in
    "") proxies=(limpet haproxy) ;;
    limpet | haproxy) proxies=("$only") ;;
    *) die "--only takes limpet or haproxy" ;;
esac
if [[ -n $base_bin ]]; then
    [[ -z $only ]] || die "--versus and --only do not go together"
    proxies=(limpet base)
fi
# The proxy limpet is measured against, and how the table names it.
other=${proxies[1]:-}
if [[ $other == base ]]; then other_label="base ($base_bin)"; else other_label=HAProxy; fi
wants() { [[ " ${proxies[*]} " == *" $1 "* ]]; }

# ---- tools -------------------------------------------------------------------------------
tools=(nginx wrk curl ss taskset awk timeout)
[[ " ${modes[*]} " == *" h2c-"* || " ${modes[*]} " == *" h2-tls "* ]] && tools+=(h2load)
wants haproxy && tools+=(haproxy)
need_tools "${tools[@]}"

collect_versions
check_cores
wants limpet && check_limpet_bin "$build"
if wants base; then
    [[ -x $base_bin ]] || die "no limpet binary at $base_bin (--versus)"
    "$base_bin" proxy --help >/dev/null 2>&1 || die "$base_bin has no working 'proxy' subcommand"
fi
if wants haproxy; then
    [[ $haproxy_version == *"version 2.6"* ]] || say "warning: issue 3 compares against HAProxy 2.6; this is: $haproxy_version"
fi

# ---- run ---------------------------------------------------------------------------------
bench_setup
start_backends

declare -A results # results[proxy.mode] = "k=v,k=v,...;" records, one per round
mapfile -t groups < <(mode_groups)

say "limpet bench: modes ${modes[*]}; ${duration}s each (wrk -t$wrk_threads -c$connections), $rounds round(s); $(layout)"
# measure PROXY MODE ROUND: one measured run, recorded for the medians.
measure() {
    say "round $3/$rounds: $1 $2..."
    measured_load "$1" "$2" "$duration" "$connections"
    say "  $load_result"
    results[$1.$2]+="${load_result// /,};"
}

# round_rps PROXY MODE: the req/s of PROXY's last measured run of MODE (this round's).
round_rps() {
    local recs
    IFS=';' read -r -a recs <<<"${results[$1.$2]%;}"
    field rps "${recs[-1]//,/ }"
}

# measure_same_load MODE ROUND: the proxies again, each at one offered load, same_load % of
# the lower req/s of this round's pair (with --only, of its own), in the order they just ran;
# recorded as mode "MODE@load", with the offered rate. Waits for quiet like any measured run,
# but does not redo a run for its other%: below saturation that reads 5-20 % in the HTTP/1
# and TCP modes with nothing else running (most likely the kernel's network work done outside
# our processes' own time, which at full load runs inside it), so a redo measures the same.
measure_same_load() {
    local proxy lowest="" r
    for proxy in "${order[@]}"; do
        r=$(round_rps "$proxy" "$1")
        if [[ -z $lowest ]] || awk -v a="$r" -v b="$lowest" 'BEGIN { exit !(a < b) }'; then lowest=$r; fi
    done
    load_rate=$(awk -v r="$lowest" -v p="$same_load" 'BEGIN { printf "%.0f", r * p / 100 }')
    for proxy in "${order[@]}"; do
        "start_$proxy" "$(mode_group "$1")"
        if ((warmup > 0)); then run_load "$proxy" "$1" "$warmup" "$connections"; fi
        say "round $2/$rounds: $proxy $1 at $load_rate req/s..."
        wait_quiet
        run_load "$proxy" "$1" "$duration" "$connections"
        say "  $load_result"
        results[$proxy.$1@load]+="${load_result// /,},offered=$load_rate;"
        stop_proxy "$proxy_pid"
    done
    load_rate=""
}

# Interleaved, a mode's two runs are seconds apart, so a load that comes and goes on this
# shared machine (minutes at a time) falls on both or neither; grouped, they were up to a few
# minutes apart. Each interleaved run starts its proxy afresh and warms it up first.
checked=""
for ((round = 1; round <= rounds; round++)); do
    order=("${proxies[@]}")
    # Alternate which proxy goes first, so drift (thermal, other load) does not favour one.
    if ((round % 2 == 0 && ${#order[@]} == 2)); then order=("${order[1]}" "${order[0]}"); fi
    if [[ $order_kind == interleaved ]]; then
        for group in "${groups[@]}"; do
            for mode in "${modes[@]}"; do
                [[ $(mode_group "$mode") == "$group" ]] || continue
                for proxy in "${order[@]}"; do
                    "start_$proxy" "$group"
                    if [[ " $checked " != *" $proxy.$group "* ]]; then
                        check_proxy "$proxy" "$group"
                        checked+=" $proxy.$group"
                    fi
                    if ((warmup > 0)); then run_load "$proxy" "$mode" "$warmup" "$connections"; fi
                    measure "$proxy" "$mode" "$round"
                    stop_proxy "$proxy_pid"
                done
                if ((same_load > 0)); then measure_same_load "$mode" "$round"; fi
                # The next mode starts with the other proxy.
                if ((${#order[@]} == 2)); then order=("${order[1]}" "${order[0]}"); fi
            done
        done
        continue
    fi
    for proxy in "${order[@]}"; do
        for group in "${groups[@]}"; do
            "start_$proxy" "$group"
            check_proxy "$proxy" "$group"
            first=1
            for mode in "${modes[@]}"; do
                [[ $(mode_group "$mode") == "$group" ]] || continue
                if ((first && warmup > 0)); then run_load "$proxy" "$mode" "$warmup" "$connections"; fi
                first=0
                measure "$proxy" "$mode" "$round"
            done
            stop_proxy "$proxy_pid"
        done
    done
done

# Medians per proxy and mode (and per mode at the same load, "MODE@load").
declare -A med
measured_modes=("${modes[@]}")
if ((same_load > 0)); then for mode in "${modes[@]}"; do measured_modes+=("$mode@load"); done; fi
for proxy in "${proxies[@]}"; do
    for mode in "${measured_modes[@]}"; do
        IFS=';' read -r -a recs <<<"${results[$proxy.$mode]%;}"
        for key in rps p50_us p99_us max_us requests errors other_pct other_proxy_pct other_client_pct cpu_pct per_core_rps offered; do
            vals=()
            for rec in "${recs[@]}"; do vals+=("$(field "$key" "${rec//,/ }")"); done
            med[$proxy.$mode.$key]=$(median "${vals[@]}")
        done
    done
done

ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }

# round_ratios MODE KEY: limpet / HAProxy (or base) for each round's pair of runs, in round order
# ("0.97 1.02 1.01"): how far one pair can stray from the median is this machine's noise.
round_ratios() {
    local l h i out=()
    IFS=';' read -r -a l <<<"${results[limpet.$1]%;}"
    IFS=';' read -r -a h <<<"${results[$other.$1]%;}"
    for ((i = 0; i < ${#l[@]} && i < ${#h[@]}; i++)); do
        out+=("$(awk -v a="$(field "$2" "${l[i]//,/ }")" -v b="$(field "$2" "${h[i]//,/ }")" \
            'BEGIN { if (b > 0) printf "%.2f", a / b; else print "null" }')")
    done
    echo "${out[*]}"
}

# ratio_ci MODE KEY: the geometric mean of the round ratios (round_ratios) and its 95 %
# confidence interval, "gm lo hi" (Student's t on the logs: the rounds are pairs seconds apart,
# so each pair's ratio is one sample of this machine's noise around the true ratio), or
# "gm - -" with one round. An interval that holds 1 says the two proxies are not told apart by
# this run; one above or below 1 says which is faster, noise accounted for.
ratio_ci() {
    # shellcheck disable=SC2046 # one word per round
    awk 'BEGIN {
        split("12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145 2.131", t, " ")
        n = 0
        for (i = 1; i < ARGC; i++) if (ARGV[i] > 0) { l[++n] = log(ARGV[i]); s += l[n] }
        if (n == 0) { print "null null null"; exit }
        m = s / n
        if (n == 1) { printf "%.3f - -\n", exp(m); exit }
        for (i = 1; i <= n; i++) v += (l[i] - m) ^ 2
        q = (n - 1 <= 15) ? t[n - 1] : (n - 1 <= 30 ? 2.05 : 1.96)
        h = q * sqrt(v / (n - 1) / n)
        printf "%.3f %.3f %.3f\n", exp(m), exp(m - h), exp(m + h)
    }' $(round_ratios "$1" "$2")
}

# ci_text MODE KEY: ratio_ci as "0.98-1.06" (or "-").
ci_text() {
    local gm lo hi
    read -r gm lo hi < <(ratio_ci "$1" "$2")
    if [[ $lo == - || $lo == null ]]; then echo "-"; else echo "$lo-$hi"; fi
}

# same_load_lines MODE: the --same-load runs of MODE, a line per proxy and the ratios.
same_load_lines() {
    local proxy k m=$1@load of="of the lower"
    ((${#proxies[@]} == 2)) || of="of its own"
    for proxy in "${proxies[@]}"; do
        k=$proxy.$m
        printf '%-10s %-8s at %.0f req/s offered (%d%% %s): %.0f req/s, p50 %s ms, p99 %s ms, max %s ms, errors %s, other%% %s, cpu%% %.0f\n' \
            "" "$proxy" "${med[$k.offered]}" "$same_load" "$of" "${med[$k.rps]}" "$(ms "${med[$k.p50_us]}")" \
            "$(ms "${med[$k.p99_us]}")" "$(ms "${med[$k.max_us]}")" "${med[$k.errors]}" "${med[$k.other_pct]}" "${med[$k.cpu_pct]}"
    done
    ((${#proxies[@]} == 2)) || return 0
    printf '%-10s %-8s at the same load: p99 %sx (rounds %s; 95%% CI %s), cpu%% %sx (95%% CI %s)\n' "" "ratio" \
        "$(ratio "${med[limpet.$m.p99_us]}" "${med[$other.$m.p99_us]}")" "$(round_ratios "$m" p99_us)" \
        "$(ci_text "$m" p99_us)" "$(ratio "${med[limpet.$m.cpu_pct]}" "${med[$other.$m.cpu_pct]}")" \
        "$(ci_text "$m" cpu_pct)"
}

table() {
    local mode proxy k
    echo "limpet vs $other_label: ${duration}s per mode, median of $rounds round(s) ($order_kind), $(layout), proxies with 1 thread"
    [[ -n $haproxy_version && $other != base ]] && echo "$haproxy_version"
    echo "limpet: $limpet_info"
    echo "$nginx_version; wrk $wrk_version (-t$wrk_threads -c$connections); h2load ${h2load_version:-n/a}; ${cpu_model:-unknown cpu}, $ncpu cores"
    echo
    printf '%-10s %-8s %12s %9s %9s %9s %8s %7s %6s %12s\n' mode proxy "req/s" "p50 ms" "p99 ms" "max ms" errors "other%" "cpu%" "req/core-s"
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            k=$proxy.$mode
            printf '%-10s %-8s %12.0f %9s %9s %9s %8s %7s %6.0f %12.0f\n' "$mode" "$proxy" "${med[$k.rps]}" \
                "$(ms "${med[$k.p50_us]}")" "$(ms "${med[$k.p99_us]}")" "$(ms "${med[$k.max_us]}")" \
                "${med[$k.errors]}" "${med[$k.other_pct]}" "${med[$k.cpu_pct]}" "${med[$k.per_core_rps]}"
        done
        if ((${#proxies[@]} == 2)); then
            printf '%-10s %-8s %11sx %9s %8sx %24s %11sx\n' "$mode" "ratio" \
                "$(ratio "${med[limpet.$mode.rps]}" "${med[$other.$mode.rps]}")" "" \
                "$(ratio "${med[limpet.$mode.p99_us]}" "${med[$other.$mode.p99_us]}")" "" \
                "$(ratio "${med[limpet.$mode.per_core_rps]}" "${med[$other.$mode.per_core_rps]}")"
            printf '%-10s %-8s rounds: %s (p99 %s; per core %s)\n' "" "" \
                "$(round_ratios "$mode" rps)" "$(round_ratios "$mode" p99_us)" \
                "$(round_ratios "$mode" per_core_rps)"
            printf '%-10s %-8s 95%% CI of the round ratios: req/s %s, p99 %s, per core %s\n' "" "" \
                "$(ci_text "$mode" rps)" "$(ci_text "$mode" p99_us)" "$(ci_text "$mode" per_core_rps)"
        fi
        ((same_load > 0)) && same_load_lines "$mode"
    done
    for proxy in "${proxies[@]}"; do
        [[ -n ${tls_info[$proxy]:-} ]] && echo "TLS negotiated with $proxy (h2load): ${tls_info[$proxy]}"
    done
    echo
    for mode in "${modes[@]}"; do printf '%-10s %s\n' "$mode" "${mode_desc[$mode]}"; done
    if ((${#proxies[@]} == 2)); then
        echo "ratio = limpet / $other: req/s above 1 and p99 below 1 favour limpet."
    fi
    echo "errors = socket errors, timeouts and non-2xx answers (should be 0)."
    echo "other% = share of the proxy's core or of the client core (the larger) used by anything but this"
    echo "benchmark during the run (other processes, steal): above a few %, that line is disturbed."
    if ((${#proxies[@]} == 2)); then
        echo "95% CI: of the geometric mean of the round ratios (Student's t on their logs): an interval"
        echo "holding 1 means this run does not tell the proxies apart; with --rounds 1 there is none."
    fi
    if ((same_load > 0)); then
        echo "at ... offered: each proxy again at one fixed load, $same_load% of the lower req/s of the round's"
        echo "pair, the same for both: p99 there is what a request waits at equal load, and cpu% what that"
        echo "load costs each proxy (below 1 favours limpet for both). The req/s after it is what was"
        echo "achieved: where the load tool's core cannot pace that many (wrk makes four epoll_ctl and a"
        echo "timer per paced request, two epoll_ctl unpaced), it falls short of the offered load alike"
        echo "for both. other% reads 5-20 there in the HTTP/1 and TCP modes with nothing else running;"
        echo "same-load runs are not redone for it."
    fi
    if ((nginx_core == client_core)); then
        echo "cpu% = the proxy's own CPU use (100 = one core); below ~95 the client core, not the proxy, set"
        echo "req/s. req/core-s = req/s * 100 / cpu%: the requests one whole proxy core moves at that cost."
    else
        echo "cpu% = the proxy's own CPU use (100 = one core), the nginx backends' not counted."
        echo "req/core-s = req/s * 100 / cpu%: the requests one whole proxy core moves at that cost."
    fi
}

# ci_json MODE KEY: ratio_ci as {"gm": …, "lo": …, "hi": …} (null bounds with one round).
ci_json() {
    local gm lo hi
    read -r gm lo hi < <(ratio_ci "$1" "$2")
    [[ $lo == - ]] && lo=null hi=null
    printf '{"gm": %s, "lo": %s, "hi": %s}' "$gm" "$lo" "$hi"
}

json_out() {
    local first=1 proxy mode k rr pr cr
    printf '{\n  "wrk": {"threads": %d, "connections": %d, "version": "%s"},\n' \
        "$wrk_threads" "$connections" "$wrk_version"
    printf '  "h2load_version": "%s",\n  "duration_s": %d,\n  "rounds": %d,\n  "order": "%s",\n' "$h2load_version" "$duration" "$rounds" "$order_kind"
    printf '  "cores": {"proxy": %d, "client": %d, "nginx": %d, "total": %d},\n' "$proxy_core" "$client_core" "$nginx_core" "$ncpu"
    printf '  "haproxy_version": "%s",\n  "nginx_version": "%s",\n  "limpet_rev": "%s",\n  "limpet_binary": "%s",\n  "versus": "%s",\n' \
        "$haproxy_version" "$nginx_version" "$limpet_rev" "$limpet_bin" "${base_bin:-haproxy}"
    printf '  "results": ['
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            k=$proxy.$mode
            ((first)) || printf ','
            first=0
            printf '\n    {"proxy": "%s", "mode": "%s", "rps": %s, "p50_ms": %s, "p99_ms": %s, "max_ms": %s, "requests": %s, "errors": %s, "other_pct": %s, "other_proxy_pct": %s, "other_client_pct": %s, "cpu_pct": %s, "per_core_rps": %s}' \
                "$proxy" "$mode" "${med[$k.rps]}" "$(ms "${med[$k.p50_us]}")" "$(ms "${med[$k.p99_us]}")" \
                "$(ms "${med[$k.max_us]}")" "${med[$k.requests]}" "${med[$k.errors]}" "${med[$k.other_pct]}" \
                "${med[$k.other_proxy_pct]}" "${med[$k.other_client_pct]}" "${med[$k.cpu_pct]}" "${med[$k.per_core_rps]}"
        done
    done
    printf '\n  ]'
    if ((${#proxies[@]} == 2)); then
        printf ',\n  "ratios": {'
        first=1
        for mode in "${modes[@]}"; do
            ((first)) || printf ', '
            first=0
            rr=$(round_ratios "$mode" rps)
            pr=$(round_ratios "$mode" p99_us)
            cr=$(round_ratios "$mode" per_core_rps)
            printf '"%s": {"rps": %s, "p99": %s, "per_core_rps": %s, "rounds_rps": [%s], "rounds_p99": [%s], "rounds_per_core_rps": [%s], "ci95_rps": %s, "ci95_p99": %s, "ci95_per_core_rps": %s}' "$mode" \
                "$(ratio "${med[limpet.$mode.rps]}" "${med[$other.$mode.rps]}")" \
                "$(ratio "${med[limpet.$mode.p99_us]}" "${med[$other.$mode.p99_us]}")" \
                "$(ratio "${med[limpet.$mode.per_core_rps]}" "${med[$other.$mode.per_core_rps]}")" \
                "${rr// /, }" "${pr// /, }" "${cr// /, }" \
                "$(ci_json "$mode" rps)" "$(ci_json "$mode" p99_us)" "$(ci_json "$mode" per_core_rps)"
        done
        printf '}'
    fi
    if ((same_load > 0)); then
        printf ',\n  "same_load": {"pct": %d, "modes": {' "$same_load"
        first=1
        for mode in "${modes[@]}"; do
            ((first)) || printf ','
            first=0
            printf '\n    "%s": {' "$mode"
            for proxy in "${proxies[@]}"; do
                k=$proxy.$mode@load
                printf '"%s": {"offered_rps": %s, "rps": %s, "p50_ms": %s, "p99_ms": %s, "max_ms": %s, "errors": %s, "other_pct": %s, "cpu_pct": %s}, ' \
                    "$proxy" "${med[$k.offered]}" "${med[$k.rps]}" "$(ms "${med[$k.p50_us]}")" "$(ms "${med[$k.p99_us]}")" \
                    "$(ms "${med[$k.max_us]}")" "${med[$k.errors]}" "${med[$k.other_pct]}" "${med[$k.cpu_pct]}"
            done
            if ((${#proxies[@]} == 2)); then
                pr=$(round_ratios "$mode@load" p99_us)
                printf '"ratios": {"p99": %s, "cpu_pct": %s, "rounds_p99": [%s], "ci95_p99": %s, "ci95_cpu_pct": %s}}' \
                    "$(ratio "${med[limpet.$mode@load.p99_us]}" "${med[$other.$mode@load.p99_us]}")" \
                    "$(ratio "${med[limpet.$mode@load.cpu_pct]}" "${med[$other.$mode@load.cpu_pct]}")" \
                    "${pr// /, }" "$(ci_json "$mode@load" p99_us)" "$(ci_json "$mode@load" cpu_pct)"
            else
                printf '"ratios": null}'
            fi
        done
        printf '\n  }}'
    fi
    printf '\n}\n'
}

if ((json)); then
    table >&2
    json_out
else
    table
fi
