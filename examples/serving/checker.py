"""The checker: reads every process's event log of a run and states whether
the system kept its promises.

    checker.py RUN_DIR        prints the table; exit 1 when an invariant broke

The invariants (one row each):
- every request answered exactly once to its client (tokens or a typed
  error; a client timeout only where a fault explains it);
- no second answer, except where a fault explains it (a redelivery);
- every answered token sequence equal to the reference model's;
- errors that fit their request (cancelled, deadline_exceeded), others only
  where a fault explains them;
- every block allocated to one request at a time and freed exactly once;
- no block read after it was freed or by another request, none freed while
  a read of it was in progress;
- no block held at the end;
- how blocks were freed (read, release notice, hold expiry, finished at
  prefill); hold expiry only where a fault explains it;
- every handoff the worker refused freed by its release notice;
- TensorRT-LLM flow: no disagg_request_id used by two requests, each minted
  before its context phase, and the decode job carries it.

A fault explains what happens to a request sent from `pre_ms` before the
fault began until `post_ms` after it was over (the processes recovered).
Reads run.json, faults.jsonl and every other *.jsonl in RUN_DIR.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import events
import model

EXPECTED_ERRORS = {"cancel": {"cancelled"}, "deadline": {"deadline_exceeded"}}


@dataclass
class Row:
    name: str
    ok: bool
    detail: str
    problems: list[str] = field(default_factory=list)


@dataclass
class Fault:
    name: str
    target: str
    t_start: float
    t_end: float
    recovered: bool = True
    blocks_to_hold: int = 0
    requests: int = 0


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


class Run:
    def __init__(self, run_dir: str) -> None:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
            self.cfg: dict[str, Any] = json.load(f)
        self.faults = [Fault(e["name"], e.get("target", ""), e["t_start"], e["t_end"], e.get("recovered", True))
                       for e in self._read(run_dir, "faults.jsonl") if e.get("ev") == "fault"]
        self.logs: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(glob.glob(os.path.join(run_dir, "*.jsonl"))):
            name = os.path.basename(path)[: -len(".jsonl")]
            if name != "faults":
                self.logs[name] = events.read(path)
        self.pre = float(self.cfg.get("pre_ms", 2000))
        self.post = float(self.cfg.get("post_ms", 3000))

    @staticmethod
    def _read(run_dir: str, name: str) -> list[dict[str, Any]]:
        path = os.path.join(run_dir, name)
        return events.read(path) if os.path.exists(path) else []

    def of(self, prefix: str) -> dict[str, list[dict[str, Any]]]:
        return {k: v for k, v in self.logs.items() if k.startswith(prefix)}


def check(run_dir: str) -> tuple[list[Row], dict[str, Any], list[Fault]]:
    run = Run(run_dir)
    front = [e for name, log in run.of("frontend").items() for e in log]
    sent: dict[str, dict[str, Any]] = {e["rid"]: e for e in front if e["ev"] == "sent"}
    answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    replies: Counter[str] = Counter()
    for e in front:
        if e["ev"] == "answer":
            answers[e["rid"]].append(e)
        elif e["ev"] == "reply" and e.get("rid"):
            replies[e["rid"]] += 1

    def fault_of(rid: str) -> Fault | None:
        t = sent[rid]["t"] if rid in sent else None
        if t is None:
            return None
        # The latest fault whose window holds the request's send time.
        found = None
        for f in run.faults:
            if f.t_start - run.pre <= t <= f.t_end + run.post:
                found = f
        return found

    for f in run.faults:
        f.requests = sum(1 for e in sent.values() if f.t_start - run.pre <= e["t"] <= f.t_end + run.post)

    rows: list[Row] = []
    if run.faults:
        probs = [f"{f.name} ({f.target}): the processes did not recover" for f in run.faults if not f.recovered]
        rows.append(Row("every fault recovered from", not probs, f"{len(run.faults)} faults injected", probs))

    # --- answers -------------------------------------------------------------------
    probs: list[str] = []
    outcomes: Counter[str] = Counter()
    timeouts_explained = 0
    for rid, s in sent.items():
        got = answers.get(rid, [])
        if len(got) != 1:
            probs.append(f"{rid}: {len(got)} answers recorded by the frontend")
            continue
        outcomes[got[0]["outcome"]] += 1
        if got[0]["outcome"] == "timeout":
            if fault_of(rid):
                timeouts_explained += 1
            else:
                probs.append(f"{rid} ({s['kind']}): no answer within the client's timeout, and no fault explains it")
    for e in front:
        if e["ev"] == "frontend_error":
            probs.append(f"{e['rid']}: the frontend failed: {e['error']}")
    if not front or not any(e["ev"] == "done" for e in front):
        probs.append("the frontend did not finish")
    rows.append(Row("every request answered once", not probs,
                    f"{len(sent)} requests: {outcomes['tokens']} tokens, {outcomes['error']} errors, "
                    f"{outcomes['timeout']} client timeouts ({timeouts_explained} explained by a fault)", probs))

    probs = []
    dups = explained = 0
    for rid, n in replies.items():
        if n > 1:
            dups += 1
            if fault_of(rid):
                explained += 1
            else:
                probs.append(f"{rid}: {n} answers reached the client, and no fault explains it")
    rows.append(Row("no second answer", not probs, f"{dups} requests answered twice or more ({explained} explained)", probs))

    probs = []
    checked = 0
    for rid, got in answers.items():
        for a in got:
            if a["outcome"] != "tokens" or rid not in sent:
                continue
            s = sent[rid]
            want, _ = model.generate(s["prompt"], s["max_tokens"], s["stop"])
            checked += 1
            if a.get("tokens") != want:
                probs.append(f"{rid}: tokens {a.get('tokens')} where the reference model gives {want}")
    rows.append(Row("tokens equal to the reference model", not probs, f"{checked} token answers compared", probs))

    probs = []
    codes: Counter[str] = Counter()
    for rid, got in answers.items():
        for a in got:
            s = sent.get(rid)
            if s is None:
                continue
            kind = s["kind"]
            if a["outcome"] == "error":
                codes[a["code"]] += 1
                if a["code"] in EXPECTED_ERRORS.get(kind, set()) or fault_of(rid):
                    continue
                probs.append(f"{rid} ({kind}): error {a['code']}, and no fault explains it")
            elif a["outcome"] == "tokens" and kind == "deadline":
                probs.append(f"{rid}: decoded although its deadline passed during prefill")
    rows.append(Row("errors fit their request", not probs,
                    ", ".join(f"{c} {n}" for c, n in sorted(codes.items())) or "none", probs))

    # --- blocks ----------------------------------------------------------------------
    owner: dict[tuple[str, int, int], str] = {}  # (engine, block, gen) -> rid, while allocated
    current: dict[tuple[str, int], int] = {}  # (engine, block) -> gen of the live allocation
    freed: set[tuple[str, int, int]] = set()
    reads_open: Counter[tuple[str, int]] = Counter()
    alloc_of: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (engine, rid) -> blocks
    free_reasons: Counter[str] = Counter()
    free_reason_of: dict[tuple[str, str], str] = {}
    once_probs: list[str] = []
    read_probs: list[str] = []
    hold_probs: list[str] = []
    end_probs: list[str] = []
    n_alloc = n_reads = 0
    open_reads: dict[tuple[str, Any, str], list[list[int]]] = defaultdict(list)
    prefill_logs = run.of("prefill")
    if not prefill_logs:
        end_probs.append("no prefill engine logs")
    for eng, log in prefill_logs.items():
        for e in log:
            ev = e["ev"]
            if ev == "alloc":
                pairs = [(b, g) for grp, gens in zip(e["blocks"], e["gens"]) for b, g in zip(grp, gens)]
                alloc_of[(eng, e["rid"])] = pairs
                for b, g in pairs:
                    n_alloc += 1
                    if (eng, b) in current:
                        once_probs.append(f"{eng} block {b}: allocated to {e['rid']} while still held by "
                                          f"{owner.get((eng, b, current[(eng, b)]))}")
                    current[(eng, b)] = g
                    owner[(eng, b, g)] = e["rid"]
            elif ev == "free":
                reason = e["reason"]
                pairs = [(b, g) for grp, gens in zip(e["blocks"], e["gens"]) for b, g in zip(grp, gens)]
                free_reasons[reason] += len(pairs)
                free_reason_of.setdefault((eng, e["rid"]), reason)
                for b, g in pairs:
                    if (eng, b, g) in freed:
                        once_probs.append(f"{eng} block {b} (allocation {g}, {e['rid']}): freed twice ({reason})")
                        continue
                    if current.get((eng, b)) != g:
                        once_probs.append(f"{eng} block {b} (allocation {g}): freed but not allocated")
                    if reads_open[(eng, b)] > 0:
                        read_probs.append(f"{eng} block {b} ({e['rid']}): freed ({reason}) while a read was in progress")
                    freed.add((eng, b, g))
                    current.pop((eng, b), None)
                if reason == "hold":
                    f = fault_of(e["rid"])
                    if f is not None:
                        f.blocks_to_hold += len(pairs)
                    else:
                        hold_probs.append(f"{e['rid']}: {len(pairs)} blocks freed by the hold's expiry, and no fault explains it")
            elif ev == "read_start":
                n_reads += 1
                for grp, gens in zip(e["blocks"], e["gens"]):
                    for b, g in zip(grp, gens):
                        reads_open[(eng, b)] += 1
                        if (eng, b, g) in freed or current.get((eng, b)) != g:
                            read_probs.append(f"{eng} block {b}: read for {e['rid']} after it was freed")
                        elif owner.get((eng, b, g)) != e["rid"]:
                            read_probs.append(f"{eng} block {b}: read for {e['rid']}, allocated to {owner.get((eng, b, g))}")
                open_reads[(eng, e.get("reader"), e["rid"])].append([b for grp in e["blocks"] for b in grp])
            elif ev == "read_end":
                stack = open_reads.get((eng, e.get("reader"), e["rid"]))
                opened = stack.pop() if stack else []
                for b in opened:
                    reads_open[(eng, b)] -= 1
        if not any(e["ev"] == "stopped" for e in log):
            end_probs.append(f"{eng} did not stop cleanly (no final event)")
    for (eng, b), g in sorted(current.items()):
        end_probs.append(f"{eng} block {b}: still held at the end by {owner.get((eng, b, g))}")

    # What the decode engines read must be what prefill allocated to that request.
    for eng, log in run.of("decode").items():
        for e in log:
            if e["ev"] != "read":
                continue
            for grp, gens in zip(e["blocks"], e["gens"]):
                for b, g in zip(grp, gens):
                    if owner.get((e["engine"], b, g)) != e["rid"]:
                        read_probs.append(f"{eng} decoded {e['rid']} from {e['engine']} block {b} (allocation {g}), "
                                          f"which belonged to {owner.get((e['engine'], b, g))}")

    rows.append(Row("every block freed exactly once", not once_probs,
                    f"{n_alloc} block allocations, {len(freed)} frees", once_probs))
    rows.append(Row("no read after free or during a free", not read_probs, f"{n_reads} reads", read_probs))
    rows.append(Row("no block held at the end", not end_probs,
                    f"{len(current)} held by {len({owner.get((e, b, g)) for (e, b), g in current.items()})} requests",
                    end_probs))
    rows.append(Row("hold expiry only where a fault explains it", not hold_probs,
                    "blocks freed by " + ", ".join(f"{r} {n}" for r, n in sorted(free_reasons.items())), hold_probs))

    # Every handoff the worker refused after validating it: its notice frees it.
    probs = []
    refused = 0
    for rid, got in answers.items():
        s = sent.get(rid)
        if s is None or not got or got[0]["outcome"] != "error" or got[0]["code"] not in ("cancelled", "deadline_exceeded"):
            continue
        refused += 1
        reasons = [r for (eng, r2), r in free_reason_of.items() if r2 == rid]
        if reasons != ["release"] and not fault_of(rid):
            probs.append(f"{rid} ({got[0]['code']}): blocks freed by {reasons or 'nothing'}, not by its release notice")
    rows.append(Row("refused handoffs freed by their release notice", not probs, f"{refused} refused handoffs", probs))

    # --- TensorRT-LLM IDs ------------------------------------------------------------
    if run.cfg.get("flow") == "trtllm":
        probs = []
        minted: dict[int, str] = {}
        id_of: dict[str, int] = {}
        for eng, log in prefill_logs.items():
            minted_here: dict[str, int] = {}
            for e in log:
                if e["ev"] == "mint":
                    i = e["disagg_request_id"]
                    if i in minted and minted[i] != e["rid"]:
                        probs.append(f"disagg_request_id {i}: minted for {minted[i]} and {e['rid']}")
                    minted[i] = e["rid"]
                    minted_here[e["rid"]] = i
                    id_of[e["rid"]] = i
                elif e["ev"] == "context_start" and (
                        minted_here.get(e["rid"]) is None or e.get("disagg_request_id") != minted_here[e["rid"]]):
                    probs.append(f"{e['rid']}: context phase without a minted disagg_request_id before it")
        for eng, log in run.of("decode").items():
            for e in log:
                if e["ev"] == "job" and e.get("disagg_request_id") != id_of.get(e["rid"]):
                    probs.append(f"{e['rid']}: decode job with disagg_request_id {e.get('disagg_request_id')}, "
                                 f"minted {id_of.get(e['rid'])}")
        rows.append(Row("disagg_request_id unique, minted before the context phase", not probs,
                        f"{len(minted)} IDs minted", probs))

    # --- figures -----------------------------------------------------------------------
    published = {e["rid"]: e["t_publish"] for log in prefill_logs.values() for e in log if e["ev"] == "published"}
    handoff: list[float] = []
    seen: set[str] = set()
    for log in run.of("decode").values():
        for e in log:
            if e["ev"] == "job" and e["rid"] in published and e["rid"] not in seen:
                seen.add(e["rid"])
                handoff.append(e["t"] - published[e["rid"]])
    e2e = [got[0]["t"] - sent[rid]["t"] for rid, got in answers.items()
           if rid in sent and got and got[0]["outcome"] == "tokens"]
    starts = [e["t"] for e in front if e["ev"] == "sent"]
    span_s = (max(starts) - min(starts)) / 1000 if len(starts) > 1 else 0.0
    figures = {
        "requests": len(sent),
        "sent_per_s": round(len(sent) / span_s, 1) if span_s else None,
        "handoff_p50_ms": percentile(handoff, 50), "handoff_p99_ms": percentile(handoff, 99),
        "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
        "blocks_to_hold": {f"{f.name}@{(f.t_start - run.cfg['t0']) / 1000:.1f}s": f.blocks_to_hold for f in run.faults},
    }
    return rows, figures, run.faults


def render(rows: list[Row], figures: dict[str, Any], faults: list[Fault], cfg: dict[str, Any]) -> str:
    out = []
    w = max(len(r.name) for r in rows)
    out.append(f"{'invariant':<{w}}  result  detail")
    for r in rows:
        out.append(f"{r.name:<{w}}  {'ok' if r.ok else 'BROKEN':<6}  {r.detail}")
    for r in rows:
        for p in r.problems[:10]:
            out.append(f"  BROKEN {r.name}: {p}")
        if len(r.problems) > 10:
            out.append(f"  ... and {len(r.problems) - 10} more")
    if faults:
        out.append("")
        out.append(f"{'fault':<16} {'target':<12} {'at s':>6} {'for s':>6} {'requests':>9} {'blocks to hold':>15}")
        for f in faults:
            out.append(f"{f.name:<16} {f.target:<12} {(f.t_start - cfg['t0']) / 1000:>6.1f} "
                       f"{(f.t_end - f.t_start) / 1000:>6.1f} {f.requests:>9} {f.blocks_to_hold:>15}")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    out.append("")
    out.append(f"requests {figures['requests']} at {figures['sent_per_s']}/s; handoff (result published -> decode "
               f"job received) p50 {ms(figures['handoff_p50_ms'])} ms, p99 {ms(figures['handoff_p99_ms'])} ms; "
               f"request to tokens p50 {ms(figures['e2e_p50_ms'])} ms, p99 {ms(figures['e2e_p99_ms'])} ms")
    return "\n".join(out)


def report(run_dir: str) -> tuple[bool, str]:
    """Checks a run; writes check.json (for tests and tools) and table.txt
    into its directory; returns whether every invariant held, and the table."""
    rows, figures, faults = check(run_dir)
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    table = render(rows, figures, faults, cfg)
    ok = all(r.ok for r in rows)
    with open(os.path.join(run_dir, "check.json"), "w", encoding="utf-8") as f:
        json.dump({"ok": ok, "rows": {r.name: r.ok for r in rows},
                   "problems": {r.name: r.problems[:50] for r in rows}, "figures": figures}, f, indent=1)
    with open(os.path.join(run_dir, "table.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    return ok, table


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: checker.py RUN_DIR", file=sys.stderr)
        return 2
    ok, table = report(sys.argv[1])
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
