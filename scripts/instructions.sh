#!/usr/bin/env bash
# Instructions per message, counted by callgrind: the steadier figure behind
# bench.sh's CPU ratios (CPU time swings ±20% between runs on a shared
# machine; instruction counts repeat within about 2%: how much of a burst
# queues at once, and so how much buffers grow and copy, varies).
#
#   scripts/instructions.sh [core|core-json|relay|js|js-relay] [COUNT]
#
# Starts nats-server and etcd on free loopback ports, runs the release
# worker in core mode (`core-json`: the same mix sent as JSON; or
# examples/raw_relay; `js` and `js-relay`: the
# worker in JetStream mode and examples/raw_js_relay, on a server with
# JetStream and file storage, as bench.sh runs them) under callgrind, warms it up
# with a burst of COUNT results, zeroes the counters, sends COUNT results (default 3000) from `loadgen` on
# bench.sh's mix in a burst (as bench.sh's CPU ratios are; a paced run
# costs several times more per message, in wake-ups), and prints the
# instructions per message of the whole process (every thread: decision,
# NATS client, runtime) and its 25 costliest functions (own instructions,
# per message). The callgrind file stays in target/profile/ for
# callgrind_annotate. Installs Debian's valgrind when missing.
#
# Knobs (environment): MIX (trtllm=80,terminal=15,error=5), RATE (results
# per second sent, default 100000: a burst; 3,000 of ~1 KiB fit the default
# byte budget, so none is refused),
# NATS_SERVER, ETCD, BENCH_BIN (a prefill-handoff binary instead of this
# tree's release build; `loadgen` comes from it too), WORKER_LOG (the
# worker's RUST_LOG, default `warn`: the outcome log writes error responses
# at info, at most 20 lines a second, and under callgrind a burst lasts
# seconds instead of a fraction of one, so those lines cost 100-200
# instructions per result there, varying from run to run, against a few
# in a real burst; `info` counts them). The method and the current
# figures are in docs/performance.md.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

WHAT=${1:-core}
WORKER_LOG=${WORKER_LOG:-warn}
COUNT=${2:-3000}
MIX=${MIX:-trtllm=80,terminal=15,error=5}
RATE=${RATE:-100000}
ETCD=${ETCD:-etcd}
if [[ -z ${NATS_SERVER:-} ]]; then
    if [[ -x /usr/sbin/nats-server ]]; then NATS_SERVER=/usr/sbin/nats-server; else NATS_SERVER=nats-server; fi
fi
case $WHAT in core | core-json | relay | js | js-relay) ;; *)
    echo "usage: scripts/instructions.sh [core|core-json|relay|js|js-relay] [COUNT]" >&2
    exit 2
    ;;
esac

log() { printf 'instructions: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v "$NATS_SERVER" >/dev/null || ! command -v "$ETCD" >/dev/null; then
    scripts/install-deps.sh
fi
if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
    log "installing valgrind"
    if [[ $(id -u) == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
    "${SUDO[@]}" apt-get install -y -qq valgrind >/dev/null || die "cannot install valgrind"
fi

log "building release binary and examples/raw_relay, raw_js_relay"
cargo build --release --quiet --bin prefill-handoff --example raw_relay --example raw_js_relay
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BENCH_BIN:-$TARGET/release/prefill-handoff}
RELAY=$TARGET/release/examples/raw_relay
JS_RELAY=$TARGET/release/examples/raw_js_relay
OUT=$TARGET/profile/$WHAT.callgrind
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT" "$OUT".*

TMP=$(mktemp -d -t prefill-instructions.XXXXXX)
PIDS=()
cleanup() {
    # The profiled program first, while NATS is still up: the relay drains
    # its connection on SIGTERM, and with the server already gone that
    # drain waited for a reconnect forever (the script hung at its end).
    # It gets 10 s, then SIGKILL.
    if [[ -n ${PID:-} ]]; then
        kill "$PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$PID" 2>/dev/null || true
    fi
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/local-servers.sh
source "$ROOT/scripts/local-servers.sh"
flags=(--namespace prof --mix "$MIX")
case $WHAT in
relay)
    start_nats
    program=("$RELAY" --nats-url "$NATS_URL" --namespace prof)
    flags+=(--expect-relay)
    ;;
js-relay)
    start_nats jetstream
    program=("$JS_RELAY" --nats-url "$NATS_URL" --namespace prof)
    flags+=(--jetstream --expect-relay)
    ;;
*)
    if [[ $WHAT == js ]]; then start_nats jetstream; else start_nats; fi
    start_etcd prof
    mode=core
    if [[ $WHAT == js ]]; then
        mode=jetstream
        flags+=(--jetstream)
    fi
    if [[ $WHAT == core-json ]]; then
        flags+=(--json-results)
    fi
    program=("$BIN" run --nats-url "$NATS_URL" --etcd-endpoints "$ETCD_URL"
        --namespace prof --mode "$mode" --metrics-addr "127.0.0.1:$(free_port)")
    ;;
