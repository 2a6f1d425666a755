#!/usr/bin/env bash
# The README's first command: two prefill-handoff workers on a real
# nats-server and etcd (free loopback ports, a temporary directory), a mixed
# set of prefill results published through the Python client
# (clients/python, scripts/demo_client.py), and where each one went; a
# cancelled request and an expired deadline with their KV release notices.
# Then a lease loss (etcd stopped and restarted) and a graceful shutdown.
# Cleans up after itself.
#
#   scripts/demo.sh
#
# Installs what is missing first (scripts/install-deps.sh), then builds the
# binary: the dev profile by default, which the tests share, so that the demo
# starts in seconds once the project has been built or tested;
# DEMO_PROFILE=release builds with the release profile (minutes on two cores,
# with thin LTO). DEMO_KEEP=1 keeps the temporary directory (logs) afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
started=$(date +%s)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

# --- dependencies and build -------------------------------------------------
if [ -x scripts/install-deps.sh ] || [ -f scripts/install-deps.sh ]; then
    bash scripts/install-deps.sh
else
    command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt-get install -y -qq nats-server
    command -v etcd >/dev/null || apt-get install -y -qq etcd-server etcd-client
    python3 -c 'import nats, msgpack' 2>/dev/null || PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q nats-py msgpack
fi
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

profile="${DEMO_PROFILE:-dev}"
say "building prefill-handoff ($profile profile)"
if [ ! -d target ]; then
    echo "demo: first build in this checkout: about 5 minutes on a fresh 2-core machine (not a hang)"
fi
cargo build --profile "$profile" --locked --quiet --bin prefill-handoff
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
out_dir=$profile
[ "$profile" = dev ] && out_dir=debug
bin="$target_dir/$out_dir/prefill-handoff"
[ -x "$bin" ] || die "no binary at $bin"
built=$(date +%s)

nats_server=/usr/sbin/nats-server
[ -x "$nats_server" ] || nats_server=$(command -v nats-server) || die "nats-server is not installed"
command -v etcd >/dev/null || die "etcd is not installed"

# --- servers ----------------------------------------------------------------
tmp=$(mktemp -d -t prefill-handoff-demo.XXXXXX)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${DEMO_KEEP:-0}" = 1 ]; then echo "demo: logs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
    local port=$1 i
    for i in $(seq 1 150); do
        (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    die "nothing listens on port $port (see $tmp)"
}

nats_port=$(free_port)
etcd_port=$(free_port)
etcd_peer=$(free_port)
nats_url="nats://127.0.0.1:$nats_port"
etcd_url="http://127.0.0.1:$etcd_port"

say "starting nats-server ($nats_url) and etcd ($etcd_url) in $tmp"
# max_payload 2 MB, so that a result over the worker's 1 MiB limit reaches it
# (and is dead-lettered as too_large) instead of being refused by the server.
printf 'listen: 127.0.0.1:%s\nmax_payload: 2MB\n' "$nats_port" >"$tmp/nats.conf"
"$nats_server" -c "$tmp/nats.conf" >"$tmp/nats.log" 2>&1 &
pids+=($!)
disown $!
start_etcd() {
    etcd --name demo --data-dir "$tmp/etcd" \
        --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-cluster "demo=http://127.0.0.1:$etcd_peer" >>"$tmp/etcd.log" 2>&1 &
    etcd_pid=$!
    disown "$etcd_pid" # killed on purpose below; keep bash from reporting it
    pids+=("$etcd_pid")
    wait_port "$etcd_port"
    for _ in $(seq 1 100); do
        ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" get /probe >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "etcd did not answer"
}
wait_port "$nats_port"
start_etcd

# The leased keys (slots and instances); the slots' persistent ID floors
# under /llm/handoff/id-floors/ outlive the leases by design.
etcd_keys() {
    ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" get --prefix --keys-only /llm/handoff/ | sed '/^$/d; \#^/llm/handoff/id-floors/#d; s/^/    /'
}

