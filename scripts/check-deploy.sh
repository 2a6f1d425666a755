#!/usr/bin/env bash
# Checks the deployment kit in deploy/ with the tools platform teams use:
#   1. the renderer's and the metric check's own tests (scripts/deploy/test_*.py)
#   2. the kustomize base and the TLS overlay, rendered by
#      scripts/deploy/kustomize.py, validated by kubernetes-validate (strict,
#      its default, current Kubernetes version). It has no schema for the
#      Prometheus Operator's ServiceMonitor and PrometheusRule: those are
#      checked by the tests of step 1 (the ServiceMonitor scrapes a port of
#      the Service) and by step 3 (the PrometheusRule's rules)
#   3. the PrometheusRule holds the rules of deploy/prometheus/alerts.yaml;
#      `promtool check rules` on both; `promtool test rules` (a test for
#      every alert, firing and silent)
#   4. `systemd-analyze verify` on the unit and its TLS drop-in (a copy whose
#      ExecStart is the built binary: verify wants it to exist); any warning
#      fails
#   5. a live worker in core and in JetStream mode (nats-server and etcd on
#      free loopback ports; JetStream after `setup`, with
#      jetstream.create = false, as the Kubernetes base runs it):
#      `promtool check metrics` on its /metrics, and
#      every metric and label value the rules and the dashboard name must be
#      in those scrapes (scripts/deploy/metric_names.py)
# Needs what scripts/install-deps.sh installs (promtool, kubernetes-validate,
# nats-server, etcd) and target/debug/prefill-handoff (built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "check-deploy: $*"; }
die() { echo "check-deploy: FAILED: $*" >&2; exit 1; }

TMP=$(mktemp -d -t prefill-handoff-deploy.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

# --- 1. the checkers' own tests ---------------------------------------------
python3 -m unittest discover -q -s scripts/deploy -p 'test_*.py' 2>"$TMP/unittest.log" ||
    { cat "$TMP/unittest.log" >&2; die "scripts/deploy tests"; }
say "scripts/deploy tests: $(grep -E '^Ran ' "$TMP/unittest.log")"

# --- 2. kustomize build + kubernetes-validate -------------------------------
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/tls; do
    out="$TMP/$(basename "$dir").yaml"
    python3 scripts/deploy/kustomize.py "$dir" >"$out" || die "kustomize build $dir"
    kubernetes-validate --strict --quiet --no-warn "$out" || die "kubernetes-validate $dir"
    kinds=$(python3 -c 'import sys, yaml; print(" ".join(d["kind"] for d in yaml.safe_load_all(open(sys.argv[1])) if d))' "$out")
    say "$dir: valid (kubernetes-validate $(kubernetes-validate --version 2>&1 | tail -n 1), its default Kubernetes version): $kinds; ServiceMonitor and PrometheusRule have no schema there"
done

# --- 3. alert rules ---------------------------------------------------------
python3 scripts/deploy/prometheusrule.py --check || die "PrometheusRule out of date"
python3 -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["spec"], open(sys.argv[2], "w"))' \
    deploy/kubernetes/base/prometheusrule.yaml "$TMP/prometheusrule-spec.yaml"
promtool check rules deploy/prometheus/alerts.yaml "$TMP/prometheusrule-spec.yaml" >"$TMP/rules.log" 2>&1 ||
    { cat "$TMP/rules.log" >&2; die "promtool check rules"; }
say "promtool check rules: $(grep -c SUCCESS "$TMP/rules.log") files, $(grep -m1 -o '[0-9]* rules found' "$TMP/rules.log")"
promtool test rules deploy/prometheus/alerts_test.yaml >"$TMP/rules-test.log" 2>&1 ||
    { cat "$TMP/rules-test.log" >&2; die "promtool test rules"; }
alerts=$(grep -c '^ *- alert:' deploy/prometheus/alerts.yaml)
for alert in $(sed -n 's/^ *- alert: *//p' deploy/prometheus/alerts.yaml); do
    grep -q "alertname: $alert\$" deploy/prometheus/alerts_test.yaml || die "no promtool test for $alert"
