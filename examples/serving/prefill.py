"""A prefill engine: the context phase, a KV pool, the block server, the hold.

    prefill.py --nats URL --ns NS --id prefill-1 --events FILE --flow vllm|trtllm --mode core|jetstream

For each request from the frontend (queue group on {ns}.serving.prefill):
1. TensorRT-LLM flow: mint disagg_request_id from the worker's ID service
   before the context phase (what TensorRT-LLM's disagg orchestrator does).
2. Context phase: allocate blocks in every KV-cache group, compute the
   prompt's KV into them, compute the first token.
3. Finished at prefill (stop token): free the blocks, publish the result
   (terminal). Otherwise hold the blocks until `kv_expires_ms` and publish
   the result with the handoff parameters and `kv_expires_ms`.
4. Free a held request's blocks exactly once, on the first of: a decode
   engine confirms its read; a release notice names the request; the hold
   runs out. A free that comes while a read is in progress waits for the
   read to end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

import blocks as transfer
import common
import model
import shapes
from events import EventLog, now_ms
from pool import Pool, PoolFull
from prefill_handoff import HandoffClient
from prefill_handoff.engines import trtllm


@dataclass
class Session:
    rid: str
    key: str
    blocks: list[list[int]]
    gens: list[list[int]]
    n_tokens: int
    held: bool = True
    readers: int = 0
    pending: str = ""  # the reason of a free that waits for a read to end
    timer: asyncio.TimerHandle | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.log = EventLog(args.events, args.id)
        self.pool = Pool(args.pool_blocks)
        self.by_key: dict[str, Session] = {}
        self.by_rid: dict[str, Session] = {}
        self.ctx_ids = 0
        self.port = 0
        self.bugs = set(args.bug.split(",")) if args.bug else set()
        self.tasks: set[asyncio.Task[None]] = set()

    # --- blocks ---------------------------------------------------------------

    def free(self, s: Session, reason: str) -> None:
        """Frees a session's blocks once; waits for an ongoing read."""
        if not s.held and "double-free" not in self.bugs:
            return
        if s.readers > 0 and "read-after-free" not in self.bugs:
            s.pending = s.pending or reason
            return
        if s.timer is not None and "double-free" not in self.bugs:
            s.timer.cancel()
        s.held = False
        for group in s.blocks:
            self.pool.free(group)
        self.log("free", rid=s.rid, key=s.key, blocks=s.blocks, gens=s.gens, reason=reason)
        if "read-after-free" not in self.bugs:
            self.by_key.pop(s.key, None)
            self.by_rid.pop(s.rid, None)

    async def alloc(self, rid: str, n_tokens: int) -> tuple[list[list[int]], list[list[int]]] | None:
        n = model.blocks_needed(n_tokens)
        for _ in range(100):
            try:
                ids = self.pool.alloc(n * model.GROUPS)
            except PoolFull:
                await asyncio.sleep(0.02)
                continue
            groups = [ids[g * n:(g + 1) * n] for g in range(model.GROUPS)]
            gens = [[self.pool.gen[b] for b in grp] for grp in groups]
            return groups, gens
        return None

    async def serve_reads(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        s: Session | None = None
        reading = False
        reader_id = None
        try:
            msg = await transfer.recv(reader)
            if msg.get("op") != "read":
                return
            s = self.by_key.get(str(msg.get("key")))
            if s is None or (not s.held and "read-after-free" not in self.bugs):
                self.log("read_refused", key=msg.get("key"), reader=msg.get("reader"), why="kv_gone")
                await transfer.send(writer, {"ok": False, "error": "kv_gone"})
                return
            if msg.get("blocks") != s.blocks:
                self.log("read_refused", rid=s.rid, reader=msg.get("reader"), why="wrong_blocks")
                await transfer.send(writer, {"ok": False, "error": "wrong_blocks"})
                return
            reader_id = msg.get("reader")
            s.readers += 1
            reading = True
            self.log("read_start", rid=s.rid, key=s.key, reader=msg.get("reader"),
                     blocks=s.blocks, gens=[[self.pool.gen[b] for b in g] for g in s.blocks])
            data = [[self.pool.data[b] for b in g] for g in s.blocks]
            await transfer.send(writer, {"ok": True, "gens": s.gens, "data": data, "n_tokens": s.n_tokens})
            s.readers -= 1
            reading = False
            self.log("read_end", rid=s.rid, reader=msg.get("reader"))
            if s.pending:
                self.free(s, s.pending)
            done = await asyncio.wait_for(transfer.recv(reader), 5)
            if done.get("op") == "done":
                if s.held or "double-free" in self.bugs:
                    self.free(s, "read")
                await transfer.send(writer, {"ok": True})
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            if reading and s is not None:
                s.readers -= 1
                self.log("read_end", rid=s.rid, reader=reader_id, aborted=True)
                if s.pending:
                    self.free(s, s.pending)
            writer.close()

    # --- requests -------------------------------------------------------------

    async def answer_error(self, req: dict[str, Any], code: str, message: str) -> None:
        """An error the engine answers itself (before any KV was allocated)."""
        await self.nc.publish(req["reply_to"], msgpack.packb(
            {"request_id": req["request_id"], "kind": "error", "error": {"code": code, "message": message}}))
        self.log("answer", rid=req["request_id"], kind="error", code=code)

    async def mint(self, rid: str) -> int | None:
        """disagg_request_id from the ID service, before the context phase.
        A fenced worker answers identity_unavailable; retried for a short
        budget, then the request fails (the etcd fault makes this happen)."""
        deadline = time.monotonic() + self.args.mint_budget_s
        while True:
            try:
                # A short wait per try: a request that went to a worker being
                # killed gets no answer.
                params = await trtllm.context_params(self.client, timeout=0.5)
                return int(params["disagg_request_id"])
            except Exception as e:  # noqa: BLE001 -- IdentityUnavailable, RateLimited, timeouts, a reconnect
                if time.monotonic() >= deadline:
                    self.log("mint_failed", rid=rid, error=type(e).__name__)
                    return None
                await asyncio.sleep(0.1)

    async def handle(self, req: dict[str, Any]) -> None:
        rid = req["request_id"]
        self.log("request", rid=rid)
        trt = self.args.flow == "trtllm"
        disagg_id = None
        if trt:
            disagg_id = await self.mint(rid)
            if disagg_id is None:
                await self.answer_error(req, "identity_unavailable", "no request ID could be minted for the context phase")
                return
            self.log("mint", rid=rid, disagg_request_id=disagg_id)
        self.ctx_ids += 1
        ctx_id = self.ctx_ids
        self.log("context_start", rid=rid, disagg_request_id=disagg_id, ctx_request_id=ctx_id)
        prompt: list[int] = req["prompt"]
        got = await self.alloc(rid, len(prompt))
        if got is None:
            await self.answer_error(req, "kv_pool_full", "no free KV blocks")
            return
        groups, gens = got
        key = str(disagg_id) if trt else rid
        s = Session(rid=rid, key=key, blocks=groups, gens=gens, n_tokens=len(prompt))
        self.log("alloc", rid=rid, key=key, blocks=groups, gens=gens)
        kv = model.prefill(prompt)
        for g, grp in enumerate(groups):
            for b, entries in zip(grp, model.to_blocks(kv[g])):
                self.pool.write(b, entries)
        first = model.next_token(kv)
        # The context phase's compute time: the window in which a cancel or a
        # short deadline overtakes the result.
        await asyncio.sleep(self.args.compute_ms / 1000)
        finished = first in req.get("stop", [])
        request = {k: req[k] for k in ("prompt", "max_tokens", "stop")}
        if finished:
            self.free(s, "finished")
            frame = shapes.terminal_frame(self.args.flow, rid, first)
            await self.publish(req, [frame], request, None, s)
            return
        expires = int(now_ms()) + self.args.hold_ms
        self.by_key[key] = s
        self.by_rid[rid] = s
        loop = asyncio.get_running_loop()
        s.timer = loop.call_later(self.args.hold_ms / 1000, self.free, s, "hold")
        frame = shapes.handoff_frame(self.args.flow, rid=rid, engine_id=self.args.id, host="127.0.0.1",
                                     port=self.port, blocks=groups, first=first, ctx_request_id=ctx_id,
                                     disagg_request_id=disagg_id)
        if "read-after-free" in self.bugs:
            self.free(s, "hold")  # the advertised hold is not kept
        await self.publish(req, [frame], request, expires, s)

    async def publish(self, req: dict[str, Any], frames: list[dict[str, Any]], request: dict[str, Any],
                      expires: int | None, s: Session) -> None:
        rid = req["request_id"]
        durable = self.args.mode == "jetstream"
        t = now_ms()
        # Until the hold runs out: a nats-server restart fails publishes for
        # a moment. A result whose store ack was lost is stored once however
        # often it is retried (the client's Nats-Msg-Id, result-{rid}).
        limit = time.monotonic() + (self.args.hold_ms / 1000 if expires else 5)
        while True:
            try:
                await self.client.publish_result(
                    rid, frames, reply_to=req["reply_to"], request=request, deadline_ms=req.get("deadline_ms"),
                    kv_expires_ms=expires, durable=durable, timeout=1.0)
                break
            except Exception as e:  # noqa: BLE001
                if time.monotonic() >= limit:
                    self.log("publish_failed", rid=rid, error=f"{type(e).__name__}: {e}")
                    return
                await asyncio.sleep(0.1)
        self.log("published", rid=rid, t_publish=round(t, 3), kv_expires_ms=expires,
                 finish_reason=frames[0].get("finish_reason"))

    async def releases(self) -> None:
        """Every engine hears every notice and frees what names its own KV."""
        while True:
            notices = self.client.kv_releases()
            try:
                async for notice in notices:
                    s = self.by_rid.get(notice.request_id)
                    if s is None or not shapes.names_engine(notice.handoff, self.args.id):
                        continue
                    if "drop-release" in self.bugs:
                        continue
                    self.log("release", rid=s.rid, reason=notice.reason)
                    self.free(s, "release")
            except Exception as e:  # noqa: BLE001
                self.log("release_error", error=f"{type(e).__name__}: {e}")
                await notices.close()
                await asyncio.sleep(0.2)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        stop = common.stop_event()
        self.nc = await common.connect(self.args.nats, self.args.id)
        self.client = HandoffClient(self.nc, namespace=self.args.ns)
        server = await asyncio.start_server(self.serve_reads, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]

        async def on_request(msg: Any) -> None:
            self.spawn(self.handle(msgpack.unpackb(msg.data)))

        await self.nc.subscribe(common.prefill_subject(self.args.ns), queue="prefill", cb=on_request)
        self.spawn(self.releases())
        await self.nc.flush()
        self.log("ready", port=self.port)
        await stop.wait()
        held = [s.rid for s in self.by_key.values() if s.held]
        self.log("stopped", held_requests=held, free_blocks=self.pool.free_count, num_blocks=self.pool.num_blocks)
        server.close()
        await self.nc.close()


def main() -> None:
    p = common.parser("a prefill engine")
    p.add_argument("--hold-ms", type=int, default=4000, help="how long KV blocks are held for a decode engine")
    p.add_argument("--compute-ms", type=float, default=20, help="the context phase's compute time")
    p.add_argument("--pool-blocks", type=int, default=4096)
    p.add_argument("--mint-budget-s", type=float, default=2.0)
    asyncio.run(Engine(p.parse_args()).run())


if __name__ == "__main__":
    main()