# --- workers ----------------------------------------------------------------
say "starting two workers (one queue group, lease TTL 3 s)"
worker_pids=()
for n in 1 2; do
    HANDOFF_NATS__URL="$nats_url" HANDOFF_ETCD__ENDPOINTS="$etcd_url" \
        HANDOFF_METRICS_ADDR="127.0.0.1:$(free_port)" HANDOFF_LEASE_TTL_SECS=3 \
        HANDOFF_NATS__NAME="demo-worker-$n" RUST_LOG=info NO_COLOR=1 \
        "$bin" run >"$tmp/worker-$n.log" 2>&1 &
    worker_pids+=($!)
    pids+=($!)
done
for n in 1 2; do
    for _ in $(seq 1 150); do
        grep -qs "consuming prefill results" "$tmp/worker-$n.log" && break
        kill -0 "${worker_pids[$((n - 1))]}" 2>/dev/null || { cat "$tmp/worker-$n.log"; die "worker $n exited"; }
        sleep 0.1
    done
    grep -qs "consuming prefill results" "$tmp/worker-$n.log" || { cat "$tmp/worker-$n.log"; die "worker $n did not start"; }
done
machine_id_of() { grep -m1 "identity held" "$tmp/worker-$1.log" | sed -E 's/\x1b\[[0-9;]*m//g; s/.*machine_id=([0-9]+).*/\1/'; }
instance_of() { grep -m1 "identity held" "$tmp/worker-$1.log" | sed -E 's/\x1b\[[0-9;]*m//g; s/.*instance_id=([0-9a-f]+).*/\1/'; }
for n in 1 2; do
    echo "  worker $n: pid ${worker_pids[$((n - 1))]}, lease $(instance_of "$n"), machine_id $(machine_id_of "$n")"
done
echo "  etcd keys:"
etcd_keys

# --- traffic ----------------------------------------------------------------
# Through the Python client (clients/python), from its source tree.
export PYTHONPATH="$root/clients/python/src${PYTHONPATH:+:$PYTHONPATH}"
say "publishing a mixed set of prefill results to llm.prefill.results"
python3 scripts/demo_client.py "$nats_url" mixed

say "deadlines and cancels: a request its client cancelled, one past its deadline, one in time"
python3 scripts/demo_client.py "$nats_url" deadlines

say "lease loss: etcd stopped for longer than the TTL"
kill -9 "$etcd_pid"
while kill -0 "$etcd_pid" 2>/dev/null; do sleep 0.1; done
for n in 1 2; do
    for _ in $(seq 1 100); do
        grep -q "identity fenced" "$tmp/worker-$n.log" && break
        sleep 0.1
    done
done
sleep 1
python3 scripts/demo_client.py "$nats_url" fenced
say "etcd back: the workers take new leases and slots without restarting"
start_etcd
for n in 1 2; do
    for _ in $(seq 1 200); do
        [ "$(grep -c "minting enabled" "$tmp/worker-$n.log")" -ge 2 ] && break
        sleep 0.1
    done
done
python3 scripts/demo_client.py "$nats_url" recovered
echo "  etcd keys:"
etcd_keys

# --- shutdown ---------------------------------------------------------------
say "SIGTERM to both workers: drain, finish, flush, revoke the lease, exit 0"
for pid in "${worker_pids[@]}"; do kill -TERM "$pid"; done
for n in 1 2; do
    code=0
    wait "${worker_pids[$((n - 1))]}" || code=$?
    echo "  worker $n exited with code $code; $(grep -m1 'worker stopped' "$tmp/worker-$n.log" | sed -E 's/\x1b\[[0-9;]*m//g; s/.*worker stopped //')"
done
left=$(etcd_keys)
if [ -z "$left" ]; then echo "  etcd: no slot or instance keys left (leases revoked)"; else echo "  etcd keys left:"; echo "$left"; fi

say "done in $(($(date +%s) - started)) s ($(($(date +%s) - built)) s after the build)"
