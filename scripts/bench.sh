#!/usr/bin/env bash
# Benchmarks prefill-handoff against its baselines, in one run, on one
# message mix, with local servers on free loopback ports:
#
#   relay     examples/raw_relay        core NATS in -> bytes unchanged -> GEN
#   user-relay examples/user_relay      the same, written as a user of
#                                       async-nats would (default options)
#   core      prefill-handoff run       core mode (queue group)
#   core-cancel prefill-handoff run     core mode, on CANCEL_MIX: a tenth of
#                                       the results cancelled before the run
#   core-json prefill-handoff run       core mode, the same mix sent as JSON
#   js-relay  examples/raw_js_relay     work-queue stream -> GEN stream, ack
#   js        prefill-handoff run       --mode jetstream
#   python    benches/python_baseline.py  nats-py + msgpack, same decision
#
# and, each through its own delay proxy (examples/delay_proxy: RTT_US/2 added
# each way between the program and nats-server; the load generator connects
# directly), the server "on another host":
#
#   js-relay-rtt  examples/raw_js_relay     the JetStream relay
#   js-stock-rtt  examples/raw_js_relay --max-bytes   async-nats' stock pull
#                                       stream bounded in messages and bytes
#   js-rtt        prefill-handoff run       --mode jetstream
#   relay-px0     examples/raw_relay        the core relay through a proxy
#                                       adding no delay: what the proxy costs
#
# For each: peak throughput (as fast as possible, median of REPEATS runs),
# p50/p99 latency at a fixed moderate rate (median of REPEATS runs), and the process's peak RSS
# (VmHWM, after the paced run and at the end). Prints a table, the ratios, and a last line
#   RESULT core_vs_relay=… js_vs_relay=… vs_python=… p99_vs_relay=… rss_mb=…
#          core_cpu_vs_relay=… js_cpu_vs_relay=… cpu_vs_python=…
#          core_vs_user_relay=… core_cpu_vs_user_relay=… cancel_cpu_vs_core=…
#          json_cpu_vs_msgpack=… js_rtt_keep=… js_rtt_vs_stock=… js_rtt_vs_relay=…
#          proxy_keep=…
# (the CPU ratios from CPU µs per message in the bursts: worker / relay,
# Python / core mode, core mode with cancels / without, and core mode on
# JSON / on MessagePack; js_rtt_keep is the worker's JetStream throughput at
# the round trip over its throughput on loopback, js_rtt_vs_stock and
# js_rtt_vs_relay the worker's at the round trip over the stock-stream
# relay's and the JetStream relay's, proxy_keep the core relay's throughput
# through the proxy at no delay over its throughput direct).
#
# Knobs (environment): PEAK_COUNT (50000), REPEATS (3), RATE (2000 msg/s),
# RATE_SECS (10), RTT_US (the round trip of the *-rtt scenarios, 1000 µs),
# WARMUP (2000), MIX (trtllm=80,terminal=15,error=5),
# CANCEL_MIX (core-cancel's: trtllm=70,terminal=15,error=5,cancelled=10),
# NATS_SERVER (Debian's /usr/sbin/nats-server when present), ETCD (etcd),
# ONLY (space-separated scenario names to run, default all), KEEP_TMP=1,
# BENCH_MAX_IN_FLIGHT_BYTES (the worker's max_in_flight_bytes, 64 MiB), BENCH_BIN (a
# prefill-handoff binary to measure instead of this tree's release build),
# PROFILE (a scenario name: `perf record --call-graph dwarf` of that program
# during the bursts, kept in target/profile/NAME.perf.data, its top symbols
# printed after the report; installs Debian's linux-perf when missing), e.g.
#   PROFILE=core ONLY=core REPEATS=1 RATE_SECS=1 scripts/bench.sh
#
# Exit status: 0 when every scenario that could run ran; 1 when one failed.
# A scenario whose program is not built yet is skipped, not failed.

set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

PEAK_COUNT=${PEAK_COUNT:-50000}
REPEATS=${REPEATS:-3}
RATE=${RATE:-2000}
RATE_SECS=${RATE_SECS:-10}
WARMUP=${WARMUP:-2000}
MIX=${MIX:-trtllm=80,terminal=15,error=5}
CANCEL_MIX=${CANCEL_MIX:-trtllm=70,terminal=15,error=5,cancelled=10}
ETCD=${ETCD:-etcd}
ONLY=${ONLY:-relay user-relay core core-cancel core-json js-relay js python relay-px0 js-relay-rtt js-stock-rtt js-rtt}
RTT_US=${RTT_US:-1000}
if [[ -z ${NATS_SERVER:-} ]]; then
    if [[ -x /usr/sbin/nats-server ]]; then NATS_SERVER=/usr/sbin/nats-server; else NATS_SERVER=nats-server; fi
