#!/usr/bin/env bash
# Per-request cost: limpet vs HAProxy 2.6, same backends, same load, same core, measured the same
# way for both. Where bench/http.sh asks "how fast", this asks "what does one request cost the
# proxy": CPU time, context switches, syscalls, instructions and allocator calls per request.
#
# Same setup as bench/http.sh (bench/lib.sh): two nginx backends on loopback, each proxy pinned
# to one core with one thread, checked to balance and pin before anything is measured. Then for
# each proxy and each chosen mode (see bench/http.sh for the modes):
#   1. a run of --duration s: utime/stime and page faults of the proxy (/proc/PID/stat), its voluntary +
#      involuntary context switches (/proc/PID/task/*/status) before and after, divided by the
#      requests the load tool completed: user µs, sys µs, page faults and context switches per request;
#      and the TCP segments the whole machine sent meanwhile (/proc/net/snmp, Tcp OutSegs: the
#      client's, the proxy's and the nodes', all on loopback) per request;
#   2. a run of --strace-duration s with `strace -c -f -p PID` attached: syscalls per request,
#      and the top ones (strace slows the proxy; this run's req/s is not reported);
#   3. a run of --probe-duration s with perf uprobes on the allocator entry points, counted by
#      `perf stat -p PID`: allocations per request (limpet: mi_malloc_aligned, mi_zalloc_aligned,
#      mi_realloc_aligned of its static mimalloc, and libc malloc/calloc/realloc; HAProxy: libc
#      malloc/calloc/realloc and __pool_alloc, its own pools);
#   3b. with --events LIST, a run of --probe-duration s counting those perf events (kernel
#      tracepoints, e.g. net:net_dev_xmit for packets sent, sched:sched_wakeup, or software
#      events) with `perf stat -p PID`: events per request, for what happens inside the kernel
#      that neither the syscall count nor the CPU time explains;
#   4. the proxy restarted under `valgrind --tool=callgrind`, counters zeroed, a run of
#      --callgrind-duration s, counters dumped (callgrind_control): instructions per request
#      (deterministic), and the allocator calls callgrind saw (used for allocations when
#      uprobes are not available).
# It prints a table (mode x proxy) and, per mode, the top syscalls and the allocator calls by
# entry point. See bench/README.md.
#
# Usage: bench/cost.sh [options]
#   --modes a,b,c            modes (default sticky,plain,close,tcp,h2c-m10; all: see bench/http.sh)
#   --duration SECS          CPU / context-switch run per mode (default 5)
#   --strace-duration SECS   strace run per mode (default 2)
#   --probe-duration SECS    uprobe run per mode (default 2)
#   --callgrind-duration S   callgrind run per mode (default 3)
#   --warmup SECS            discarded run after each proxy start (default 1)
#   --connections N          wrk connections (default 64; h2load modes have theirs in their name)
#   --skip LIST              leave out some of: strace,probes,callgrind
#   --events LIST            perf events to count per request (comma-separated; default none)
#   --alloc-method M         auto (uprobes, else callgrind; default), perf, or callgrind
#   --callgrind-args ARGS    more valgrind options for the callgrind run, split on spaces, e.g.
#                            '--cache-sim=yes' or '--branch-sim=yes' (their events are in the
#                            dump's summary line; with --keep, read them there)
#   --proxy-core C           core the proxy runs on (default 0)
#   --client-core C          core wrk/h2load and the nginx backends run on (default 1)
#   --nginx-core C           core the nginx backends run on instead (default: the client core)
#   --limpet PATH            limpet binary (default: $LIMPET, else target/release/limpet)
#   --build                  run `cargo build --release -p limpet` first
#   --only NAME              run one proxy only: limpet or haproxy
#   --json                   print the results as JSON on stdout (the table goes to stderr)
#   --quiet-wait SECS        before each CPU run, wait for both cores to be idle (other work,
#                            e.g. a compile, gone), and redo a run disturbed all the same
#                            (oth% above 5, twice at most); at most SECS waiting in all (default 0)
#   --keep                   keep the temporary directory (configs, logs, strace and callgrind
#                            output) for inspection
#
# Needs root for strace -p and perf probes (uprobes). Installs nothing. Missing tools:
# apt-get install -y haproxy nginx-light wrk nghttp2-client strace valgrind linux-perf
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
bench_name=bench/cost.sh
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

