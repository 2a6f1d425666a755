#!/usr/bin/env bash
# The import graph of src/ and its cycles (scripts/module_graph.py says how
# it is read): for src/ and each of its folders, which entry names a path
# into which. Exits non-zero on a cycle between the entries of one folder,
# or on a function longer than 80 lines whose head does not say why it is
# not split.
#
#   scripts/check-modules.sh                  the graph, then the cycles
#   scripts/check-modules.sh --quiet          the cycles only (CI)
#   scripts/check-modules.sh --evidence       each edge with where it comes from
#   scripts/check-modules.sh --long-functions 80
#                                             functions longer than 80 lines
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/module_graph.py --max-lines 80 "$@"
