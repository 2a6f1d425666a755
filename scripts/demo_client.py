#!/usr/bin/env python3
"""The demo's client: publishes prefill results and prints where each went.

    demo_client.py NATS_URL mixed|fenced|recovered|deadlines

Valid traffic goes through the Python client (clients/python): IDs minted from
the workers' ID service before the context phase, frames built by the engine
adapters, results published with HandoffClient.publish_result, cancels with
HandoffClient.cancel. Only what the client refuses to build (bytes that are
not MessagePack, a result without request_id or without any reply subject, a
reply subject on the NATS message) is published raw on the same connection,
to show what the workers do with it.

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

from prefill_handoff import HandoffClient, IdentityUnavailable
from prefill_handoff.engines import sglang, trtllm, vllm

PREFILL = "llm.prefill.results"
GEN = "llm.gen.jobs"
DEAD = "llm.handoff.dead"
CANCEL = "llm.handoff.cancel"
RELEASE = "llm.kv.release"
IDS = "llm.handoff.ids"


def frame(finish_reason=None, params=None, **extra):
    f = {"token_ids": [9906, 1917], "text": "Hello", "finish_reason": finish_reason,
         "completion_usage": {"prompt_tokens": 42, "completion_tokens": 1}}
    if params is not None:
        f["disaggregated_params"] = params
    f.update(extra)
    return f


def trt(**kw):
    """What TensorRT-LLM's context phase returns (opaque_state is bytes)."""
    p = {"ctx_request_id": 1001, "request_type": "context_only",
         "opaque_state": b"\xab\xad\xb6-state", "first_gen_tokens": [1917]}
    p.update(kw)
    return p


MINT = object()  # stands for "the ID the case minted from the ID service"
REQUEST = {"model": "llama-3-8b", "max_tokens": 64}


class Case:
    def __init__(self, label, frames=None, raw=None, json_in=False, nats_reply=False,
                 reply_to=None, deadline_ms=None, notice=False):
        """frames: published with HandoffClient.publish_result; a
        disaggregated_params value MINT becomes TensorRT-LLM params carrying
        an ID minted from the ID service just before. raw: bytes (or a body to
        pack) published as they are, for what the client refuses to build.
        nats_reply: raw, no reply_to in the body; the reply subject rides on
        the NATS message. notice: a KV release notice is expected beside the
        reply."""
        self.label = label
        self.outputs = 2 if notice else 1
        self.slug = label.split(":")[0].strip().replace(" ", "-")
        self.request_id = "demo-" + self.slug
        self.reply = "llm.replies.demo." + self.slug
        self.frames, self.raw, self.json_in = frames, raw, json_in
        self.nats_reply, self.reply_to, self.deadline_ms = nats_reply, reply_to, deadline_ms
        self.payload = None  # what was published, for matching dead letters

    async def publish(self, client):
        if self.frames is None:
            body = self.raw
            if isinstance(body, dict):
                if self.nats_reply:
                    body = {"request_id": self.request_id, **body}
                body = msgpack.packb(body)
            self.payload = body
            reply = self.reply if self.nats_reply else ""
            await client.nc.publish(client.subjects.prefill_results, body, reply=reply)
            return
        frames = []
        for f in self.frames:
            if f.get("disaggregated_params") is MINT:
                params = await trtllm.context_params(client)
                f = trtllm.frame(trt(**params), token_ids=f["token_ids"], text=f["text"],
                                 finish_reason=f["finish_reason"])
            frames.append(f)
        if self.reply_to is None:
            self.reply = client.reply_subject(self.request_id)
        else:
            self.reply = self.reply_to
        await client.publish_result(self.request_id, frames, reply_to=self.reply_to,
                                    request=REQUEST, deadline_ms=self.deadline_ms,
                                    encoding="json" if self.json_in else "msgpack")


VLLM_OUTPUT = {  # a vLLM RequestOutput's fields, two KV-cache groups
    "outputs": [{"token_ids": [1917], "text": "Hello", "finish_reason": "length"}],
    "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "prefill-0",
                           "remote_block_ids": [[3, 4, 5], [11]], "remote_host": "10.0.0.8",
                           "remote_port": 5600},
}


