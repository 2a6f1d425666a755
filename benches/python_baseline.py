#!/usr/bin/env python3
"""The Python baseline: what a team might write instead of prefill-handoff.

nats-py + msgpack, one asyncio process, a queue subscription on the prefill
subject, and the same decision as the worker (contract 4.2): the first frame
decides; finished prefills get a terminal response; TensorRT-LLM handoffs are
checked for ctx_request_id and get a minted disagg_request_id (rc22 layout, a
fixed machine ID: no etcd); SGLang and vLLM parameters are validated; errors
go to the reply subject, undecodable input to the dead-letter subject.

It is meant to be a fair, idiomatic implementation, not a straw man: one
connection, callbacks without per-message tasks, uvloop when installed, no
logging on the hot path.

    python3 benches/python_baseline.py --nats-url nats://127.0.0.1:4222 --namespace llm

Prints "python_baseline: ready" on stderr once subscribed; exits on SIGTERM.
"""

import argparse
import asyncio
import signal
import sys
import time

import msgpack
import nats

NOT_FINISHED = {None, "length", "not_finished"}
TRTLLM_KEYS = ("ctx_request_id", "request_type", "disagg_request_id", "opaque_state", "first_gen_tokens")
VLLM_KEYS = ("do_remote_prefill", "remote_engine_id", "remote_block_ids")
MAX_ID = 2**63 - 1
EPOCH_MS = 1735689600000  # 2025-01-01T00:00:00Z
PASS_THROUGH = object()