done
say "promtool test rules: SUCCESS, every one of the $alerts alerts tested"

# --- 4. systemd -------------------------------------------------------------
bin=$PWD/target/debug/prefill-handoff
if [ ! -x "$bin" ]; then
    say "building target/debug/prefill-handoff"
    cargo build --locked --quiet --bin prefill-handoff
fi
mkdir -p "$TMP/systemd"
cp -r deploy/systemd/prefill-handoff.service deploy/systemd/prefill-handoff.service.d "$TMP/systemd/"
sed -i "s|^ExecStart=/usr/local/bin/prefill-handoff |ExecStart=$bin |" "$TMP/systemd/prefill-handoff.service"
grep -q "^ExecStart=$bin " "$TMP/systemd/prefill-handoff.service" || die "the unit's ExecStart is not /usr/local/bin/prefill-handoff"
# At the default log level verify is silent about unknown keys; at info it
# names them. Anything it says is a failure.
SYSTEMD_LOG_LEVEL=info systemd-analyze verify "$TMP/systemd/prefill-handoff.service" >"$TMP/verify.log" 2>&1 ||
    { cat "$TMP/verify.log" >&2; die "systemd-analyze verify"; }
if [ -s "$TMP/verify.log" ]; then cat "$TMP/verify.log" >&2; die "systemd-analyze verify warned"; fi
say "systemd-analyze verify: the unit and its tls.conf drop-in, no warning ($(systemd-analyze --version | head -n 1))"

# --- 5. live workers: promtool check metrics, metric names ------------------
NATS_SERVER=${HANDOFF_TEST_NATS_SERVER:-/usr/sbin/nats-server}
[ -x "$NATS_SERVER" ] || NATS_SERVER=$(command -v nats-server)
ETCD=$(command -v etcd)
# shellcheck source=scripts/local-servers.sh
. scripts/local-servers.sh
start_nats jetstream
start_etcd check-deploy

# JetStream as the Kubernetes base runs it: `setup` (the Job) creates the
# streams, then the worker runs with jetstream.create = false.
"$bin" setup --nats-url "$NATS_URL" --mode jetstream --namespace deployjetstream \
    >"$TMP/setup.log" 2>&1 || { cat "$TMP/setup.log" >&2; die "prefill-handoff setup"; }
scrapes=()
for mode in core jetstream; do
    port=$(free_port)
    "$bin" run --nats-url "$NATS_URL" --etcd-endpoints "$ETCD_URL" --mode "$mode" \
        --metrics-addr "127.0.0.1:$port" --namespace "deploy$mode" \
        --set jetstream.create=false >"$TMP/worker-$mode.log" 2>&1 &
    worker=$!
    PIDS+=("$worker")
    ready=0
    for _ in $(seq 150); do
        if curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then ready=1; break; fi
        sleep 0.1
    done
    [ "$ready" = 1 ] || { tail -n 20 "$TMP/worker-$mode.log" >&2; die "the $mode worker did not become ready"; }
    curl -sf "http://127.0.0.1:$port/metrics" >"$TMP/metrics-$mode.txt"
    kill "$worker"
    wait "$worker" || die "the $mode worker did not exit 0 after SIGTERM"
    promtool check metrics <"$TMP/metrics-$mode.txt" >"$TMP/check-metrics-$mode.log" 2>&1 ||
        { cat "$TMP/check-metrics-$mode.log" >&2; die "promtool check metrics ($mode mode)"; }
    say "promtool check metrics ($mode mode): $(grep -c '^# TYPE' "$TMP/metrics-$mode.txt") metric families, no problem"
    scrapes+=("$TMP/metrics-$mode.txt")
done
python3 scripts/deploy/metric_names.py "${scrapes[@]}" | sed 's/^/check-deploy: /' ||
    die "a rule or the dashboard names a metric the worker does not export"
say "OK"
