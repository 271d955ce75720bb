#!/usr/bin/env bash
# A profile-guided build of limpet (PGO): the same code, laid out by what the data plane does.
#
# Three steps, each in its own target directory so the ordinary release build is untouched:
#   1. build limpet instrumented (`-Cprofile-generate`) into target/pgo-gen;
#   2. train it: `bench/http.sh --only limpet` over every mode (HTTP/1.1 keep-alive, no cookie,
#      `Connection: close`, the TCP listener, HTTP/2 cleartext, HTTPS and HTTP/2 over TLS) for
#      --train-duration s each, the instrumented binary counting which branches and calls run;
#      the profile is written as each limpet exits on SIGTERM;
#   3. merge the counts (`llvm-profdata merge`) and build limpet with them (`-Cprofile-use`)
#      into target/pgo: release/limpet there is the optimised binary.
# Why: limpet's keep-alive loop is small enough to stay in the instruction cache, but its
# `Connection: close` and HTTP/2 paths run through much more code (accept, hyper's connection
# set-up, h2's frame and HPACK code) than fits; what limits them is the code's footprint, not
# its instruction count (README, "Where the rest of the time goes"). A profile lets LLVM put
# the hot blocks together and the cold ones (errors, limits, logging) out of the way, and
# inline by measured call counts instead of guesses.
#
# Usage: bench/pgo.sh [--train-duration SECS] [--modes a,b,c]
#   --train-duration SECS   length of each training run (default 3)
#   --modes a,b,c           the modes trained on (default: every mode of bench/http.sh)
# Then: bench/http.sh --limpet target/pgo/release/limpet
#
# Needs what bench/http.sh needs (haproxy is not started: --only limpet), and an
# llvm-profdata that reads the raw profiles of this rustc's LLVM: rustup's llvm-tools
# component, or Debian's llvm-19 or newer (`apt-get install -y llvm-19`; LLVM 19's reader takes
# the raw profiles of rustc 1.95's LLVM 22). Installs nothing. Takes two full release builds
# (fat LTO, 6-8 minutes each on 2 cores) and the training: 14.5 minutes in all, measured.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
train_duration=3
modes=""
bench_name=bench/pgo.sh
# For its die and is_uint only (sourcing starts nothing; http.sh sources it again itself).
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

while [[ $# -gt 0 ]]; do
    case $1 in
        --train-duration) train_duration=${2:?}; shift 2 ;;
        --modes) modes=${2:?}; shift 2 ;;
        -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
is_uint "$train_duration" && ((train_duration > 0)) || die "--train-duration takes whole seconds above 0"

# The newest llvm-profdata at hand: rustup's (matches rustc's LLVM), else Debian's, newest
# version first. LLVM 14's (Debian's default llvm-profdata) cannot read these profiles.
profdata=""
sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
if [[ -x $sysroot/lib/rustlib/$host/bin/llvm-profdata ]]; then
    profdata=$sysroot/lib/rustlib/$host/bin/llvm-profdata
else
    for v in 22 21 20 19; do
        if [[ -x /usr/lib/llvm-$v/bin/llvm-profdata ]]; then
            profdata=/usr/lib/llvm-$v/bin/llvm-profdata
            break
        fi
    done
fi
[[ -n $profdata ]] || die "no llvm-profdata of LLVM 19 or newer: rustup component add llvm-tools, or apt-get install -y llvm-19"

gen_dir=$repo/target/pgo-gen
use_dir=$repo/target/pgo
raw=$gen_dir/profiles
merged=$gen_dir/limpet.profdata
rm -rf "$raw" "$merged"
mkdir -p "$raw"

cd "$repo"
echo "bench/pgo.sh: 1/3 instrumented build (target/pgo-gen)" >&2
CARGO_TARGET_DIR=$gen_dir RUSTFLAGS="-Cprofile-generate=$raw" \
    cargo build --release --locked -p limpet

echo "bench/pgo.sh: 2/3 training, ${train_duration}s per mode" >&2
train=(--only limpet --rounds 1 --duration "$train_duration" --warmup 0
    --limpet "$gen_dir/release/limpet")
[[ -z $modes ]] || train+=(--modes "$modes")
"$here/http.sh" "${train[@]}" >/dev/null
shopt -s nullglob
profiles=("$raw"/*.profraw)
((${#profiles[@]} > 0)) || die "training wrote no profile into $raw (did limpet exit on SIGTERM?)"
"$profdata" merge -o "$merged" "${profiles[@]}"

echo "bench/pgo.sh: 3/3 optimised build (target/pgo)" >&2
# The dependencies' build scripts ran instrumented too, and their counts are merged in; they
# match nothing in limpet's binary.
CARGO_TARGET_DIR=$use_dir RUSTFLAGS="-Cprofile-use=$merged" \
    cargo build --release --locked -p limpet
echo "$use_dir/release/limpet"
