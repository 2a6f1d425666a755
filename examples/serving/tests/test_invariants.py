"""The checker's rules on hand-written event logs: one clean request, then
one defect per row (or a fault that explains it). No processes, no network.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import checker
import model

PROMPT, MAX_TOKENS = [5, 6, 7, 8, 9], 4
TOKENS, _ = model.generate(PROMPT, MAX_TOKENS, [])
BLOCKS, GENS = [[0, 1], [2, 3]], [[1, 1], [1, 1]]
T0 = 1_000_000.0

Logs = dict[str, list[dict[str, Any]]]


def clean() -> Logs:
    """A trtllm-flow request: minted, prefilled, read, freed by the read, answered."""
    def e(t: float, ev: str, **kw: Any) -> dict[str, Any]:
        return {"t": T0 + t, "ev": ev, **kw}

    return {
        "frontend": [e(0, "sent", rid="r-0", kind="normal", prompt=PROMPT, max_tokens=MAX_TOKENS, stop=[]),
                     e(40, "reply", rid="r-0", kind="terminal"),
                     e(40, "answer", rid="r-0", outcome="tokens", tokens=TOKENS), e(50, "done")],
        "prefill-1": [e(1, "mint", rid="r-0", disagg_request_id=77),
                      e(2, "context_start", rid="r-0", disagg_request_id=77),
                      e(3, "alloc", rid="r-0", blocks=BLOCKS, gens=GENS),
                      e(20, "published", rid="r-0", t_publish=T0 + 20),
                      e(25, "read_start", rid="r-0", reader="decode-1", blocks=BLOCKS, gens=GENS),
                      e(26, "read_end", rid="r-0", reader="decode-1"),
                      e(27, "free", rid="r-0", blocks=BLOCKS, gens=GENS, reason="read"),
                      e(9000, "stopped")],
        "decode-1": [e(22, "job", rid="r-0", disagg_request_id=77),
                     e(26, "read", rid="r-0", engine="prefill-1", blocks=BLOCKS, gens=GENS)],
    }


def write(tmp: str, logs: Logs, faults: list[dict[str, Any]] | None = None) -> str:
    with open(os.path.join(tmp, "run.json"), "w") as f:
        json.dump({"flow": "trtllm", "t0": T0, "pre_ms": 2000, "post_ms": 3000}, f)
    for name, events in logs.items():
        with open(os.path.join(tmp, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(ev) + "\n" for ev in events)
    with open(os.path.join(tmp, "faults.jsonl"), "w") as f:
        f.writelines(json.dumps({"ev": "fault", **ft}) + "\n" for ft in faults or [])
    return tmp


def broken(tmp: str, logs: Logs, faults: list[dict[str, Any]] | None = None) -> set[str]:
    rows, _, _ = checker.check(write(tmp, logs, faults))
    return {r.name for r in rows if not r.ok}


def insert(name: str, before: str, event: dict[str, Any]) -> Callable[[Logs], None]:
    def edit(logs: Logs) -> None:
        i = next(i for i, e in enumerate(logs[name]) if e["ev"] == before)
        logs[name].insert(i, {"t": logs[name][i]["t"], **event})
    return edit


def second_free(logs: Logs) -> None:
    logs["prefill-1"].insert(-1, {**logs["prefill-1"][6], "t": T0 + 4000, "reason": "hold"})


def free_by_hold(logs: Logs) -> None:
    logs["prefill-1"][6]["reason"] = "hold"


def free_before_read(logs: Logs) -> None:
    free = logs["prefill-1"].pop(6)
    logs["prefill-1"].insert(4, free)


def wrong_tokens(logs: Logs) -> None:
    logs["frontend"][2]["tokens"] = TOKENS[:-1] + [TOKENS[-1] + 1]


def second_reply(logs: Logs) -> None:
    logs["frontend"].insert(2, dict(logs["frontend"][1]))


def never_freed(logs: Logs) -> None:
    del logs["prefill-1"][6]


def unminted(logs: Logs) -> None:
    del logs["prefill-1"][0]


def no_answer(logs: Logs) -> None:
    logs["frontend"][2] = {**logs["frontend"][2], "outcome": "timeout"}


CASES = [
    ("freed twice", second_free, "every block freed exactly once"),
    ("freed before its read", free_before_read, "no read after free or during a free"),
    ("freed during its read", insert("prefill-1", "read_end", {"ev": "free", "rid": "r-0", "blocks": BLOCKS,
                                                                "gens": GENS, "reason": "release"}),
     "no read after free or during a free"),
    ("freed by the hold, no fault", free_by_hold, "hold expiry only where a fault explains it"),
    ("held at the end", never_freed, "no block held at the end"),
    ("answered twice", second_reply, "no second answer"),
    ("wrong tokens", wrong_tokens, "tokens equal to the reference model"),
    ("no answer, no fault", no_answer, "every request answered once"),
    ("context phase before the mint", unminted, "disagg_request_id unique, minted before the context phase"),
]


def test_a_clean_request_breaks_nothing(tmp_path: Any) -> None:
    assert broken(str(tmp_path), clean()) == set()


@pytest.mark.parametrize("what, edit, row", CASES, ids=[c[0] for c in CASES])
def test_each_defect_breaks_its_row(what: str, edit: Callable[[Logs], None], row: str, tmp_path: Any) -> None:
    logs = clean()
    edit(logs)
    assert row in broken(str(tmp_path), logs)


@pytest.mark.parametrize("edit", [free_by_hold, second_reply, no_answer])
def test_a_fault_explains_what_it_may_cause(edit: Callable[[Logs], None], tmp_path: Any) -> None:
    logs = clean()
    edit(logs)
    fault = {"name": "worker_kill", "target": "worker-1", "t_start": T0 + 500, "t_end": T0 + 1000}
    assert broken(str(tmp_path), logs, [fault]) == set()
