#!/usr/bin/env bash
# Coverage-guided fuzzing of the wire reader, the decision and the NATS
# header path (fuzz/, cargo-fuzz layout, libFuzzer).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Builds the fuzz targets once, then runs each given target (default: all of
# them) for SECONDS_PER_TARGET (default 60) and prints, per target, the inputs
# executed and whether it crashed. Exits 1 when any target crashed (the
# crashing input is kept under fuzz/artifacts/<target>/; replay it with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz <target> <file>`) or a
# run was interrupted, 2 on a usage or setup error.
#
# Toolchain: cargo-fuzz needs nightly-only rustc flags (-Zsanitizer,
# sancov instrumentation options); the stable toolchain accepts them with
# RUSTC_BOOTSTRAP=1, which this script sets. cargo-fuzz is installed when
# missing.
#
# Corpus: the curated seeds in fuzz/corpus/<target>/ are only read. What the
# fuzzer finds goes to fuzz/work/corpus/<target>/ (git-ignored), and is
# reused by the next run on the same checkout.
#
# Environment:
#   FUZZ_SANITIZER  address (default) or none. Our code and the parts of its
#                   dependencies it reaches are safe Rust, so `none` loses
#                   little; see fuzz/README.md for the speed figures.
#   FUZZ_LOG_DIR    where each target's libFuzzer log goes (default fuzz/work/logs)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
}

seconds=60
if [ $# -gt 0 ]; then
    case "$1" in
        '' | *[!0-9]*) usage ;;
        *) seconds=$1 ;;
    esac
    shift
fi
[ "$seconds" -gt 0 ] || usage

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install --locked --quiet cargo-fuzz
fi

all_targets=$(cargo fuzz list --fuzz-dir fuzz)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    read -ra targets <<<"$(echo "$all_targets" | tr '\n' ' ')"
fi
for t in "${targets[@]}"; do
    if ! grep -qx -- "$t" <<<"$all_targets"; then
        echo "fuzz.sh: no fuzz target named $t; the targets are: $(echo "$all_targets" | tr '\n' ' ')" >&2
        exit 2
    fi
done

sanitizer=${FUZZ_SANITIZER:-address}
# Release build with debug assertions and overflow checks (-a): an overflow
# in a length computation is exactly what the targets look for.
build_args=(--fuzz-dir fuzz --release --debug-assertions --sanitizer "$sanitizer")

logs=${FUZZ_LOG_DIR:-fuzz/work/logs}
mkdir -p "$logs"
logs_build="$logs/build.log"
if [ ! -d fuzz/target ]; then
    echo "fuzz.sh: first build of the fuzz targets in this checkout (every dependency, instrumented): several minutes on a 2-core machine" >&2
fi
build_start=$(date +%s)
# All targets in one cargo invocation: they share every compiled crate.
if ! cargo fuzz build "${build_args[@]}" >"$logs_build" 2>&1; then
    tail -n 30 "$logs_build" >&2
    echo "fuzz.sh: the fuzz targets do not build (log: $logs_build)" >&2
    exit 2
fi
echo "fuzz.sh: build took $(($(date +%s) - build_start)) s" >&2

crashed=0
failed=0
results=()
for t in "${targets[@]}"; do
    work="fuzz/work/corpus/$t"
    artifacts="fuzz/artifacts/$t"
    mkdir -p "$work" "$artifacts" "fuzz/corpus/$t"
    log="$logs/$t.log"
    start=$(date +%s)
    rc=0
    # The first corpus directory is where libFuzzer adds what it finds; the
    # curated seeds after it are only read.
    cargo fuzz run "${build_args[@]}" "$t" "$work" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
    took=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    if [ -z "$crash" ] && grep -q "libFuzzer: run interrupted" "$log"; then
        # Stopped from outside (SIGINT): not a crash, but not a full run.
        failed=1
        status="INTERRUPTED after ${execs:-?} executions"
    elif [ "$rc" -ne 0 ] || [ -n "$crash" ]; then
        crashed=1
        status="CRASH (exit $rc): ${crash:-see $log}"
        grep -m 3 -E "panicked at|ERROR: |SUMMARY" "$log" | sed "s/^/  $t: /" >&2 || true
    else
        status="ok"
    fi
    results+=("$(printf '%-16s %6s s %12s executions  %s' "$t" "$took" "${execs:-?}" "$status")")
done

echo "fuzz.sh: $seconds s per target, sanitizer $sanitizer, logs in $logs"
printf '  %s\n' "${results[@]}"
if [ "$crashed" -ne 0 ]; then
    echo "fuzz.sh: FAILED: a target crashed" >&2
    exit 1
fi
if [ "$failed" -ne 0 ]; then
    echo "fuzz.sh: FAILED: a run was interrupted" >&2
    exit 1
fi
