#!/usr/bin/env bash
# A long run at a steady rate, looking for what only time shows: a slow leak
# (memory, file descriptors, tasks, threads, held state) or an output lost or
# duplicated once in a long while.
#
#   scripts/soak.sh                      30 minutes, core and JetStream mode side by side
#   SOAK_SECS=60 scripts/soak.sh         the short form CI runs (scripts/test.sh)
#
# One nats-server (JetStream on) and one etcd on free loopback ports; one
# worker per mode, each in its own namespace, each fed by its own
# `prefill-handoff loadgen` at SOAK_RATE results per second in a mixed load
# (decode jobs of every backend, terminal and error answers, dead letters,
# cancelled requests). Every SOAK_SAMPLE_SECS the worker's RSS, open file
# descriptors, OS threads (/proc) and its tokio tasks, in-flight results and
# held cancels (/metrics) are sampled into MODE.csv.
#
# Fails (exit 1) when, in either mode:
#   - loadgen reports an output missing, duplicated or of the wrong kind;
#   - the worker exited, or results are still in flight once the load stopped;
#   - after the warm-up, a sampled value grows faster than its limit, over
#     the whole window and over each of its halves. The slope is the median
#     of the slopes between every pair of samples (Theil-Sen), which one
#     outlier (a scrape during a GC-like allocator trim, a burst of
#     connections) does not move; a one-time step (the allocator mapping one
#     more segment: 1.5 MiB once, seen in a 60 s run) raises only the half
#     it falls in, where a leak raises both. Limits, per minute:
#       RSS                  SOAK_MAX_RSS_KIB_PER_MIN   (default 64 KiB/min: 3.75 MiB/h)
#       open descriptors     SOAK_MAX_FDS_PER_MIN       (default 0.1/min: 6 an hour)
#       threads, tasks       SOAK_MAX_TASKS_PER_MIN     (default 0.1/min)
#       held cancels         SOAK_MAX_TASKS_PER_MIN as well
#     A steady worker's curves are flat after warm-up; these limits leave
#     room for sampling noise, not for a leak of one unit per result.
#
# Knobs (environment): SOAK_SECS (1800), SOAK_RATE (200 results/s per mode),
# SOAK_MODES ("core jetstream"), SOAK_SAMPLE_SECS (10), SOAK_WARMUP_SECS
# (a fifth of the run, at most 300), SOAK_MIX, SOAK_OUT (directory for the
# samples, logs and reports; default a new directory under /tmp, kept),
# SOAK_BIN (a prefill-handoff binary; default this tree's dev build, built
# if missing or stale), NATS_SERVER, ETCD.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

SOAK_SECS=${SOAK_SECS:-1800}
SOAK_RATE=${SOAK_RATE:-200}
SOAK_MODES=${SOAK_MODES:-core jetstream}
SOAK_SAMPLE_SECS=${SOAK_SAMPLE_SECS:-10}
default_warmup=$((SOAK_SECS / 5))
[ "$default_warmup" -le 300 ] || default_warmup=300
SOAK_WARMUP_SECS=${SOAK_WARMUP_SECS:-$default_warmup}
SOAK_MIX=${SOAK_MIX:-trtllm=50,sglang=8,vllm=8,opaque=4,terminal=15,error=7,dead=4,cancelled=4}
SOAK_MAX_RSS_KIB_PER_MIN=${SOAK_MAX_RSS_KIB_PER_MIN:-64}
SOAK_MAX_FDS_PER_MIN=${SOAK_MAX_FDS_PER_MIN:-0.1}
SOAK_MAX_TASKS_PER_MIN=${SOAK_MAX_TASKS_PER_MIN:-0.1}
ETCD=${ETCD:-etcd}
if [[ -z ${NATS_SERVER:-} ]]; then
    if [[ -x /usr/sbin/nats-server ]]; then NATS_SERVER=/usr/sbin/nats-server; else NATS_SERVER=nats-server; fi
fi