mode_list=sticky,plain,close,tcp,h2c-m10
duration=5
strace_secs=2
probe_secs=2
callgrind_secs=3
warmup=1
connections=64
skip=""
alloc_method=auto
events=""
callgrind_args=""
proxy_core=0
client_core=1
nginx_core=""
limpet_bin=${LIMPET:-$repo/target/release/limpet}
build=0
only=""
json=0
keep=0

while [[ $# -gt 0 ]]; do
    bench_option "$@"
    if ((opt_words)); then shift "$opt_words"; continue; fi
    case $1 in
        --strace-duration) strace_secs=${2:?}; shift 2 ;;
        --probe-duration) probe_secs=${2:?}; shift 2 ;;
        --callgrind-duration) callgrind_secs=${2:?}; shift 2 ;;
        --skip) skip=${2:?}; shift 2 ;;
        --alloc-method) alloc_method=${2:?}; shift 2 ;;
        --events) events=${2:?}; shift 2 ;;
        --callgrind-args) callgrind_args=${2:?}; shift 2 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
for v in quiet_wait duration strace_secs probe_secs callgrind_secs warmup connections proxy_core client_core; do
    is_uint "${!v}" || die "a whole number is needed for ${v//_/-}, got '${!v}'"
done
((duration > 0 && strace_secs > 0 && probe_secs > 0 && callgrind_secs > 0 && connections > 0)) ||
    die "durations and connections must be > 0"
parse_modes "$mode_list"
case $only in
    "") proxies=(limpet haproxy) ;;
    limpet | haproxy) proxies=("$only") ;;
    *) die "--only takes limpet or haproxy" ;;
esac
wants() { [[ " ${proxies[*]} " == *" $1 "* ]]; }
for s in ${skip//,/ }; do
    [[ $s == strace || $s == probes || $s == callgrind ]] || die "--skip takes strace, probes, callgrind"
done
skips() { [[ ",$skip," == *",$1,"* ]]; }
case $alloc_method in
    auto) ;;
    perf) ! skips probes || die "--alloc-method perf with --skip probes" ;;
    callgrind) ! skips callgrind || die "--alloc-method callgrind with --skip callgrind"
        skip+=",probes" ;;
    *) die "--alloc-method takes auto, perf or callgrind" ;;
esac

# ---- tools -------------------------------------------------------------------------------
tools=(nginx wrk curl ss taskset awk timeout getconf)
[[ " ${modes[*]} " == *" h2c-"* || " ${modes[*]} " == *" h2-tls "* ]] && tools+=(h2load)
wants haproxy && tools+=(haproxy)
skips strace || tools+=(strace)
skips callgrind || tools+=(valgrind callgrind_control)
skips probes && [[ -z $events ]] || tools+=(perf)
need_tools "${tools[@]}"
if ((EUID != 0)); then
    skips strace || say "warning: not root: strace -p may be refused (kernel.yama.ptrace_scope)"
    skips probes || say "warning: not root: perf probes (uprobes) need root; allocations will come from callgrind"
fi

collect_versions
check_cores
wants limpet && check_limpet_bin "$build"
clk_tck=$(getconf CLK_TCK)

bench_setup

# ---- /proc counters ----------------------------------------------------------------------
# proc_ctx PID: voluntary + involuntary context switches, summed over the process's threads.
proc_ctx() {
    local f k v n=0
    for f in "/proc/$1/task/"*/status; do
        while read -r k v _; do
            case $k in voluntary_ctxt_switches: | nonvoluntary_ctxt_switches:) n=$((n + v)) ;; esac
        done <"$f" 2>/dev/null || true
    done
    echo "$n"
}

# proc_faults PID: minor + major page faults, all threads (fields 10 and 12 of /proc/PID/stat).
# Faults are kernel time that no syscall count shows: an allocator that hands memory back to
# the kernel and touches it again pays one per page.
proc_faults() {
    local stat f
    read -r stat <"/proc/$1/stat" || die "cannot read /proc/$1/stat"
    read -r -a f <<<"${stat##*) }"
    echo $((f[7] + f[9]))
}

declare -A r # r[proxy.mode.key]

