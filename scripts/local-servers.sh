# Sourced by bench.sh and instructions.sh: nats-server and etcd on free
# loopback ports, with their files in "$TMP" and their PIDs appended to
# PIDS (the caller's cleanup stops them). Uses NATS_SERVER, ETCD, TMP, PIDS
# and the caller's die().

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_port() {
    local port=$1 i
    for i in $(seq 150); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# start_nats [jetstream]: sets NATS_PORT and NATS_URL.
start_nats() {
    NATS_PORT=$(free_port)
    {
        printf 'listen: 127.0.0.1:%s\n' "$NATS_PORT"
        if [[ ${1:-} == jetstream ]]; then printf 'jetstream { store_dir: "%s/jetstream" }\n' "$TMP"; fi
    } >"$TMP/nats.conf"
    "$NATS_SERVER" -c "$TMP/nats.conf" >"$TMP/nats.log" 2>&1 &
    PIDS+=($!)
    wait_port "$NATS_PORT" || die "nats-server did not start (see $TMP/nats.log)"
    NATS_URL=nats://127.0.0.1:$NATS_PORT
}

# start_etcd NAME: sets ETCD_PORT and ETCD_URL.
start_etcd() {
    local name=$1 peer
    ETCD_PORT=$(free_port)
    peer=$(free_port)
    "$ETCD" --name "$name" --data-dir "$TMP/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$name=http://127.0.0.1:$peer" >"$TMP/etcd.log" 2>&1 &
    PIDS+=($!)
    wait_port "$ETCD_PORT" || die "etcd did not start (see $TMP/etcd.log)"
    ETCD_URL=http://127.0.0.1:$ETCD_PORT
}
