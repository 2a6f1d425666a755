#!/usr/bin/env bash
# How src/ is cut. Exits non-zero on either of:
#   - an import cycle between the entries (files and subfolders) of a folder
#     of src/, src/ itself included: scripts/check_modules.py says how the
#     graph is read;
#   - a function over 80 lines (clippy.toml's too-many-lines-threshold) that
#     does not say why it is not split, in
#     #[expect(clippy::too_many_lines, reason = "...")]: clippy's lint, turned
#     on for src/ in src/lib.rs and src/main.rs, run on the library and the
#     binaries with -D warnings, so a stale #[expect] fails too.
#
#   scripts/check-modules.sh                  the graph and its cycles, then clippy
#   scripts/check-modules.sh --quiet          the cycles only, then clippy
#   scripts/check-modules.sh --cycles-only    no clippy: CI's build step
#                                             (scripts/test.sh) runs the lint
#                                             with the rest of clippy's
#
# CHECK_MODULES_CRATE checks another crate than this one (the tests,
# scripts/tests/test_check_modules.py, plant cycles and long functions in one).
set -euo pipefail
scripts=$(cd "$(dirname "$0")" && pwd)
cd "${CHECK_MODULES_CRATE:-$scripts/..}"

quiet=()
clippy=1
for arg in "$@"; do
    case "$arg" in
    --quiet) quiet=(--quiet) ;;
    --cycles-only) clippy=0 ;;
    *)
        echo "check-modules: unknown option $arg (--quiet, --cycles-only)" >&2
        exit 2
        ;;
    esac
done

python3 "$scripts/check_modules.py" "${quiet[@]}" src
if [ "$clippy" = 1 ]; then
    cargo clippy --quiet --lib --bins -- -D warnings
    echo "check-modules: no function over the threshold without its reason"
fi
