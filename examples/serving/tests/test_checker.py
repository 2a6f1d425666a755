"""The checker catches a broken engine: each test runs the whole system for
a few seconds with one deliberate defect and expects the run to fail on the
invariant that defect breaks.

Needs what scripts/serving.sh needs (nats-server, etcd, the worker binary at
target/debug/prefill-handoff or $SERVING_BIN).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "..", "run.py")
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BIN = os.environ.get("SERVING_BIN", os.path.join(ROOT, "target", "debug", "prefill-handoff"))


def run_with(bug: str, out: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, RUN, "--flow", "vllm", "--seconds", "5", "--rate", "15", "--hold-ms", "1500",
         "--seed", "50", "--bug", bug, "--out", out, "--bin", BIN],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    print(proc.stdout)
    with open(os.path.join(out, "vllm", "check.json"), encoding="utf-8") as f:
        return proc.returncode, json.load(f)


@pytest.mark.parametrize("bug, row", [
    # The hold timer is not cancelled when the read frees the blocks: freed
    # again at expiry, and the free list then hands a block to two requests.
    ("double-free", "every block freed exactly once"),
    # The blocks are freed as the result goes out, not when the advertised
    # hold ends, and reads are served from whatever the blocks hold.
    ("read-after-free", "no read after free or during a free"),
    # Release notices are ignored: refused handoffs wait for the hold.
    ("drop-release", "refused handoffs freed by their release notice"),
    # The decode engine publishes its answer twice.
    ("answer-twice", "no second answer"),
])
def test_a_broken_engine_is_caught(bug: str, row: str, tmp_path: object) -> None:
    rc, check = run_with(bug, str(tmp_path))
    assert rc != 0, f"the run with --bug {bug} passed"
    assert check["rows"][row] is False, f"{row!r} held with --bug {bug}: {check['rows']}"
