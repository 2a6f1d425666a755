#!/usr/bin/env bash
# Where one worker's CPU goes in bursts: a `perf` profile of `run` alone.
#
#   scripts/profile.sh                      # core mode, 3 bursts, perf report on stdout
#   MODE=jetstream scripts/profile.sh
#   PERF=0 scripts/profile.sh               # no perf: CPU per message and peak RSS only
#   BIN=/tmp/old-prefill-handoff scripts/profile.sh   # another build (A/B: alternate runs)
#
# Starts nats-server and etcd on free loopback ports in a temporary
# directory, one worker (`run`, `max_in_flight_bytes` 64 MiB as in
# scripts/bench.sh), sends 20,000 results to warm it up, then BURSTS bursts
# of 50,000 (the bench's mix) with `perf record --call-graph dwarf` on the
# worker's process. Prints each burst's throughput, the worker's CPU per
# message over the bursts (from /proc/PID/stat) and its peak RSS, then the
# profile by symbol, inclusive of callees (`perf report --children`). The
# profile stays in $OUT (default target/profile/perf.data) for
# `perf report -i` / `perf annotate -i`.
#
# Use it to find what to cut; measure the result with scripts/bench.sh.
# Single runs swing ±30% on a shared machine: compare builds in alternating
# runs, several of each. Installs perf (Debian's linux-perf) when missing.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

MODE=${MODE:-core}
BURSTS=${BURSTS:-3}
PERF=${PERF:-1}
ETCD=${ETCD:-etcd}
OUT=${OUT:-$ROOT/target/profile/perf.data}
if [[ -z ${NATS_SERVER:-} ]]; then
    if [[ -x /usr/sbin/nats-server ]]; then NATS_SERVER=/usr/sbin/nats-server; else NATS_SERVER=nats-server; fi
fi

log() { printf 'profile: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v "$NATS_SERVER" >/dev/null || ! command -v "$ETCD" >/dev/null; then
    scripts/install-deps.sh
fi
if [[ $PERF == 1 ]] && ! command -v perf >/dev/null; then
    log "installing perf (linux-perf)"
    if [[ $(id -u) == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
    "${SUDO[@]}" apt-get install -y -qq linux-perf >/dev/null || die "cannot install linux-perf"
fi
if [[ -z ${BIN:-} ]]; then
    log "building the release binary"
    cargo build --release --quiet --bin prefill-handoff
    BIN=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/prefill-handoff
fi
[[ -x $BIN ]] || die "no binary at $BIN"

TMP=$(mktemp -d -t prefill-profile.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
NATS_PORT=$(free_port)
printf 'listen: 127.0.0.1:%s\njetstream { store_dir: "%s/jetstream" }\n' "$NATS_PORT" "$TMP" >"$TMP/nats.conf"
"$NATS_SERVER" -c "$TMP/nats.conf" >"$TMP/nats.log" 2>&1 &
PIDS+=($!)
ETCD_PORT=$(free_port)
ETCD_PEER=$(free_port)
"$ETCD" --name profile --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "profile=http://127.0.0.1:$ETCD_PEER" >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
NATS_URL=nats://127.0.0.1:$NATS_PORT

"$BIN" run --nats-url "$NATS_URL" --etcd-endpoints "http://127.0.0.1:$ETCD_PORT" \
    --set max_in_flight_bytes=67108864 --namespace profile --mode "$MODE" \
    --metrics-addr "127.0.0.1:$(free_port)" >"$TMP/worker.log" 2>&1 &
WORKER=$!
PIDS+=("$WORKER")

FLAGS=(--nats-url "$NATS_URL" --namespace profile --mix trtllm=80,terminal=15,error=5 --quiet)
[[ $MODE == jetstream ]] && FLAGS+=(--jetstream)
answering=0
for _ in $(seq 60); do
    kill -0 "$WORKER" 2>/dev/null || break
    if "$BIN" loadgen "${FLAGS[@]}" --count 1 --timeout 1 >/dev/null 2>&1; then answering=1; break; fi
done
[[ $answering == 1 ]] || { tail -n 20 "$TMP/worker.log" >&2; die "the worker never answered"; }
"$BIN" loadgen "${FLAGS[@]}" --count 20000 --timeout 60 >/dev/null || die "the warm-up failed"

cpu() { awk '{print $14 + $15}' "/proc/$WORKER/stat"; }
before=$(cpu)
if [[ $PERF == 1 ]]; then
    mkdir -p "$(dirname "$OUT")"
    perf record -F 999 --call-graph dwarf,16384 -o "$OUT" -p "$WORKER" 2>"$TMP/perf.log" &
    RECORDER=$!
    sleep 0.5
fi
for i in $(seq "$BURSTS"); do
    "$BIN" loadgen "${FLAGS[@]}" --count 50000 --timeout 60 --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("burst %s: %.0f outputs/s, missing %d, ok=%s" % (sys.argv[1], r["throughput"], r["missing"], r["ok"]))' "$i"
done
after=$(cpu)
if [[ $PERF == 1 ]]; then
    kill -INT "$RECORDER"
    wait "$RECORDER" 2>/dev/null || true
fi
python3 -c 'import sys
ticks, hz, n = map(int, sys.argv[1:])
print(f"worker CPU: {ticks / hz * 1e6 / n:.2f} µs per message in the bursts")' \
    "$((after - before))" "$(getconf CLK_TCK)" "$((BURSTS * 50000))"
grep VmHWM "/proc/$WORKER/status" | sed 's/^/worker peak RSS: /'
if [[ $PERF == 1 ]]; then
    perf report -i "$OUT" --children --sort sym --percentage relative 2>/dev/null |
        grep -E '^ +[0-9]' | grep -v '\[k\]' | head -n "${TOP:-60}"
    log "profile kept in $OUT"
fi