def mixed_cases():
    return [
        Case("trtllm: TensorRT-LLM handoff, its ID minted before the context phase", [frame(None, MINT)]),
        Case("trtllm-no-id: TensorRT-LLM context phase run without an ID", [frame(None, trt())],
             notice=True),
        Case("sglang: SGLang bootstrap frame, the server's default port",
             [sglang.bootstrap_frame("10.0.0.7", None, 7, text="Hello")]),
        Case("vllm: vLLM kv_transfer_params, two KV-cache groups", [vllm.frame(VLLM_OUTPUT)]),
        Case("opaque: unknown engine, params passed on", [frame(None, {"kv_handle": "blob-17"})]),
        Case("eos: finished at prefill (EOS)", [frame("eos", trt())]),
        Case("stop-json: finished (stop), JSON in and out", [frame("stop")], json_in=True),
        Case("cancelled: cancelled during prefill", [frame("cancelled")]),
        Case("nats-reply: no reply_to, answered on the NATS reply subject",
             raw={"frames": [frame("eos")]}, nats_reply=True),
        Case("no-output: frames empty", []),
        Case("prefill-failed: first frame is an error", [{"error": "CUDA out of memory"}]),
        Case("no-params: needs decode, no disaggregated_params", [frame(None)]),
        Case("missing-ctx: ctx_request_id null", [frame(None, trt(ctx_request_id=None))]),
        Case("invalid-ctx: ctx_request_id negative", [frame(None, trt(ctx_request_id=-5))]),
        Case("invalid-type: request_type generation_only", [frame(None, trt(request_type="generation_only"))]),
        Case("invalid-disagg: disagg_request_id 0", [frame(None, trt(disagg_request_id=0))]),
        Case("invalid-bootstrap: bootstrap_port 0", [sglang.bootstrap_frame("h", 0, 1)]),
        Case("invalid-kv: remote_engine_id empty", [frame(None, {"remote_engine_id": "", "remote_block_ids": [1]})]),
        Case("malformed: request_id missing",
             raw={"reply_to": "llm.replies.demo.malformed", "frames": [frame("eos")]}),
        Case("garbage: not MessagePack", raw=b"\xc1 this is not a prefill result"),
        Case("hostile: reply_to $JS.API.STREAM.DELETE.X", [frame("eos")], reply_to="$JS.API.STREAM.DELETE.X"),
        Case("no-reply: no reply_to, no NATS reply", raw={"request_id": "demo-no-reply", "frames": [frame("eos")]}),
        Case("too-large: 1.1 MiB result", [frame("eos", padding="x" * (1100 * 1024))]),
    ]


def fenced_cases():
    return [
        Case("fenced-keep: TensorRT-LLM handoff with its ID from before", [frame(None, trt(disagg_request_id=777))]),
        Case("fenced-eos: finished at prefill", [frame("eos")]),
    ]


def deadline_cases():
    now = int(time.time() * 1000)
    return [
        Case("cancelled-by-client: cancelled (HandoffClient.cancel) before its result",
             [frame(None, MINT)], notice=True),
        Case("expired: deadline passed 5 s before the handoff",
             [sglang.bootstrap_frame("10.0.0.7", 8998, 8)], deadline_ms=now - 5000, notice=True),
        Case("in-time: deadline 30 s ahead, carried by the job", [frame(None, MINT)],
             deadline_ms=now + 30000),
        Case("expired-eos: deadline passed, but finished at prefill", [frame("eos")],
             deadline_ms=now - 5000),
        Case("bad-deadline: deadline_ms 1.5", [frame(None, MINT)], deadline_ms=1.5),
    ]


def recovered_cases():
    return [Case("recovered: TensorRT-LLM handoff, ID minted again", [frame(None, MINT)])]


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
    client = await HandoffClient.connect(url, max_reconnect_attempts=3)
    nc = client.nc
    seen = []

    replies = client.reply_subject("x").rsplit(".", 1)[0] + "."

    async def on_msg(msg):
        if msg.subject in (PREFILL, CANCEL, IDS):
            return  # the demo's own input
        if msg.subject.startswith("_INBOX.") and not msg.subject.startswith(replies):
            return  # the ID service's answers to mint_ids
        seen.append(msg)

    await nc.subscribe(">", cb=on_msg)
    await nc.flush()
    if mode == "fenced":
        try:
            await client.mint_ids()
            print("  ID service: minted while fenced (unexpected)")
        except IdentityUnavailable as e:
            print(f"  ID service while fenced: {e.code}: {e.message[:70]}")
    if mode == "deadlines":
        await client.cancel("demo-cancelled-by-client", reason="client closed the stream")
        await asyncio.sleep(0.5)  # both workers hear the cancel (a plain subscription each)
    for case in cases:
        await case.publish(client)
    await nc.flush()
    deadline = time.monotonic() + 10
    while len(seen) < sum(c.outputs for c in cases) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # let any duplicate show
    await client.close()

    def owner(msg):
        for case in cases:
            if msg.subject == DEAD and msg.data == case.payload:
                return case
            if msg.subject == case.reply:
                return case
        if msg.subject == DEAD:
            try:  # a result the client published, dead-lettered with its bytes
                rid = msgpack.unpackb(msg.data, raw=False).get("request_id")
            except Exception:
                return None
            for case in cases:
                if case.request_id == rid:
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
            # The client's reply subjects are long inbox subjects: named, not shown.
            shown = "reply_to (the client's inbox)" if msg.subject == case.reply and \
                msg.subject.startswith("_INBOX.") else msg.subject
            print(f"  {label:<{width}}  -> {shown:<36} {describe(case, msg)}")
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
