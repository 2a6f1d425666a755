#!/usr/bin/env bash
# The whole system in miniature: disaggregated serving on loopback, with the
# handoff workers between toy prefill and decode engines, and a checker that
# says whether every request got exactly one right answer and every KV block
# was freed exactly once.
#
#   scripts/serving.sh [--flow vllm|trtllm|both] [--faults] [--seconds N] [--seed S]
#                      [--rate R] [--hold-ms MS] [--out DIR]
#
# Per flow: nats-server, etcd, two prefill-handoff workers, two prefill
# engines, two decode engines and a frontend (examples/serving/, Python),
# then the checker's table. The vllm flow runs the workers in core mode, the
# trtllm flow in JetStream mode. --faults injects, at times drawn from the
# printed seed: SIGKILL and restart of a worker and of a decode engine, etcd
# stopped past the lease TTL, and (JetStream) a nats-server restart. Exits 1
# when an invariant broke; the logs stay in the run directory it prints.
# examples/serving/README.md says what runs and what the checker checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import nats, msgpack' 2>/dev/null || ! command -v etcd >/dev/null ||
    { [ ! -x /usr/sbin/nats-server ] && ! command -v nats-server >/dev/null; }; then
    bash scripts/install-deps.sh
fi
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
bin="${SERVING_BIN:-${CARGO_TARGET_DIR:-target}/debug/prefill-handoff}"
if [ ! -x "$bin" ]; then
    cargo build --locked --quiet --bin prefill-handoff
fi
exec python3 examples/serving/run.py --bin "$bin" "$@"
