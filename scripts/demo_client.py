#!/usr/bin/env python3
"""The demo's client: publishes prefill results and prints where each went.

    demo_client.py NATS_URL mixed|fenced|recovered|deadlines

It listens on every subject (">") while it publishes, matches each output to
the input that caused it (decode jobs by request_id, replies by their unique
reply subject, dead letters by their bytes) and prints one line per input.
Anything published on a subject no input asked for is reported too.
"""

import asyncio
import json
import sys
import time

import msgpack
import nats

PREFILL = "llm.prefill.results"
GEN = "llm.gen.jobs"
DEAD = "llm.handoff.dead"
CANCEL = "llm.handoff.cancel"
RELEASE = "llm.kv.release"


def frame(finish_reason=None, params=None, **extra):
    f = {"token_ids": [9906, 1917], "text": "Hello", "finish_reason": finish_reason,
         "completion_usage": {"prompt_tokens": 42, "completion_tokens": 1}}
    if params is not None:
        f["disaggregated_params"] = params
    f.update(extra)
    return f


def trt(**kw):
    p = {"ctx_request_id": 1001, "request_type": "context_only",
         "opaque_state": "q2t2LXN0YXRl", "first_gen_tokens": [1917]}
    p.update(kw)
    return p


class Case:
    def __init__(self, label, frames=None, body=None, raw=None, json_in=False,
                 nats_reply=False, no_reply_to=False, reply_to=None, deadline_ms=None,
                 notice=False):
        """nats_reply: no reply_to in the body; the reply subject rides on the
        NATS message instead. no_reply_to: no reply subject at all.
        notice: a KV release notice is expected beside the reply."""
        self.label = label
        self.outputs = 2 if notice else 1
        self.slug = label.split(":")[0].strip().replace(" ", "-")
        self.request_id = "demo-" + self.slug
        self.reply = "llm.replies.demo." + self.slug
        self.nats_reply = nats_reply
        self.json_in = json_in
        if raw is not None:
            self.payload = raw
            return
        if body is None:
            body = {"request_id": self.request_id, "frames": frames,
                    "request": {"model": "llama-3-8b", "max_tokens": 64}}
            if not (nats_reply or no_reply_to):
                body["reply_to"] = reply_to or self.reply
            if deadline_ms is not None:
                body["deadline_ms"] = deadline_ms
        self.payload = json.dumps(body).encode() if json_in else msgpack.packb(body)