esac

log "$WHAT: starting under callgrind"
RUST_LOG=$WORKER_LOG valgrind --tool=callgrind --callgrind-out-file="$OUT" "${program[@]}" >"$TMP/program.log" 2>&1 &
PID=$!
PIDS+=("$PID")
answering=0
for _ in $(seq 120); do
    kill -0 "$PID" 2>/dev/null || break
    if "$BIN" loadgen --nats-url "$NATS_URL" "${flags[@]}" --count 1 --timeout 1 --quiet >/dev/null 2>&1; then
        answering=1
        break
    fi
    sleep 0.5
done
[[ $answering == 1 ]] || { tail -n 20 "$TMP/program.log" >&2; die "$WHAT never answered under callgrind"; }
# A first burst as large as the measured one: queues that grow to hold a
# burst (the runner's, the client's) keep their size, so the measured burst
# shows the steady cost, not their growing (~400 instructions per message
# in a process's first 3,000-result burst).
"$BIN" loadgen --nats-url "$NATS_URL" "${flags[@]}" --count "$COUNT" --rate "$RATE" --timeout 60 --quiet >/dev/null 2>&1 || true

callgrind_control -z "$PID" >/dev/null
log "$WHAT: $COUNT results at $RATE/s"
report=$("$BIN" loadgen --nats-url "$NATS_URL" "${flags[@]}" --count "$COUNT" --rate "$RATE" --timeout 60 --json --quiet) ||
    die "loadgen failed: $report"
callgrind_control -d "$PID" >/dev/null
missing=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["missing"])' "$report")
[[ $missing == 0 ]] || log "WARNING: $missing of $COUNT results got no output; the count below is per result sent"

# The dump after zeroing is the file's first part.
dump=$OUT.1
[[ -s $dump ]] || die "callgrind wrote no dump ($OUT.*)"
callgrind_annotate --inclusive=no --threshold=100 "$dump" 2>/dev/null | python3 -c '
import re, sys
count = int(sys.argv[1])
total, rows = None, []
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*?)(?: \[.*\])?$", line)
    if not m:
        continue
    n = int(m.group(1).replace(",", "")) / count
    if "PROGRAM TOTALS" in m.group(2):
        total = n
    else:
        rows.append((n, m.group(2).split(":", 1)[-1]))
print(f"{sys.argv[2]}: {total:,.0f} instructions per message (callgrind, {count} results)")
print("costliest functions, own instructions per message:")
# After zeroing, callgrind charges the frames that were on a thread'"'"'s stack
# at the time (thread start, the runtime, main and block_on) with all that
# ran under them: they are not functions'"'"' own costs, so they are left out.
frames = re.compile(r"clone|libc_start_main|start_thread|thread_start|call_once|short_backtrace|blocking::pool|"
                    r"task::(core|harness|raw)|lang_start|below main|^main$|block_on|"
                    r"prefill_handoff::main|cli::dispatch|cli::run::run|0x0")
rows = [(n, name) for n, name in rows if not frames.search(name)]
for n, name in sorted(rows, reverse=True)[:25]:
    print(f"{n:8,.0f}  {name[:140]}")
' "$COUNT" "$WHAT"
log "callgrind file: $dump"