class Refused(Exception):
    """An error response: (code, message)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class IdMinter:
    """TensorRT-LLM rc22 request IDs for one machine ID, never repeating."""

    def __init__(self, machine_id):
        self.node, self.proc = divmod(machine_id, 64)
        self.last_ms = -1
        self.counter = 0

    def mint(self):
        now = max(int(time.time() * 1000) - EPOCH_MS, self.last_ms)
        if now == self.last_ms:
            self.counter += 1
            while self.counter >= 1024:  # used up this millisecond
                now = int(time.time() * 1000) - EPOCH_MS
                if now > self.last_ms:
                    self.counter = 0
        else:
            self.counter = 0
        self.last_ms = now
        raw = (now % 2**39) << 24 | self.node << 16 | self.proc << 10 | self.counter
        return raw % (MAX_ID - 2**40) + 2**40


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_handoff(params, minter):
    """Validates disaggregated_params; returns (backend, handoff, disagg_request_id)."""
    if not isinstance(params, dict):
        raise Refused("no_disaggregated_params", "the first frame has no disaggregated_params map")
    if any(k in params for k in TRTLLM_KEYS):
        ctx = params.get("ctx_request_id")
        if ctx is None:
            raise Refused("missing_ctx_request_id", "ctx_request_id is null")
        if not is_int(ctx) or not 0 <= ctx < 2**63:
            raise Refused("invalid_ctx_request_id", "ctx_request_id is not an integer in [0, 2^63)")
        rtype = params.get("request_type")
        if "request_type" in params and rtype != "context_only":
            raise Refused("invalid_request_type", "request_type is not context_only")
        disagg = params.get("disagg_request_id")
        if disagg is None:
            disagg = minter.mint()
        elif not is_int(disagg) or not 1 <= disagg < MAX_ID:
            raise Refused("invalid_disagg_request_id", "disagg_request_id is out of range")
        handoff = dict(params)
        handoff["request_type"] = "generation_only"
        handoff["disagg_request_id"] = disagg
        return "trtllm", handoff, disagg
    if any(k.startswith("bootstrap_") for k in params if isinstance(k, str)):
        host, port, room = (params.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
        if not (isinstance(host, str) and host and is_int(port) and 1 <= port <= 65535
                and is_int(room) and 0 <= room < 2**63):
            raise Refused("invalid_bootstrap", "bootstrap_host/port/room are invalid")
        return "sglang", params, None
    if any(k in params for k in VLLM_KEYS):
        engine, blocks, port = (params.get(k) for k in ("remote_engine_id", "remote_block_ids", "remote_port"))
        if not (isinstance(engine, str) and engine and isinstance(blocks, list)
                and all(is_int(b) and b >= 0 for b in blocks)
                and (port is None or (is_int(port) and 1 <= port <= 65535))):
            raise Refused("invalid_kv_transfer_params", "remote_engine_id/block_ids/port are invalid")
        return "vllm", params, None
    return "opaque", params, None


class Worker:
    def __init__(self, nc, ns, machine_id):
        self.nc = nc
        self.gen = f"{ns}.gen.jobs"
        self.dead = f"{ns}.handoff.dead"
        self.allowed_prefixes = ("_INBOX.", f"{ns}.replies.")
        self.minter = IdMinter(machine_id)
        self.instance = {"instance_id": "python-baseline", "machine_id": machine_id}

    def reply_allowed(self, subject):
        return (isinstance(subject, str) and subject.startswith(self.allowed_prefixes)
                and not any(c in subject for c in "*> \t"))

    async def dead_letter(self, msg, code, why):
        headers = {"Handoff-Error-Code": code, "Handoff-Error": why, "Handoff-Source-Subject": msg.subject}
        await self.nc.publish(self.dead, msg.data, headers=headers)

    async def handle(self, msg):
        try:
            body = msgpack.unpackb(msg.data, raw=False)
        except Exception as e:  # noqa: BLE001 - any decode failure is malformed input
            return await self.dead_letter(msg, "malformed", f"not MessagePack: {e}")
        if not isinstance(body, dict):
            return await self.dead_letter(msg, "malformed", "the body is not a map")
        reply = body.get("reply_to") or msg.reply
        if not reply:
            return await self.dead_letter(msg, "missing_reply_to", "no reply_to")
        if not self.reply_allowed(reply):
            return await self.dead_letter(msg, "reply_to_not_allowed", f"{reply!r} is not allowed")
        request_id = body.get("request_id")
        try:
            out_subject, out, headers = self.decide(body, request_id, reply)
        except Refused as e:
            out_subject, headers = reply, None
            out = {"request_id": request_id if isinstance(request_id, str) else None,
                   "kind": "error", "error": {"code": e.code, "message": str(e)}}
        await self.nc.publish(out_subject, msgpack.packb(out, use_bin_type=True), headers=headers)

    def decide(self, body, request_id, reply):
        if not isinstance(request_id, str) or not 1 <= len(request_id.encode()) <= 256:
            raise Refused("malformed", "request_id must be a string of 1 to 256 bytes")
        frames = body.get("frames")
        if not isinstance(frames, list) or not all(isinstance(f, dict) for f in frames):
            raise Refused("malformed", "frames must be an array of maps")
        if not frames:
            raise Refused("no_output", "the prefill produced no frames")
        first = dict(frames[0])
        if first.get("error") is not None:
            raise Refused("prefill_failed", f"the prefill failed: {first['error']}")
        params = first.pop("disaggregated_params", None)
        if first.get("finish_reason") not in NOT_FINISHED:
            return reply, {"request_id": request_id, "kind": "terminal", "output": first}, None
        backend, handoff, disagg = check_handoff(params, self.minter)
        job = {"request_id": request_id, "reply_to": reply, "backend": backend}
        if disagg is not None:
            job["disagg_request_id"] = disagg
        job["handoff"] = handoff
        job["prefill_output"] = first
        if "request" in body:
            job["request"] = body["request"]
        job["worker"] = self.instance
        return self.gen, job, {"Nats-Msg-Id": f"handoff-{request_id}"}


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--namespace", default="llm")
    p.add_argument("--machine-id", type=int, default=0)
    args = p.parse_args()
    ns = args.namespace
    nc = await nats.connect(args.nats_url, name="python-baseline")
    worker = Worker(nc, ns, args.machine_id)
    await nc.subscribe(f"{ns}.prefill.results", queue=f"{ns}-handoff", cb=worker.handle,
                       pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    await nc.flush()
    print("python_baseline: ready", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await nc.drain()


if __name__ == "__main__":
    try:
        import uvloop  # optional, faster event loop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