def mixed_cases():
    return [
        Case("trtllm-mint: TensorRT-LLM handoff, the worker mints the ID", [frame(None, trt())]),
        Case("trtllm-keep: TensorRT-LLM handoff with the CTX ID to keep", [frame("length", trt(disagg_request_id=4242))]),
        Case("sglang: SGLang bootstrap handoff", [frame(None, {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 7})]),
        Case("vllm: vLLM kv_transfer_params", [frame("not_finished", {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_block_ids": [3, 4, 5], "remote_port": 5600})]),
        Case("opaque: unknown engine, params passed on", [frame(None, {"kv_handle": "blob-17"})]),
        Case("eos: finished at prefill (EOS)", [frame("eos", trt())]),
        Case("stop-json: finished (stop), JSON in and out", [frame("stop")], json_in=True),
        Case("cancelled: cancelled during prefill", [frame("cancelled")]),
        Case("nats-reply: no reply_to, answered on the NATS reply subject", [frame("eos")], nats_reply=True),
        Case("no-output: frames empty", []),
        Case("prefill-failed: first frame is an error", [{"error": "CUDA out of memory"}]),
        Case("no-params: needs decode, no disaggregated_params", [frame(None)]),
        Case("missing-ctx: ctx_request_id null", [frame(None, trt(ctx_request_id=None))]),
        Case("invalid-ctx: ctx_request_id negative", [frame(None, trt(ctx_request_id=-5))]),
        Case("invalid-type: request_type generation_only", [frame(None, trt(request_type="generation_only"))]),
        Case("invalid-disagg: disagg_request_id 0", [frame(None, trt(disagg_request_id=0))]),
        Case("invalid-bootstrap: bootstrap_port 0", [frame(None, {"bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 1})]),
        Case("invalid-kv: remote_engine_id empty", [frame(None, {"remote_engine_id": "", "remote_block_ids": [1]})]),
        Case("malformed: request_id missing", body={"reply_to": "llm.replies.demo.malformed", "frames": [frame("eos")]}),
        Case("garbage: not MessagePack", raw=b"\xc1 this is not a prefill result"),
        Case("hostile: reply_to $JS.API.STREAM.DELETE.X", [frame("eos")], reply_to="$JS.API.STREAM.DELETE.X"),
        Case("no-reply: no reply_to, no NATS reply", [frame("eos")], no_reply_to=True),
        Case("too-large: 1.1 MiB result", [frame("eos", padding="x" * (1100 * 1024))]),
    ]


def fenced_cases():
    return [
        Case("fenced-mint: TensorRT-LLM handoff needing an ID", [frame(None, trt())]),
        Case("fenced-keep: TensorRT-LLM handoff with its CTX ID", [frame(None, trt(disagg_request_id=777))]),
        Case("fenced-eos: finished at prefill", [frame("eos")]),
    ]


def deadline_cases():
    now = int(time.time() * 1000)
    sglang = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 8}
    return [
        Case("cancelled-by-client: cancelled (prefill-handoff cancel) before its result",
             [frame(None, trt())], notice=True),
        Case("expired: deadline passed 5 s before the handoff", [frame(None, sglang)],
             deadline_ms=now - 5000, notice=True),
        Case("in-time: deadline 30 s ahead, carried by the job", [frame(None, trt())],
             deadline_ms=now + 30000),
        Case("expired-eos: deadline passed, but finished at prefill", [frame("eos")],
             deadline_ms=now - 5000),
        Case("bad-deadline: deadline_ms 1.5", [frame(None, trt())], deadline_ms=1.5),
    ]


def recovered_cases():
    return [Case("recovered-mint: TensorRT-LLM handoff needing an ID", [frame(None, trt())])]


def describe(case, msg):
    subject = msg.subject
    hdrs = msg.headers or {}
    if subject == DEAD:
        return f"dead letter   {hdrs.get('Handoff-Error-Code')}: {hdrs.get('Handoff-Error', '')[:70]}"
    json_out = hdrs.get("Content-Type") == "application/json"
    out = json.loads(msg.data) if json_out else msgpack.unpackb(msg.data, raw=False)
    enc = "json" if json_out else "msgpack"
    if subject == RELEASE:
        return (f"KV release    reason={out.get('reason')} backend={out.get('backend')} "
                f"handoff keys={sorted(out.get('handoff', {}))}")
    if subject == GEN:
        worker = out.get("worker", {})
        extra = ""
        if out.get("disagg_request_id") is not None:
            extra = f" disagg_request_id={out['disagg_request_id']}"
        if out.get("deadline_ms") is not None:
            extra += f" deadline_ms={out['deadline_ms']}"
        return (f"decode job    backend={out.get('backend')}{extra} "
                f"by machine_id={worker.get('machine_id')} ({enc})")
    if out.get("kind") == "terminal":
        return f"terminal      finish_reason={out['output'].get('finish_reason')!r} ({enc})"
    if out.get("kind") == "error":
        err = out["error"]
        return f"error         {err['code']}: {err['message'][:70]}"
    return f"? {out!r:.80}"


async def main(url, mode):
    cases = {"mixed": mixed_cases, "fenced": fenced_cases, "recovered": recovered_cases,
             "deadlines": deadline_cases}[mode]()
    nc = await nats.connect(url, max_reconnect_attempts=3)
    seen = []

    async def on_msg(msg):
        if msg.subject not in (PREFILL, CANCEL):
            seen.append(msg)

    await nc.subscribe(">", cb=on_msg)
    await nc.flush()
    for case in cases:
        headers = {"Content-Type": "application/json"} if case.json_in else None
        reply = case.reply if case.nats_reply else ""
        await nc.publish(PREFILL, case.payload, reply=reply, headers=headers)
    await nc.flush()
    deadline = time.monotonic() + 10
    while len(seen) < sum(c.outputs for c in cases) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # let any duplicate show
    await nc.drain()

    def owner(msg):
        for case in cases:
            if msg.subject == DEAD and msg.data == case.payload:
                return case
            if msg.subject == case.reply:
                return case
        if msg.subject in (GEN, RELEASE):
            rid = (json.loads(msg.data) if (msg.headers or {}).get("Content-Type") == "application/json"
                   else msgpack.unpackb(msg.data, raw=False)).get("request_id")
            for case in cases:
                if case.request_id == rid:
                    return case
        return None

    outputs = {}
    strays = []
    for msg in seen:
        case = owner(msg)
        if case is None:
            strays.append(msg)
        else:
            outputs.setdefault(case.slug, []).append(msg)
    width = max(len(c.label) for c in cases)
    ok = True
    machines = {}
    for case in cases:
        got = outputs.get(case.slug, [])
        if len(got) != case.outputs:
            ok = False
            print(f"  {case.label:<{width}}  !! {len(got)} outputs")
            continue
        for i, msg in enumerate(got):
            label = case.label if i == 0 else ""
            print(f"  {label:<{width}}  -> {msg.subject:<36} {describe(case, msg)}")
        msg = got[0]
        if msg.subject == GEN:
            m = msgpack.unpackb(msg.data, raw=False) if not case.json_in else json.loads(msg.data)
            machines[m["worker"]["machine_id"]] = machines.get(m["worker"]["machine_id"], 0) + 1
    for msg in strays:
        ok = False
        print(f"  !! unexpected message on {msg.subject}")
    notices = sum(1 for v in outputs.values() for m in v if m.subject == RELEASE)
    print(f"\n  {len(cases)} results in, {sum(len(v) for v in outputs.values()) - notices} outputs, "
          f"{notices} KV release notices, {len(strays)} stray; decode jobs by machine_id: {machines}")
    print("  every result got exactly one output" if ok else "  !! NOT every result got exactly one output")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