# tcp_out_segs: TCP segments the machine has sent so far (/proc/net/snmp, Tcp OutSegs). Every
# party's: how a proxy ends and acknowledges its connections shows in the client's and the
# nodes' segments too.
tcp_out_segs() {
    awk '$1 == "Tcp:" { if (!c) { for (i = 2; i <= NF; i++) if ($i == "OutSegs") c = i } else { print $c; exit } }' /proc/net/snmp
}

# calc EXPR with awk (floating point); variables as NAME=VALUE arguments.
calc() {
    local expr=$1 args=() a
    shift
    for a in "$@"; do args+=(-v "$a"); done
    awk "${args[@]}" "BEGIN { print $expr }"
}

note_errors() {
    local e
    e=$(field errors "$load_result")
    r[$1.$2.errors]=$((${r[$1.$2.errors]:-0} + e))
}

# ---- 1. CPU time and context switches -----------------------------------------------------
measure_cpu() {
    local proxy=$1 mode=$2 u0 s0 u1 s1 c0 c1 f0 f1 g0 g1 t0 t1 req k=$1.$2 try
    wait_quiet
    for try in 0 1 2; do
        if ((try)); then
            (($(field other_pct "$load_result") > 5 && quiet_wait > quiet_waited)) || break
            say "  disturbed (other% $(field other_pct "$load_result")): again, $try/2"
            wait_quiet
        fi
        read -r u0 s0 < <(proc_cpu "$proxy_pid")
        c0=$(proc_ctx "$proxy_pid")
        f0=$(proc_faults "$proxy_pid")
        g0=$(tcp_out_segs)
        t0=$EPOCHREALTIME
        run_load "$proxy" "$mode" "$duration" "$connections"
        t1=$EPOCHREALTIME
        read -r u1 s1 < <(proc_cpu "$proxy_pid")
        c1=$(proc_ctx "$proxy_pid")
        f1=$(proc_faults "$proxy_pid")
        g1=$(tcp_out_segs)
    done
    note_errors "$proxy" "$mode"
    req=$(field requests "$load_result")
    ((req > 0)) || die "$proxy $mode: no request completed"
    r[$k.rps]=$(field rps "$load_result")
    r[$k.requests]=$req
    r[$k.other_pct]=$(field other_pct "$load_result")
    r[$k.other_proxy_pct]=$(field other_proxy_pct "$load_result")
    r[$k.other_client_pct]=$(field other_client_pct "$load_result")
    r[$k.user_us]=$(calc '(u1 - u0) / hz * 1e6 / n' u0="$u0" u1="$u1" hz="$clk_tck" n="$req")
    r[$k.sys_us]=$(calc '(s1 - s0) / hz * 1e6 / n' s0="$s0" s1="$s1" hz="$clk_tck" n="$req")
    r[$k.ctx]=$(calc '(c1 - c0) / n' c0="$c0" c1="$c1" n="$req")
    r[$k.faults]=$(calc '(f1 - f0) / n' f0="$f0" f1="$f1" n="$req")
    r[$k.segs]=$(calc '(g1 - g0) / n' g0="$g0" g1="$g1" n="$req")
    r[$k.cpu_pct]=$(calc '((u1 - u0) + (s1 - s0)) / hz / (t1 - t0) * 100' u0="$u0" u1="$u1" s0="$s0" \
        s1="$s1" hz="$clk_tck" t0="$t0" t1="$t1")
    say "  cpu: $load_result user_us=${r[$k.user_us]} sys_us=${r[$k.sys_us]} ctx=${r[$k.ctx]} faults=${r[$k.faults]} segs=${r[$k.segs]} cpu%=${r[$k.cpu_pct]}"
}

