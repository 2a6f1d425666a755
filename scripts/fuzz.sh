#!/usr/bin/env bash
# Coverage-guided fuzzing of the wire reader, the decision and the NATS
# header path (fuzz/, cargo-fuzz layout, libFuzzer).
#
#   scripts/fuzz.sh [--smoke] [SECONDS_PER_TARGET] [TARGET...]
#
# Builds the fuzz targets once, then runs each given target (default: all of
# them) for SECONDS_PER_TARGET (default 60) and prints, per target, the inputs
# executed and whether it crashed. Exits 1 when any target crashed (the
# crashing input is kept under fuzz/artifacts/<target>/; replay it with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz <target> <file>`, or the
# binary the smoke ran with the file as its argument) or a run was
# interrupted, 2 on a usage or setup error.
#
# Two builds:
#   default   cargo-fuzz: release, debug assertions and overflow checks,
#             AddressSanitizer, every crate instrumented, in fuzz/target.
#             The first build compiles every dependency again (about 400 s
#             on a 2-core machine). For the long runs.
#   --smoke   what scripts/test.sh runs: plain `cargo build` of the fuzz
#             crate in the top-level target/ (dev profile: debug assertions
#             and overflow checks), with libFuzzer's coverage instrumentation
#             on the worker's library, the vendored NATS client and the fuzz
#             crate only (fuzz/sancov-rustc.sh), no sanitizer. It reuses the
#             dependencies the test build compiled, so after the tests it
#             builds in about a minute, and runs the targets all at once.
#
# Toolchain: cargo-fuzz needs nightly-only rustc flags (-Zsanitizer,
# sancov instrumentation options); the stable toolchain accepts them with
# RUSTC_BOOTSTRAP=1, which this script sets for cargo-fuzz. cargo-fuzz is
# installed when missing. The smoke needs neither: its flags are stable.
#
# Corpus: the curated seeds in fuzz/corpus/<target>/ are only read. What the
# fuzzer finds goes to fuzz/work/corpus/<target>/ (git-ignored), and is
# reused by the next run on the same checkout.
#
# Environment:
#   FUZZ_SANITIZER  address (default) or none, for cargo-fuzz builds. Our
#                   code and the parts of its dependencies it reaches are
#                   safe Rust, so `none` loses little; see fuzz/README.md for
#                   the speed figures.
#   FUZZ_LOG_DIR    where each target's libFuzzer log goes (default fuzz/work/logs)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: $0 [--smoke] [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
}

smoke=0
if [ "${1:-}" = "--smoke" ]; then
    smoke=1
    shift
fi
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
# The targets are the fuzz crate's binaries, one file each.
all_targets=$(for f in fuzz/fuzz_targets/*.rs; do basename "$f" .rs; done)
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

logs=${FUZZ_LOG_DIR:-fuzz/work/logs}
mkdir -p "$logs"
logs_build="$logs/build.log"
build_start=$(date +%s)
if [ "$smoke" -eq 1 ]; then
    sanitizer=none
    target_dir=${CARGO_TARGET_DIR:-$PWD/target}
    # All targets in one cargo invocation: they share every compiled crate.
    if ! (cd fuzz && RUSTC_WRAPPER="$PWD/sancov-rustc.sh" CARGO_TARGET_DIR="$target_dir" \
        cargo build --locked --bins) >"$logs_build" 2>&1; then
        tail -n 30 "$logs_build" >&2
        echo "fuzz.sh: the fuzz targets do not build (log: $logs_build)" >&2
        exit 2
    fi
    run_target() { # run_target TARGET LIBFUZZER_ARGS...
        local t=$1
        shift
        "$target_dir/debug/$t" "$@"
    }
else
    export RUSTC_BOOTSTRAP=1
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "fuzz.sh: installing cargo-fuzz" >&2
        cargo install --locked --quiet cargo-fuzz
    fi
    sanitizer=${FUZZ_SANITIZER:-address}
    # Release build with debug assertions and overflow checks (-a): an
    # overflow in a length computation is exactly what the targets look for.
    build_args=(--fuzz-dir fuzz --release --debug-assertions --sanitizer "$sanitizer")
    if [ ! -d fuzz/target ]; then
        echo "fuzz.sh: first build of the fuzz targets in this checkout (every dependency, instrumented): several minutes on a 2-core machine" >&2
    fi
    # All targets in one cargo invocation: they share every compiled crate.
    if ! cargo fuzz build "${build_args[@]}" >"$logs_build" 2>&1; then
        tail -n 30 "$logs_build" >&2
        echo "fuzz.sh: the fuzz targets do not build (log: $logs_build)" >&2
        exit 2
    fi
    run_target() { # run_target TARGET LIBFUZZER_ARGS...
        local t=$1
        shift
        cargo fuzz run "${build_args[@]}" "$t" -- "$@"
    }
fi
echo "fuzz.sh: build took $(($(date +%s) - build_start)) s" >&2

# run_logged TARGET: one libFuzzer run of TARGET; its log and the time it
# took go to $logs.
run_logged() {
    local t=$1 start rc=0
    local work="fuzz/work/corpus/$t" artifacts="fuzz/artifacts/$t"
    mkdir -p "$work" "$artifacts" "fuzz/corpus/$t"
    start=$(date +%s)
    # The first corpus directory is where libFuzzer adds what it finds; the
    # curated seeds after it are only read.
    run_target "$t" "$work" "fuzz/corpus/$t" \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" >"$logs/$t.log" 2>&1 || rc=$?
    echo "$rc $(($(date +%s) - start))" >"$logs/$t.status"
}

# The smoke runs every target at once: a smoke is a fixed time per target,
# and four targets on two CPUs took 16 s instead of 32 s one per CPU, each
# with about half the executions (tens of thousands still). cargo-fuzz runs
# one at a time (each of its runs may rebuild).
jobs=1
if [ "$smoke" -eq 1 ]; then
    jobs=${#targets[@]}
fi
running=0
for t in "${targets[@]}"; do
    rm -f "$logs/$t.status"
    run_logged "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

crashed=0
failed=0
results=()
for t in "${targets[@]}"; do
    log="$logs/$t.log"
    read -r rc took <"$logs/$t.status" || { rc=255; took="?"; }
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

mode="cargo-fuzz, sanitizer $sanitizer"
if [ "$smoke" -eq 1 ]; then
    mode="smoke build, no sanitizer, $jobs at once"
fi
echo "fuzz.sh: $seconds s per target ($mode), logs in $logs"
printf '  %s\n' "${results[@]}"
if [ "$crashed" -ne 0 ]; then
    echo "fuzz.sh: FAILED: a target crashed" >&2
    exit 1
fi
if [ "$failed" -ne 0 ]; then
    echo "fuzz.sh: FAILED: a run was interrupted" >&2
    exit 1
fi
