#!/usr/bin/env bash
# vendor/async-nats is generated: the async-nats release named below, as the
# registry publishes it, with each patch of vendor/patches/ applied in order
# (docs/vendor-async-nats.md says why each one is there and how to drop it).
# Cargo.toml points `[patch.crates-io]` at the result.
#
#   scripts/vendor-async-nats.sh          regenerate vendor/async-nats
#   scripts/vendor-async-nats.sh --check  fail if it differs from what the
#                                         patches give (CI, scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.52.0
# What a dependency needs of the package; its tests, examples and benches
# are never built by a dependent.
KEEP=(Cargo.toml README.md CHANGELOG.md src)

# The published package: from cargo's cache, fetched through cargo if absent.
crate_file() {
    local found
    found=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/async-nats-$VERSION.crate 2>/dev/null | head -n1 || true)
    if [ -z "$found" ]; then
        local tmp
        tmp=$(mktemp -d)
        mkdir -p "$tmp/src"
        printf '[package]\nname = "fetch-async-nats"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nasync-nats = { version = "=%s", default-features = false }\n' \
            "$VERSION" >"$tmp/Cargo.toml"
        touch "$tmp/src/lib.rs"
        cargo fetch --quiet --manifest-path "$tmp/Cargo.toml" >&2
        rm -rf "$tmp"
        found=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/async-nats-$VERSION.crate | head -n1)
    fi
    echo "$found"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$(crate_file)" -C "$work"
mkdir "$work/out"
for item in "${KEEP[@]}"; do
    cp -R "$work/async-nats-$VERSION/$item" "$work/out/"
done
for patch in vendor/patches/*.patch; do
    [ -e "$patch" ] || continue
    patch --quiet --forward --no-backup-if-mismatch -p1 -d "$work/out" <"$patch"
done

if [ "${1:-}" = "--check" ]; then
    if ! diff -r "$work/out" vendor/async-nats >/dev/null; then
        diff -ru "$work/out" vendor/async-nats | head -n 40 >&2
        echo "vendor-async-nats.sh: vendor/async-nats is not async-nats $VERSION with vendor/patches/ applied; run scripts/vendor-async-nats.sh" >&2
        exit 1
    fi
    echo "vendor-async-nats.sh: vendor/async-nats is async-nats $VERSION with $(ls vendor/patches/*.patch | wc -l) patches"
    exit 0
fi
rm -rf vendor/async-nats
cp -R "$work/out" vendor/async-nats
echo "vendor-async-nats.sh: vendor/async-nats regenerated"