# ---- 2. syscalls (strace -c) ---------------------------------------------------------------
measure_syscalls() {
    local proxy=$1 mode=$2 k=$1.$2 out=$work/strace.$1.$2 spid i req
    # With -f, strace attaches to every thread of the process, then says so on stderr
    # ("Process N attached", or "... attached with M threads").
    timeout -s INT $((strace_secs + 60)) strace -c -f -S calls -p "$proxy_pid" -o "$out" 2>"$out.err" &
    spid=$!
    pids+=("$spid")
    for ((i = 0; i < 100; i++)); do
        kill -0 "$spid" 2>/dev/null || die "strace exited at start: $(cat "$out.err")"
        grep -q 'attached' "$out.err" && break
        sleep 0.1
    done
    ((i < 100)) || die "strace did not attach to $proxy ($proxy_pid) within 10 s: $(cat "$out.err")"
    run_load "$proxy" "$mode" "$strace_secs" "$connections"
    kill -INT "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    forget_pid "$spid"
    note_errors "$proxy" "$mode"
    req=$(field requests "$load_result")
    # Rows: % time, seconds, usecs/call, calls, [errors], syscall. Sorted by calls.
    r[$k.syscalls]=$(awk -v n="$req" '$NF == "total" { printf "%.2f", $4 / n; found = 1 } END { if (!found) print "null" }' "$out")
    r[$k.sc_top]=$(awk -v n="$req" '/^-/ { inrows = !inrows; next }
        inrows && $NF != "total" && $4 ~ /^[0-9]+$/ && shown < 6 { printf "%s%s:%.2f", (shown ? " " : ""), $NF, $4 / n; shown++ }' "$out")
    say "  strace: $load_result syscalls/req=${r[$k.syscalls]} (${r[$k.sc_top]})"
}

# ---- 3. allocator calls (perf uprobes) -----------------------------------------------------
# Entry points probed, per proxy (events GROUP:NAME, GROUP unique to this run). Rust's
# GlobalAlloc on mimalloc calls mi_malloc_aligned / mi_zalloc_aligned / mi_realloc_aligned;
# limpet also imports libc malloc and realloc (C dependencies, libc itself). HAProxy allocates
# from its pools (__pool_alloc: pool_alloc() of 2.6 calls it) and from libc; a pool refill from
# libc counts twice (rare once warm).
probe_group=limpetbench$$
probes_added=0
declare -A probe_events  # probe_events[proxy] = comma-separated perf events
declare -A probe_label   # probe_label[group:event] = function name for the report
libc_of() { ldd "$1" 2>/dev/null | awk '$1 ~ /^libc\.so/ {print $3; exit}'; }

bench_on_exit() {
    if ((probes_added)); then perf probe -q -d "$probe_group:*" >/dev/null 2>&1 || true; fi
}

add_probe() { # add_probe PROXY NAME FUNCTION BINARY
    local ev=$probe_group:$2
    perf probe -q -x "$4" -a "$ev=$3" >>"$work/perf-probe.log" 2>&1 || return 1
    probes_added=1
    probe_label[$ev]=$3
    probe_events[$1]+="${probe_events[$1]:+,}$ev"
}

setup_probes() {
    local libc fn
    if wants limpet; then
        for fn in mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned; do
            add_probe limpet "l_$fn" "$fn" "$limpet_bin" || return 1
        done
        libc=$(libc_of "$limpet_bin")
        [[ -n $libc ]] || return 1
        for fn in malloc calloc realloc; do add_probe limpet "l_libc_$fn" "$fn" "$libc" || return 1; done
    fi
    if wants haproxy; then
        add_probe haproxy h_pool_alloc __pool_alloc "$(command -v haproxy)" || return 1
        libc=$(libc_of "$(command -v haproxy)")
        [[ -n $libc ]] || return 1
        for fn in malloc calloc realloc; do add_probe haproxy "h_libc_$fn" "$fn" "$libc" || return 1; done
    fi
    return 0
}

# perf stat runs started disabled and driven through these fifos, so that exactly one load run
# is counted.
perf_fifos=0
open_perf_fifos() {
    ((perf_fifos)) && return 0
    mkfifo "$work/perf.ctl" "$work/perf.ack"
    exec {perf_ctl}<>"$work/perf.ctl" {perf_ack}<>"$work/perf.ack"
    perf_fifos=1
}

use_probes=0
[[ -z $events ]] || open_perf_fifos
if ! skips probes; then
    if setup_probes; then
        use_probes=1
        open_perf_fifos
    else
        say "perf uprobes unavailable (see below); allocations will come from callgrind"
        tail -n 5 "$work/perf-probe.log" >&2 2>/dev/null || true
        bench_on_exit
        probes_added=0
        [[ $alloc_method == perf ]] && die "--alloc-method perf: uprobes do not work here"
        skips callgrind && say "warning: --skip callgrind too: no allocation counts"
    fi
fi

# perf_cmd CMD: sends enable/disable to the running perf stat and waits for its ack.
perf_cmd() {
    local reply=""
    echo "$1" >&"$perf_ctl"
    read -r -t 10 -u "$perf_ack" reply || die "perf stat did not acknowledge '$1'"
    [[ $reply == ack* ]] || die "perf stat answered '$reply' to '$1'"
}

# perf_count_run PROXY MODE EVENTS OUT: `perf stat` of EVENTS on the proxy over one load run
# of --probe-duration, its CSV in OUT. Started disabled (-D -1): counting begins on `enable`
# and stops on `disable`, both acknowledged, so exactly the load run is counted.
perf_count_run() {
    local proxy=$1 mode=$2 ev=$3 out=$4 ppid
    timeout -s INT $((probe_secs + 60)) perf stat -x, -e "$ev" -p "$proxy_pid" \
        -D -1 --control "fd:$perf_ctl,$perf_ack" -o "$out" >"$out.log" 2>&1 &
    ppid=$!
    pids+=("$ppid")
    perf_cmd enable
    run_load "$proxy" "$mode" "$probe_secs" "$connections"
    perf_cmd disable
    kill -INT "$ppid" 2>/dev/null || true
    wait "$ppid" 2>/dev/null || true
    forget_pid "$ppid"
    note_errors "$proxy" "$mode"
}

measure_allocs_perf() {
    local proxy=$1 mode=$2 k=$1.$2 out=$work/perf.$1.$2 req
    perf_count_run "$proxy" "$mode" "${probe_events[$proxy]}" "$out"
    req=$(field requests "$load_result")
    # Lines: COUNT,UNIT,EVENT,... (COUNT is "<not counted>" when the event could not count).
    r[$k.allocs_perf_detail]=$(awk -F, -v n="$req" -v labels="$(for e in "${!probe_label[@]}"; do printf '%s=%s;' "$e" "${probe_label[$e]}"; done)" '
        BEGIN { c = split(labels, l, ";"); for (i = 1; i <= c; i++) { split(l[i], kv, "="); name[kv[1]] = kv[2] } }
        $3 ~ /:/ { if ($1 !~ /^[0-9]+$/) { bad = 1; next }
                   printf "%s%s:%.2f", (shown++ ? " " : ""), name[$3], $1 / n }
        END { if (bad || !shown) exit 1 }' "$out") || die "perf stat counted nothing for $proxy: $(cat "$out" "$out.log")"
    r[$k.allocs_perf]=$(awk -v d="${r[$k.allocs_perf_detail]}" 'BEGIN { c = split(d, p, " "); for (i = 1; i <= c; i++) { split(p[i], kv, ":"); s += kv[2] } printf "%.2f", s }')
    say "  uprobes: $load_result allocs/req=${r[$k.allocs_perf]} (${r[$k.allocs_perf_detail]})"
}

# measure_events PROXY MODE: the --events counted over one load run, per request.
measure_events() {
    local proxy=$1 mode=$2 k=$1.$2 out=$work/events.$1.$2 req
    perf_count_run "$proxy" "$mode" "$events" "$out"
    req=$(field requests "$load_result")
    # Lines: COUNT,UNIT,EVENT,... (COUNT is "<not counted>" or "<not supported>" when it could
    # not). Kept as EVENT=PER_REQUEST: event names hold colons.
    r[$k.events]=$(awk -F, -v n="$req" '
        NF >= 3 && $3 != "" { printf "%s%s=%s", (shown++ ? " " : ""), $3, ($1 ~ /^[0-9]+$/ ? sprintf("%.3f", $1 / n) : "null") }
        END { if (!shown) exit 1 }' "$out") || die "perf stat counted nothing for $proxy: $(cat "$out" "$out.log")"
    say "  events: $load_result ${r[$k.events]}"
}

# ---- 4. instructions and allocator calls (callgrind) -----------------------------------------
# Allocator entry points callgrind reports calls to (libc's malloc may carry an alias name).
alloc_fns_limpet="mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned malloc calloc realloc"
alloc_fns_haproxy="__pool_alloc malloc calloc realloc"

# callgrind_read FILE REQUESTS FUNCTIONS: prints "IR DETAIL" (DETAIL: fn:calls/req,...).
callgrind_read() {
    awk -v n="$2" -v fns="$3" '
        BEGIN { c = split(fns, f, " "); for (i = 1; i <= c; i++) want[f[i]] = 1
                alias["__libc_malloc"] = "malloc"; alias["__libc_calloc"] = "calloc"; alias["__libc_realloc"] = "realloc"
                alias["__malloc"] = "malloc"; alias["__calloc"] = "calloc"; alias["__realloc"] = "realloc" }
        /^summary:/ { ir = $2 }
        /^cfn=/ { cur = substr($0, 5); sub(/\047[0-9]+$/, "", cur); if (cur in alias) cur = alias[cur]; next }
        /^calls=/ { split(substr($0, 7), a, " "); if (cur in want) calls[cur] += a[1]; next }
        END {
            if (ir == "") exit 1
            d = ""
            for (i = 1; i <= c; i++) d = d sprintf("%s%s:%.2f", (i > 1 ? "," : ""), f[i], calls[f[i]] / n)
            printf "%s %s\n", ir, d
        }' "$1"
}

measure_callgrind_group() {
    local proxy=$1 group=$2 mode first=1 dump=0 base req ir detail k fns
    proxy_wrap=(valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.$proxy.$group.%p"
        --compress-strings=no --compress-pos=no --dump-instr=no --log-file="$work/valgrind.$proxy.$group.log")
    # Several options in one argument: split on spaces (no glob expansion).
    local -a extra=()
    read -ra extra <<<"$callgrind_args"
    proxy_wrap+=("${extra[@]}")
    proxy_start_secs=120
    "start_$proxy" "$group"
    proxy_wrap=()
    proxy_start_secs=10
    base=$work/callgrind.$proxy.$group.$proxy_pid
    check_proxy "$proxy" "$group"
    fns=alloc_fns_$proxy
    for mode in "${modes[@]}"; do
        [[ $(mode_group "$mode") == "$group" ]] || continue
        k=$proxy.$mode
        if ((first && warmup > 0)); then run_load "$proxy" "$mode" "$warmup" "$connections"; fi
        first=0
        timeout 60 callgrind_control -z "$proxy_pid" >>"$work/callgrind_control.log" 2>&1 ||
            die "callgrind_control -z failed (see $work/callgrind_control.log)"
        run_load "$proxy" "$mode" "$callgrind_secs" "$connections"
        timeout 60 callgrind_control -d "$proxy_pid" >>"$work/callgrind_control.log" 2>&1 ||
            die "callgrind_control -d failed (see $work/callgrind_control.log)"
        dump=$((dump + 1))
        [[ -s $base.$dump ]] || die "callgrind wrote no dump $base.$dump"
        note_errors "$proxy" "$mode"
        req=$(field requests "$load_result")
        read -r ir detail < <(callgrind_read "$base.$dump" "$req" "${!fns}") || die "cannot read $base.$dump"
        r[$k.cg_rps]=$(field rps "$load_result")
        r[$k.instr]=$(calc 'ir / n' ir="$ir" n="$req")
        r[$k.allocs_cg_detail]=${detail//,/ }
        r[$k.allocs_cg]=$(awk -v d="$detail" 'BEGIN { c = split(d, p, ","); for (i = 1; i <= c; i++) { split(p[i], kv, ":"); s += kv[2] } printf "%.2f", s }')
        say "  callgrind: $load_result instr/req=$(printf '%.0f' "${r[$k.instr]}") allocs/req=${r[$k.allocs_cg]} ($detail)"
    done
    stop_proxy "$proxy_pid"
}

# ---- run ---------------------------------------------------------------------------------
start_backends
mapfile -t groups < <(mode_groups)
t_start=$SECONDS
say "limpet cost: modes ${modes[*]}; cpu ${duration}s, strace ${strace_secs}s, uprobes ${probe_secs}s, callgrind ${callgrind_secs}s per mode; $(layout)"
for proxy in "${proxies[@]}"; do
    for group in "${groups[@]}"; do
        "start_$proxy" "$group"
        check_proxy "$proxy" "$group"
        first=1
        for mode in "${modes[@]}"; do
            [[ $(mode_group "$mode") == "$group" ]] || continue
            if ((first && warmup > 0)); then run_load "$proxy" "$mode" "$warmup" "$connections"; fi
            first=0
            say "$proxy $mode:"
            measure_cpu "$proxy" "$mode"
            skips strace || measure_syscalls "$proxy" "$mode"
            ((use_probes)) && measure_allocs_perf "$proxy" "$mode"
            [[ -z $events ]] || measure_events "$proxy" "$mode"
        done
        stop_proxy "$proxy_pid"
    done
    if ! skips callgrind; then
        for group in "${groups[@]}"; do
            say "$proxy under callgrind ($group listener):"
            measure_callgrind_group "$proxy" "$group"
        done
    fi
done
say "done in $((SECONDS - t_start)) s"

# ---- report ------------------------------------------------------------------------------
get() { echo "${r[$1]:-null}"; }
num() { # num FORMAT VALUE: formatted, or "-" for a missing value
    # shellcheck disable=SC2059 # the format is the caller's
    if [[ $2 == null || -z $2 ]]; then echo "-"; else printf "$1" "$2"; fi
}
allocs_of() { # the allocation figure the table shows: uprobes when measured, else callgrind
    if [[ -n ${r[$1.allocs_perf]:-} ]]; then echo "${r[$1.allocs_perf]}"; else get "$1.allocs_cg"; fi
}
ratio_or_dash() { # limpet/haproxy as "1.234x", or "-" when a figure is missing
    local q
    if [[ $1 == null || $2 == null ]]; then echo "-"; return; fi
    q=$(ratio "$1" "$2")
    if [[ $q == null ]]; then echo "-"; else echo "${q}x"; fi
}

table() {
    local mode proxy k
    echo "limpet vs HAProxy, cost per request: $(layout), proxies with 1 thread"
    [[ -n $haproxy_version ]] && echo "$haproxy_version"
    echo "limpet: $limpet_info"
    echo "$nginx_version; wrk $wrk_version (-t1 -c$connections); h2load ${h2load_version:-n/a}; ${cpu_model:-unknown cpu}, $ncpu cores"
    echo "cpu ${duration}s, strace ${strace_secs}s, uprobes ${probe_secs}s, callgrind ${callgrind_secs}s per mode"
    echo
    printf '%-10s %-8s %9s %5s %5s %8s %8s %7s %7s %6s %9s %9s %8s\n' mode proxy "req/s" "cpu%" "oth%" "user us" "sys us" "ctx sw" faults segs syscalls instr allocs
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            k=$proxy.$mode
            printf '%-10s %-8s %9s %5s %5s %8s %8s %7s %7s %6s %9s %9s %8s%s\n' "$mode" "$proxy" \
                "$(num %.0f "$(get "$k.rps")")" "$(num %.0f "$(get "$k.cpu_pct")")" "$(get "$k.other_pct")" \
                "$(num %.2f "$(get "$k.user_us")")" "$(num %.2f "$(get "$k.sys_us")")" \
                "$(num %.3f "$(get "$k.ctx")")" "$(num %.3f "$(get "$k.faults")")" "$(num %.1f "$(get "$k.segs")")" \
                "$(num %.2f "$(get "$k.syscalls")")" \
                "$(num %.0f "$(get "$k.instr")")" "$(num %.1f "$(allocs_of "$k")")" \
                "$( ((${r[$k.errors]:-0} == 0)) || echo "  (${r[$k.errors]} errors!)")"
        done
        if ((${#proxies[@]} == 2)); then
            printf '%-10s %-8s %9s %5s %5s %8s %8s %7s %7s %6s %9s %9s %8s\n' "$mode" ratio \
                "$(ratio_or_dash "$(get "limpet.$mode.rps")" "$(get "haproxy.$mode.rps")")" "" "" \
                "$(ratio_or_dash "$(get "limpet.$mode.user_us")" "$(get "haproxy.$mode.user_us")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.sys_us")" "$(get "haproxy.$mode.sys_us")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.ctx")" "$(get "haproxy.$mode.ctx")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.faults")" "$(get "haproxy.$mode.faults")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.segs")" "$(get "haproxy.$mode.segs")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.syscalls")" "$(get "haproxy.$mode.syscalls")")" \
                "$(ratio_or_dash "$(get "limpet.$mode.instr")" "$(get "haproxy.$mode.instr")")" \
                "$(ratio_or_dash "$(allocs_of "limpet.$mode")" "$(allocs_of "haproxy.$mode")")"
        fi
    done
    echo
    echo "Per request. From the cpu run: req/s, cpu% (the proxy's CPU use, 100 = one core) and oth% (the share"
    echo "of the proxy's or the client core, the larger, used by anything else: above a few %, disturbed)."
    echo "user/sys us: CPU microseconds; ctx sw: context switches; faults: page faults; segs: TCP segments"
    echo "sent by the whole machine (client, proxy, nodes: /proc/net/snmp); syscalls: strace -c;"
    echo "instr: instructions (callgrind); allocs: allocator calls ($( ((use_probes)) && echo "perf uprobes" || echo "callgrind calls"))."
    ((${#proxies[@]} == 2)) && echo "ratio = limpet / haproxy: below 1 favours limpet (req/s: above 1)."
    echo
    echo "Top syscalls per request (strace):"
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            printf '  %-10s %-8s %s\n' "$mode" "$proxy" "${r[$proxy.$mode.sc_top]:--}"
        done
    done
    echo
    if [[ -n $events ]]; then
        echo "perf events per request:"
        for mode in "${modes[@]}"; do
            for proxy in "${proxies[@]}"; do
                printf '  %-10s %-8s %s\n' "$mode" "$proxy" "${r[$proxy.$mode.events]:--}"
            done
        done
        echo
    fi
    echo "Allocator calls per request by entry point, those above 0.00 (uprobes | callgrind):"
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            printf '  %-10s %-8s %s | %s\n' "$mode" "$proxy" "$(nonzero "${r[$proxy.$mode.allocs_perf_detail]:--}")" \
                "$(nonzero "${r[$proxy.$mode.allocs_cg_detail]:--}")"
        done
    done
    echo
    for mode in "${modes[@]}"; do printf '%-10s %s\n' "$mode" "${mode_desc[$mode]}"; done
}

nonzero() { # "a:1.00 b:0.00" -> "a:1.00"
    local p out=()
    for p in $1; do [[ $p == *:0.00 ]] || out+=("$p"); done
    echo "${out[*]:--}"
}

json_pairs() { # "a:1 b:2" -> {"a": 1, "b": 2}; with SEP as $2 ("a=1"), another separator
    awk -v d="$1" -v sep="${2:-:}" 'BEGIN { c = split(d, p, " "); printf "{"
        for (i = 1; i <= c; i++) { split(p[i], kv, sep); printf "%s\"%s\": %s", (i > 1 ? ", " : ""), kv[1], kv[2] }
        printf "}" }'
}

json_out() {
    local first=1 proxy mode k key
    printf '{\n  "durations_s": {"cpu": %d, "strace": %d, "uprobes": %d, "callgrind": %d},\n' \
        "$duration" "$strace_secs" "$probe_secs" "$callgrind_secs"
    printf '  "wrk": {"connections": %d, "version": "%s"},\n  "h2load_version": "%s",\n' "$connections" "$wrk_version" "$h2load_version"
    printf '  "cores": {"proxy": %d, "client": %d, "nginx": %d, "total": %d},\n' "$proxy_core" "$client_core" "$nginx_core" "$ncpu"
    printf '  "haproxy_version": "%s",\n  "nginx_version": "%s",\n  "limpet_rev": "%s",\n  "limpet_binary": "%s",\n' \
        "$haproxy_version" "$nginx_version" "$limpet_rev" "$limpet_bin"
    printf '  "allocs_from": "%s",\n  "results": [' "$( ((use_probes)) && echo uprobes || echo callgrind)"
    for mode in "${modes[@]}"; do
        for proxy in "${proxies[@]}"; do
            k=$proxy.$mode
            ((first)) || printf ','
            first=0
            printf '\n    {"proxy": "%s", "mode": "%s"' "$proxy" "$mode"
            for key in rps cpu_pct other_pct other_proxy_pct other_client_pct user_us sys_us ctx faults segs syscalls instr allocs_perf allocs_cg requests errors; do
                printf ', "%s": %s' "$key" "$(get "$k.$key")"
            done
            printf ', "syscalls_top": %s' "$(json_pairs "${r[$k.sc_top]:-}")"
            printf ', "allocs_perf_by_fn": %s' "$(json_pairs "${r[$k.allocs_perf_detail]:-}")"
            printf ', "allocs_cg_by_fn": %s' "$(json_pairs "${r[$k.allocs_cg_detail]:-}")"
            printf ', "events": %s}' "$(json_pairs "${r[$k.events]:-}" =)"
        done
    done
    printf '\n  ]\n}\n'
}

if ((json)); then
    table >&2
    json_out
else
    table
fi
