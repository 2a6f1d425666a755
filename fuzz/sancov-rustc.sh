#!/usr/bin/env bash
# RUSTC_WRAPPER for the fuzz smoke (scripts/fuzz.sh --smoke): runs rustc as
# given, and adds libFuzzer's coverage instrumentation (the flags cargo-fuzz
# passes, without a sanitizer) to the crates the targets exercise: the
# worker's library, the vendored NATS client whose parser `nats_headers`
# reads, and the fuzz crate itself.
#
# Why a wrapper and not RUSTFLAGS: RUSTFLAGS would apply to every crate and
# make cargo rebuild the whole dependency tree, about 400 s on a 2-core
# machine. With only these three crates instrumented, the smoke reuses every
# other crate the test build already compiled in target/. The instrumented
# crates cannot overwrite an uninstrumented build of the same crate: the fuzz
# workspace builds them with profile settings of their own (fuzz/Cargo.toml),
# so their artifacts have other names.
set -euo pipefail
rustc=$1
shift
case " $* " in
*" --crate-name prefill_handoff "* | *" --crate-name async_nats "* | *" --crate-name prefill_handoff_fuzz "*)
    exec "$rustc" "$@" \
        -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares
    ;;
esac
exec "$rustc" "$@"