log() { printf 'soak: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

for mode in $SOAK_MODES; do
    [[ $mode == core || $mode == jetstream ]] || die "SOAK_MODES: unknown mode $mode (core, jetstream)"
done
[ "$SOAK_WARMUP_SECS" -lt "$SOAK_SECS" ] || die "SOAK_WARMUP_SECS ($SOAK_WARMUP_SECS) must be shorter than SOAK_SECS ($SOAK_SECS)"

if [[ -z ${SOAK_BIN:-} ]]; then
    cargo build --locked --quiet --bin prefill-handoff
    SOAK_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/prefill-handoff
fi
[[ -x $SOAK_BIN ]] || die "no binary at $SOAK_BIN"

TMP=${SOAK_OUT:-$(mktemp -d -t prefill-soak.XXXXXX)}
mkdir -p "$TMP"
# What an earlier run into the same directory left: its markers would end
# this run's sampling at once.
rm -f "$TMP"/*.pid "$TMP"/*.done "$TMP"/*.verdict
PIDS=()
cleanup() {
    local pid file i workers=()
    # The workers first, while the servers still answer their shutdown
    # (drain, flush, revoke). They run inside the per-mode subshells, so
    # their PIDs are in files, and `wait` cannot wait for them.
    for file in "$TMP"/*.pid; do
        [ -s "$file" ] && workers+=("$(cat "$file")")
    done
    for pid in "${workers[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${workers[@]}"; do
        for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP/jetstream" "$TMP/etcd"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/local-servers.sh
source "$ROOT/scripts/local-servers.sh"
start_nats jetstream
start_etcd soak
log "nats-server $("$NATS_SERVER" --version 2>&1 | head -1), etcd on $ETCD_PORT; ${SOAK_SECS} s at ${SOAK_RATE}/s per mode ($SOAK_MODES), warm-up ${SOAK_WARMUP_SECS} s; output in $TMP"

metric() { # metric FILE NAME: the value of an unlabelled series, or empty
    awk -v n="$2" '$1 == n { print $2; exit }' "$1"
}

# sample MODE PID METRICS_PORT T0: one CSV line every SOAK_SAMPLE_SECS until
# the worker is gone or the marker file "$TMP/MODE.done" appears.
sample() {
    local mode=$1 pid=$2 port=$3 t0=$4 csv="$TMP/$1.csv" scrape="$TMP/$1.scrape"
    echo "secs,rss_kib,fds,threads,tasks,in_flight,cancels_held" >"$csv"
    while kill -0 "$pid" 2>/dev/null && [ ! -e "$TMP/$mode.done" ]; do
        local rss threads fds now
        rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
        threads=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
        fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics" >"$scrape" 2>/dev/null || : >"$scrape"
        now=$(date +%s)
        echo "$((now - t0)),$rss,$fds,$threads,$(metric "$scrape" handoff_tasks),$(metric "$scrape" handoff_in_flight),$(metric "$scrape" handoff_cancels_held)" >>"$csv"
        sleep "$SOAK_SAMPLE_SECS"
    done
}

# soak MODE: starts the worker, runs the load and the sampler, then checks
# that nothing is left in flight. Writes MODE.report.json and MODE.verdict.
soak() {
    local mode=$1 ns="soak${1:0:4}" port js=() pid t0 rc=0
    port=$(free_port)
    [[ $mode == jetstream ]] && js=(--jetstream)
    # loadgen sends every cancel of the run before its first result: they
    # must outlive the run, or the late ones would go to decode.
    "$SOAK_BIN" run --nats-url "$NATS_URL" --etcd-endpoints "$ETCD_URL" --namespace "$ns" \
        --mode "$mode" --metrics-addr "127.0.0.1:$port" \
        --set "cancel.retention_secs=$((SOAK_SECS + 600))" >"$TMP/$mode.worker.log" 2>&1 &
    pid=$!
    echo "$pid" >"$TMP/$mode.pid"
    # Until one result comes back: the worker is subscribed (core NATS drops
    # what is published before that) and holds its slot.
    local i
    for i in $(seq 120); do
        kill -0 "$pid" 2>/dev/null || break
        "$SOAK_BIN" loadgen --nats-url "$NATS_URL" --namespace "$ns" "${js[@]}" --count 1 \
            --timeout 1 --quiet >/dev/null 2>&1 && break
        [ "$i" -lt 120 ] || { echo "never answered" >"$TMP/$mode.verdict"; return 1; }
    done
    kill -0 "$pid" 2>/dev/null || { echo "worker exited at start" >"$TMP/$mode.verdict"; return 1; }
    t0=$(date +%s)
    sample "$mode" "$pid" "$port" "$t0" &
    local sampler=$!
    "$SOAK_BIN" loadgen --nats-url "$NATS_URL" --namespace "$ns" "${js[@]}" --mix "$SOAK_MIX" \
        --count $((SOAK_RATE * SOAK_SECS)) --rate "$SOAK_RATE" --timeout 60 --linger-ms 2000 \
        --quiet --json >"$TMP/$mode.report.json" 2>"$TMP/$mode.loadgen.err" || rc=$?
    # One last sample with the load stopped: in flight must be back to 0.
    sleep "$SOAK_SAMPLE_SECS"
    touch "$TMP/$mode.done"
    wait "$sampler" || true
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "worker exited during the run" >"$TMP/$mode.verdict"
        return 1
    fi
    echo "loadgen exit $rc" >"$TMP/$mode.verdict"
}

started=()
for mode in $SOAK_MODES; do
    soak "$mode" &
    started+=($!)
    PIDS+=($!)
done
for job in "${started[@]}"; do wait "$job" || true; done

python3 - "$TMP" "$SOAK_WARMUP_SECS" "$SOAK_MAX_RSS_KIB_PER_MIN" "$SOAK_MAX_FDS_PER_MIN" \
    "$SOAK_MAX_TASKS_PER_MIN" $SOAK_MODES <<'PY'
import csv, json, os, statistics, sys

out, warmup = sys.argv[1], float(sys.argv[2])
max_rss, max_fds, max_tasks = map(float, sys.argv[3:6])
limits = {"rss_kib": max_rss, "fds": max_fds, "threads": max_tasks,
          "tasks": max_tasks, "cancels_held": max_tasks}
failed = False

def theil_sen(points):
    """Median of the slopes between every pair of samples, per minute."""
    slopes = [(y2 - y1) / (x2 - x1) * 60 for i, (x1, y1) in enumerate(points)
              for (x2, y2) in points[i + 1:] if x2 > x1]
    return statistics.median(slopes) if slopes else None

for mode in sys.argv[6:]:
    problems = []
    verdict = open(os.path.join(out, f"{mode}.verdict")).read().strip() \
        if os.path.exists(os.path.join(out, f"{mode}.verdict")) else "no verdict"
    try:
        report = json.load(open(os.path.join(out, f"{mode}.report.json")))
        print(f"{mode}: {report['sent']} sent, missing {report['missing']}, duplicated "
              f"{report['duplicates']}, wrong kind {report['wrong_kind']}, ok={report['ok']}")
        if not report["ok"]:
            problems.append("loadgen: not every output arrived exactly once")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"no loadgen report ({e}); {verdict}")
    if not verdict.startswith("loadgen exit"):
        problems.append(verdict)
    rows = list(csv.DictReader(open(os.path.join(out, f"{mode}.csv"))))
    if len(rows) < 3:
        problems.append(f"only {len(rows)} samples")
    else:
        last = rows[-1]
        if last["in_flight"] not in ("", "0"):
            problems.append(f"{last['in_flight']} results still in flight after the load stopped")
        # The last sample is taken with the load stopped: left out of the slopes.
        steady = [r for r in rows[:-1] if float(r["secs"]) >= warmup]
        for key, limit in limits.items():
            points = [(float(r["secs"]), float(r[key])) for r in steady if r[key] != ""]
            if len(points) < 2:
                print(f"  {key:<13} not sampled")
                continue
            slope = theil_sen(points)
            mid = len(points) // 2
            halves = [theil_sen(points[:mid]), theil_sen(points[mid:])] if mid >= 2 else []
            growing = slope > limit and all(h > limit for h in halves)
            first, end = points[0][1], points[-1][1]
            flag = f"  GROWING (limit {limit:g}/min)" if growing else ""
            shown = "".join(f", {h:+.3f}" for h in halves)
            print(f"  {key:<13} {first:>9g} at {points[0][0]:.0f} s -> {end:>9g} at "
                  f"{points[-1][0]:.0f} s, slope {slope:+.3f}/min (halves{shown or ' n/a'}){flag}")
            if flag:
                problems.append(f"{key} grows {slope:+.3f}/min after warm-up (limit {limit:g})")
    for p in problems:
        print(f"  FAIL: {p}")
    failed |= bool(problems)
print("soak: FAILED" if failed else "soak: OK", f"(samples and logs in {out})")
sys.exit(1 if failed else 0)
PY