fi

log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- dependencies -----------------------------------------------------------

missing_deps() {
    command -v "$NATS_SERVER" >/dev/null || echo nats-server
    command -v "$ETCD" >/dev/null || echo etcd
    command -v cargo >/dev/null || echo cargo
    python3 -c 'import nats, msgpack' 2>/dev/null || echo "python3 nats-py msgpack"
}
if [[ -n $(missing_deps) ]]; then
    if [[ -x scripts/install-deps.sh ]]; then
        log "installing missing dependencies: $(missing_deps | tr '\n' ' ')"
        scripts/install-deps.sh
    fi
    [[ -z $(missing_deps) ]] || die "missing: $(missing_deps | tr '\n' ' ')(install them, or add scripts/install-deps.sh)"
fi

if [[ -n ${PROFILE:-} ]] && ! command -v perf >/dev/null; then
    log "installing perf (linux-perf) for PROFILE=$PROFILE"
    if [[ $(id -u) == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
    "${SUDO[@]}" apt-get install -y -qq linux-perf >/dev/null || die "cannot install linux-perf"
fi

# --- build ------------------------------------------------------------------

log "building release binary and examples"
cargo build --release --quiet --bin prefill-handoff --example raw_relay --example raw_js_relay --example user_relay --example delay_proxy
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BENCH_BIN:-$TARGET/release/prefill-handoff}
RELAY=$TARGET/release/examples/raw_relay
JS_RELAY=$TARGET/release/examples/raw_js_relay
USER_RELAY=$TARGET/release/examples/user_relay
DELAY_PROXY=$TARGET/release/examples/delay_proxy
[[ -x $BIN && -x $RELAY && -x $JS_RELAY && -x $USER_RELAY && -x $DELAY_PROXY ]] || die "build produced no binaries under $TARGET/release"

# --- servers ----------------------------------------------------------------

TMP=$(mktemp -d -t prefill-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ ${KEEP_TMP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/local-servers.sh
source "$ROOT/scripts/local-servers.sh"
start_nats jetstream
start_etcd bench

log "nats-server $("$NATS_SERVER" --version 2>&1 | head -1) on $NATS_PORT, etcd on $ETCD_PORT, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# --- scenarios --------------------------------------------------------------

mkdir -p "$TMP/results"
FAILED=0

# loadgen [--mix MIX] FLAGS...: MIX unless another mix comes first.
loadgen() {
    local mix=$MIX
    if [[ ${1:-} == --mix ]]; then mix=$2; shift 2; fi
    "$BIN" loadgen --nats-url "$NATS_URL" --mix "$mix" --quiet "$@"
}

# One line about a loadgen run from its JSON report (or its last error line).
summary() {
    python3 - "$1.json" <<'PY' 2>/dev/null || echo "no report: $(tail -n1 "$1.err")"
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_ms"]
print(f"{r['throughput']:.0f} outputs/s, p50 {l['p50']:.2f} ms, p99 {l['p99']:.2f} ms, "
      f"missing {r['missing']}, duplicated {r['duplicates']}, ok={r['ok']}")
PY
}

# Waits until one message of the run's kind comes back: proves the program
# subscribed (core NATS drops messages published before that).
wait_answering() {
    local pid=$1 i
    shift
    for i in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || return 1
        loadgen --count 1 --timeout 1 "$@" >/dev/null 2>&1 && return 0
    done
    return 1
}

# All programs run side by side, each in its own namespace (idle while
# another is measured), and the runs go round-robin over them: noise from
# other work on the machine spreads over every scenario instead of spoiling
# the one that happened to be measured at the time.
declare -A PID_OF NS_OF FLAGS_OF MIX_OF=([core-cancel]=$CANCEL_MIX)
STARTED=()

# start NAME NAMESPACE LOADGEN-FLAGS -- COMMAND...
start() {
    local name=$1 ns=$2 flags=$3
    shift 4
    [[ " $ONLY " == *" $name "* ]] || return 0
    local out=$TMP/results/$name
    local plog=$TMP/$name.log
    log "$name: starting $(basename "$1")"
    "$@" >"$plog" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    # shellcheck disable=SC2086
    if ! wait_answering "$pid" --namespace "$ns" $flags; then
        if grep -q "not built yet\|not supported yet\|not implemented" "$plog"; then
            log "$name: SKIPPED: $(basename "$1") cannot do this yet on this branch: $(grep -m1 "not built yet\|not supported yet\|not implemented" "$plog" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)"
            echo "skipped: not built yet" >"$out.skipped"
        else
            log "$name: FAILED: the program never answered; last lines of its log:"
            tail -n 15 "$plog" >&2
            echo "failed: never answered" >"$out.skipped"
            FAILED=1
        fi
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        return 0
    fi
    PID_OF[$name]=$pid
    NS_OF[$name]=$ns
    FLAGS_OF[$name]=$flags
    STARTED+=("$name")
}

# measure NAME KIND(rate|peak) RUN
measure() {
    local name=$1 kind=$2 i=$3
    local out=$TMP/results/$name.$kind.$i
    local size=(--count "$PEAK_COUNT")
    [[ $kind == rate ]] && size=(--count $((RATE * RATE_SECS)) --rate "$RATE")
    # shellcheck disable=SC2086
    loadgen --mix "${MIX_OF[$name]:-$MIX}" --namespace "${NS_OF[$name]}" ${FLAGS_OF[$name]} "${size[@]}" --warmup "$WARMUP" --timeout 60 --json \
        >"$out.json" 2>"$out.err" || true
    if [[ $kind == rate ]]; then
        log "$name: $RATE msg/s run $i: $(summary "$out")"
    else
        log "$name: peak run $i: $(summary "$out")"
    fi
}

# The worker's byte budget (max_in_flight_bytes) for the runs: large enough
# to hold a whole burst (PEAK_COUNT results of ~600 bytes), so every result
# of a burst is decided. With the default 8 MiB, a 50,000-result burst sent in
# 0.1 s is mostly refused as over_budget dead letters: cheap outputs the
# loadgen cannot match (it reports them missing), which understated both the
# CPU per message and the peak RSS.
BENCH_MAX_IN_FLIGHT_BYTES=${BENCH_MAX_IN_FLIGHT_BYTES:-67108864}
WORKER_ARGS=(--nats-url "$NATS_URL" --etcd-endpoints "$ETCD_URL" --set "max_in_flight_bytes=$BENCH_MAX_IN_FLIGHT_BYTES")

start relay brelay "--expect-relay" -- \
    "$RELAY" --nats-url "$NATS_URL" --namespace brelay
start user-relay buser "--expect-relay" -- \
    "$USER_RELAY" --nats-url "$NATS_URL" --namespace buser
start core bcore "" -- \
    "$BIN" run "${WORKER_ARGS[@]}" --namespace bcore --mode core --metrics-addr "127.0.0.1:$(free_port)"
start core-cancel bcancel "" -- \
    "$BIN" run "${WORKER_ARGS[@]}" --namespace bcancel --mode core --metrics-addr "127.0.0.1:$(free_port)"
start core-json bcorejson "--json-results" -- \
    "$BIN" run "${WORKER_ARGS[@]}" --namespace bcorejson --mode core --metrics-addr "127.0.0.1:$(free_port)"
start js-relay bjsrelay "--jetstream --expect-relay" -- \
    "$JS_RELAY" --nats-url "$NATS_URL" --namespace bjsrelay
start js bjs "--jetstream" -- \
    "$BIN" run "${WORKER_ARGS[@]}" --namespace bjs --mode jetstream --metrics-addr "127.0.0.1:$(free_port)"
start python bpython "" -- \
    python3 "$ROOT/benches/python_baseline.py" --nats-url "$NATS_URL" --namespace bpython

wanted() { [[ " $ONLY " == *" $1 "* ]]; }

# proxy ONE-WAY-US: a delay proxy in front of nats-server; sets PROXY_URL.
proxy() {
    local port
    port=$(free_port)
    "$DELAY_PROXY" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$NATS_PORT" --delay-us "$1" 2>>"$TMP/proxy.log" &
    PIDS+=($!)
    wait_port "$port" || die "delay_proxy did not start (see $TMP/proxy.log)"
    PROXY_URL=nats://127.0.0.1:$port
}

if wanted relay-px0; then
    proxy 0
    start relay-px0 brelaypx "--expect-relay" -- \
        "$RELAY" --nats-url "$PROXY_URL" --namespace brelaypx
fi
if wanted js-relay-rtt; then
    proxy $((RTT_US / 2))
    start js-relay-rtt bjsrelayrtt "--jetstream --expect-relay" -- \
        "$JS_RELAY" --nats-url "$PROXY_URL" --namespace bjsrelayrtt
fi
if wanted js-stock-rtt; then
    # The worker's byte budget as the stock stream's bytes per pull.
    proxy $((RTT_US / 2))
    start js-stock-rtt bjsstockrtt "--jetstream --expect-relay" -- \
        "$JS_RELAY" --nats-url "$PROXY_URL" --namespace bjsstockrtt --max-bytes "$BENCH_MAX_IN_FLIGHT_BYTES"
fi
if wanted js-rtt; then
    proxy $((RTT_US / 2))
    start js-rtt bjsrtt "--jetstream" -- \
        "$BIN" run --nats-url "$PROXY_URL" --etcd-endpoints "$ETCD_URL" --set "max_in_flight_bytes=$BENCH_MAX_IN_FLIGHT_BYTES" \
        --namespace bjsrtt --mode jetstream --metrics-addr "127.0.0.1:$(free_port)"
fi

# The paced runs first: the peak RSS after them is the steady-state
# footprint; the bursts afterwards show what queueing a burst costs.
for i in $(seq "$REPEATS"); do
    for name in "${STARTED[@]}"; do measure "$name" rate "$i"; done
done
for name in "${STARTED[@]}"; do
    grep VmHWM "/proc/${PID_OF[$name]}/status" | awk '{print $2}' >"$TMP/results/$name.rss_paced_kb" || true
    # utime and stime, in clock ticks.
    awk '{print $14, $15}' "/proc/${PID_OF[$name]}/stat" >"$TMP/results/$name.cpu_paced_ticks" || true
done
RECORDER=
if [[ -n ${PROFILE:-} && -n ${PID_OF[$PROFILE]:-} ]]; then
    PROFILE_OUT=$TARGET/profile/$PROFILE.perf.data
    mkdir -p "$(dirname "$PROFILE_OUT")"
    perf record -F 999 --call-graph dwarf,16384 -o "$PROFILE_OUT" -p "${PID_OF[$PROFILE]}" 2>"$TMP/perf.log" &
    RECORDER=$!
    PIDS+=("$RECORDER")
    sleep 0.5
elif [[ -n ${PROFILE:-} ]]; then
    log "PROFILE=$PROFILE: no such scenario is running (ONLY=$ONLY); nothing recorded"
fi
for i in $(seq "$REPEATS"); do
    for name in "${STARTED[@]}"; do measure "$name" peak "$i"; done
done
if [[ -n $RECORDER ]]; then
    kill -INT "$RECORDER"
    wait "$RECORDER" 2>/dev/null || true
fi
for name in "${STARTED[@]}"; do
    pid=${PID_OF[$name]}
    grep VmHWM "/proc/$pid/status" | awk '{print $2}' >"$TMP/results/$name.rss_kb" || true
    awk '{print $14, $15}' "/proc/$pid/stat" >"$TMP/results/$name.cpu_ticks" || true
    getconf CLK_TCK >"$TMP/results/$name.clk_tck"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
done

# --- report -----------------------------------------------------------------

python3 - "$TMP/results" "$PEAK_COUNT" "$REPEATS" "$RATE" "$RATE_SECS" "$MIX" "$CANCEL_MIX" <<'PY'
import json, os, statistics, sys

results, peak_count, repeats, rate, rate_secs, mix, cancel_mix = sys.argv[1:]
names = ["relay", "user-relay", "core", "core-cancel", "core-json", "js-relay", "js", "python", "relay-px0", "js-relay-rtt", "js-stock-rtt", "js-rtt"]
labels = {
    "relay": "raw relay (core)",
    "user-relay": "user's relay (core)",
    "core": "prefill-handoff core",
    "core-cancel": "core, 10% cancelled",
    "core-json": "prefill-handoff core, JSON",
    "js-relay": "raw relay (JetStream)",
    "js": "prefill-handoff jetstream",
    "python": "python baseline",
    "relay-px0": "raw relay (core), proxy 0",
    "js-relay-rtt": "raw relay (JetStream), rtt",
    "js-stock-rtt": "stock-stream relay, rtt",
    "js-rtt": "prefill-handoff js, rtt",
}

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None

rows = {}
for n in names:
    base = os.path.join(results, n)
    skipped = read(base + ".skipped")
    peaks = [load(f"{base}.peak.{i}.json") for i in range(1, int(repeats) + 1)]
    peaks = [p for p in peaks if p]
    lats = [load(f"{base}.rate.{i}.json") for i in range(1, int(repeats) + 1)]
    lats = [l for l in lats if l]
    if skipped or not peaks:
        rows[n] = {"note": skipped or "not run"}
        continue
    rss = read(base + ".rss_kb")
    rss_paced = read(base + ".rss_paced_kb")
    clk = int(read(base + ".clk_tck") or 100)
    # (user, system) CPU ticks after the paced runs and at the end.
    split_paced = [int(t) for t in (read(base + ".cpu_paced_ticks") or "0 0").split()]
    split_end = [int(t) for t in (read(base + ".cpu_ticks") or "0 0").split()]
    ticks_paced, ticks_end = sum(split_paced), sum(split_end)
    handled_paced = sum(l["sent"] + l["warmup_received"] for l in lats)
    handled_peak = sum(p["sent"] + p["warmup_received"] for p in peaks)
    bad = [p for p in peaks + lats if not p["ok"]]
    # User and system CPU in the bursts apart: the relay's is mostly the
    # kernel's (socket reads and writes), which the worker pays as well.
    user_us, sys_us = (
        (e - p) / clk * 1e6 / handled_peak if ticks_end and handled_peak else None
        for p, e in zip(split_paced, split_end)
    )
    rows[n] = {
        "peak": statistics.median(p["throughput"] for p in peaks),
        "p50": statistics.median(l["latency_ms"]["p50"] for l in lats) if lats else None,
        "p99": statistics.median(l["latency_ms"]["p99"] for l in lats) if lats else None,
        "rss_mb": int(rss) / 1024 if rss else None,
        "rss_paced_mb": int(rss_paced) / 1024 if rss_paced else None,
        # Paced: includes start-up and the probe messages (small next to
        # the paced runs). Burst: the CPU spent during the peak runs alone.
        "cpu_paced_us": ticks_paced / clk * 1e6 / handled_paced if ticks_paced and handled_paced else None,
        "cpu_burst_us": (ticks_end - ticks_paced) / clk * 1e6 / handled_peak if ticks_end and handled_peak else None,
        "user_burst_us": user_us,
        "sys_burst_us": sys_us,
        "note": "; ".join(
            f"{'peak' if p in peaks else 'rate'} run: missing {p['missing']}, dup {p['duplicates']}, wrong {p['wrong_kind']}"
            for p in bad
        ),
    }

def fmt(v, spec):
    width = int(spec.split(".")[0])
    return format(v, spec) if v is not None else "n/a".rjust(width)

print()
print(f"mix {mix} (core-cancel: {cancel_mix}); peak = median of {repeats} runs of {peak_count} messages as fast as possible;")
print(f"latency = median of {repeats} runs at {rate} msg/s for {rate_secs} s (run first); RSS = VmHWM after that paced run and at the end (after the bursts);")
print("CPU = process CPU time per message handled, in the paced runs (one wakeup per message) and in the bursts (batched)")
print()
print(f"{'scenario':<27} {'peak out/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'RSS MB paced':>12} {'RSS MB peak':>11} "
      f"{'CPU us/msg paced':>16} {'CPU us/msg burst':>16}  note")
for n in names:
    r = rows[n]
    print(f"{labels[n]:<27} {fmt(r.get('peak'), '10.0f')} {fmt(r.get('p50'), '7.2f')} {fmt(r.get('p99'), '7.2f')} "
          f"{fmt(r.get('rss_paced_mb'), '12.1f')} {fmt(r.get('rss_mb'), '11.1f')} "
          f"{fmt(r.get('cpu_paced_us'), '16.1f')} {fmt(r.get('cpu_burst_us'), '16.1f')}  {r.get('note', '')}")

print()
print("CPU us/msg in the bursts, user + system:", ", ".join(
    f"{n} {rows[n]['user_burst_us']:.1f} + {rows[n]['sys_burst_us']:.1f}"
    for n in names if rows[n].get("user_burst_us") is not None and rows[n].get("sys_burst_us") is not None))

def ratio(a, b, key):
    x, y = rows[a].get(key), rows[b].get(key)
    return f"{x / y:.2f}" if x and y else "n/a"

core_vs_relay = ratio("core", "relay", "peak")
js_vs_relay = ratio("js", "js-relay", "peak")
vs_python = ratio("core", "python", "peak")
p99_vs_relay = ratio("core", "relay", "p99")
# CPU per message in the bursts: steadier than throughput on a shared
# machine, and what a platform pays per node. Lower is better for the worker,
# so the Python ratio is Python over core mode.
core_cpu_vs_relay = ratio("core", "relay", "cpu_burst_us")
js_cpu_vs_relay = ratio("js", "js-relay", "cpu_burst_us")
cpu_vs_python = ratio("python", "core", "cpu_burst_us")
rss = [rows[n].get("rss_mb") for n in ("core", "core-cancel", "core-json", "js") if rows[n].get("rss_mb")]
rss_mb = f"{max(rss):.1f}" if rss else "n/a"
paced = [rows[n].get("rss_paced_mb") for n in ("core", "core-cancel", "core-json", "js") if rows[n].get("rss_paced_mb")]
paced_mb = f"{max(paced):.1f}" if paced else "n/a"
print()
# The targets are those of docs/performance.md.
print(f"core / raw relay throughput      {core_vs_relay}  (target >= 0.85)")
print(f"jetstream / raw JS relay         {js_vs_relay}  (target >= 0.9)")
print(f"core / python throughput         {vs_python}  (target >= 10; the raw relay's: {ratio('relay', 'python', 'peak')})")
print(f"core / raw relay p99 at {rate}/s  {p99_vs_relay}  (target <= 1.3)")
print(f"worker peak RSS MB               {rss_mb}  (target <= 50; {paced_mb} after the paced run alone)")
print(f"core / raw relay CPU per message {core_cpu_vs_relay}  (target <= 2.0, bursts)")
print(f"jetstream / JS relay CPU per msg  {js_cpu_vs_relay}  (target <= 1.5, bursts)")
print(f"python / core CPU per message     {cpu_vs_python}  (target >= 10, bursts)")
core_vs_user = ratio("core", "user-relay", "peak")
core_cpu_vs_user = ratio("core", "user-relay", "cpu_burst_us")
print(f"core / user's relay throughput   {core_vs_user}  (no target: the second anchor)")
print(f"core / user's relay CPU per msg  {core_cpu_vs_user}  (no target: the second anchor, bursts)")
js_rtt_keep = ratio("js-rtt", "js", "peak")
js_rtt_vs_stock = ratio("js-rtt", "js-stock-rtt", "peak")
js_rtt_vs_relay = ratio("js-rtt", "js-relay-rtt", "peak")
proxy_keep = ratio("relay-px0", "relay", "peak")
print(f"jetstream at the rtt / loopback  {js_rtt_keep}  (target >= 0.8)")
print(f"jetstream / stock relay, rtt     {js_rtt_vs_stock}  (target >= 1.0)")
print(f"jetstream / raw JS relay, rtt    {js_rtt_vs_relay}  (no target)")
print(f"core relay via proxy 0 / direct  {proxy_keep}  (the proxy's cost; near 1 when it is not the bottleneck)")
cancel_cpu_vs_core = ratio("core-cancel", "core", "cpu_burst_us")
print(f"core with cancels / core CPU     {cancel_cpu_vs_core}  (goal <= 1.03, bursts: checking cancels and deadlines does not show)")
json_cpu_vs_msgpack = ratio("core-json", "core", "cpu_burst_us")
print(f"core JSON / MessagePack CPU/msg  {json_cpu_vs_msgpack}  (target <= 1.5, bursts)")
print(f"RESULT core_vs_relay={core_vs_relay} js_vs_relay={js_vs_relay} vs_python={vs_python} p99_vs_relay={p99_vs_relay} rss_mb={rss_mb} "
      f"core_cpu_vs_relay={core_cpu_vs_relay} js_cpu_vs_relay={js_cpu_vs_relay} cpu_vs_python={cpu_vs_python} "
      f"core_vs_user_relay={core_vs_user} core_cpu_vs_user_relay={core_cpu_vs_user} cancel_cpu_vs_core={cancel_cpu_vs_core} "
      f"json_cpu_vs_msgpack={json_cpu_vs_msgpack} "
      f"js_rtt_keep={js_rtt_keep} js_rtt_vs_stock={js_rtt_vs_stock} js_rtt_vs_relay={js_rtt_vs_relay} proxy_keep={proxy_keep}")
PY

if [[ -n $RECORDER ]]; then
    echo
    echo "profile of $PROFILE during the bursts (perf report --children, user space; data in $PROFILE_OUT):"
    { perf report -i "$PROFILE_OUT" --children --sort sym --percentage relative 2>/dev/null |
        grep -E '^ +[0-9]' | grep -v '\[k\]' | head -n "${PROFILE_TOP:-60}"; } || true
fi

exit "$FAILED"
