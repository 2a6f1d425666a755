"""A decode engine: takes decode jobs, reads the KV blocks, generates, answers.

    decode.py --nats URL --ns NS --id decode-1 --events FILE --flow vllm|trtllm --mode core|jetstream

Jobs come from the GEN subject: a queue group in core mode, the shared
durable pull consumer in JetStream mode (acked once the client has its
answer). An engine runs `--slots` sequences at once and takes the next job
when a slot is free (in core mode the jobs routed to it wait in its
subscription meanwhile); each generated token takes `--step-ms`. For each job: refuse KV that expired before it could be read
(answer `kv_expired`), read the blocks the handoff names from the prefill
engine, confirm the read (the prefill engine frees them), continue the
model from the KV and the prefill's first token, answer the client on
`reply_to`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import blocks as transfer
import common
import model
import shapes
from events import EventLog, now_ms
from prefill_handoff import HandoffClient

# A read that starts this close to the KV's expiry may meet freed blocks.
EXPIRY_MARGIN_MS = 100


class Engine:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.log = EventLog(args.events, args.id)
        self.bugs = set(args.bug.split(",")) if args.bug else set()
        self.slots = asyncio.Semaphore(args.slots)
        self.tasks: set[asyncio.Task[None]] = set()

    async def answer(self, job: Any, output: dict[str, Any]) -> None:
        """The tokens, in the worker's terminal shape (HandoffClient.answer)."""
        for _ in range(2 if "answer-twice" in self.bugs else 1):
            await self.client.answer(job, output)
        self.log("answer", rid=job.request_id, kind="terminal", tokens=output["token_ids"])

    async def error(self, job: Any, code: str, message: str) -> None:
        """A typed error, in the shape of the worker's error responses
        (HandoffClient.answer_error)."""
        await self.client.answer_error(job, code, message)
        self.log("answer", rid=job.request_id, kind="error", code=code)

    async def handle(self, job: Any) -> None:
        try:
            await self.decode(job)
        finally:
            self.slots.release()
        try:
            await job.ack()
        except Exception as e:  # noqa: BLE001 -- a reconnect: the job is redelivered
            self.log("ack_failed", rid=job.request_id, error=type(e).__name__)

    async def decode(self, job: Any) -> None:
        self.log("job", rid=job.request_id, backend=job.backend, kv_expires_ms=job.kv_expires_ms,
                 disagg_request_id=job.disagg_request_id)
        try:
            where = shapes.locate(job)
            req = job.request
            first = int(job.prefill_output["token_ids"][0])
        except Exception as e:  # noqa: BLE001
            await self.error(job, "bad_handoff", f"{type(e).__name__}: {e}")
            return
        if job.kv_expires_ms is not None and now_ms() > job.kv_expires_ms - EXPIRY_MARGIN_MS:
            await self.error(job, "kv_expired", "the prefill engine's KV hold ran out before the read")
            return
        try:
            answer, confirm = await transfer.read_blocks(where.host, where.port, where.key, where.blocks,
                                                         self.args.id)
        except transfer.TransferFailed as e:
            self.log("read_failed", rid=job.request_id, engine=where.engine_id, code=e.code)
            await self.error(job, e.code, "the KV transfer from the prefill engine failed")
            return
        self.log("read", rid=job.request_id, engine=where.engine_id, blocks=where.blocks, gens=answer["gens"])
        await confirm()
        n = int(answer["n_tokens"])
        kv = [[e for block in group for e in block][:n] for group in answer["data"]]
        tokens, finish = model.decode(kv, first, int(req["max_tokens"]), list(req["stop"]))
        # The decode steps' time: a job holds its slot while it generates.
        await asyncio.sleep(self.args.step_ms * (len(tokens) - 1) / 1000)
        await self.answer(job, {"token_ids": tokens, "text": "", "finish_reason": finish, "engine": self.args.id})

    async def run(self) -> None:
        stop = common.stop_event()

        async def reconnected() -> None:
            # The client pulls again by itself once the connection is back.
            self.log("reconnected")

        self.nc = await common.connect(self.args.nats, self.args.id, reconnected)
        client = self.client = HandoffClient(self.nc, namespace=self.args.ns)

        async def consume() -> None:
            # A fresh iterator after an error (the client raises what nats-py
            # raises).
            while True:
                if self.args.mode == "jetstream":
                    jobs = client.decode_jobs(durable=self.args.durable)
                else:
                    jobs = client.decode_jobs(queue=self.args.queue)
                try:
                    async for job in jobs:
                        await self.slots.acquire()
                        task = asyncio.get_running_loop().create_task(self.handle(job))
                        self.tasks.add(task)
                        task.add_done_callback(self.tasks.discard)
                except Exception as e:  # noqa: BLE001
                    self.log("consumer_error", error=f"{type(e).__name__}: {e}")
                    await jobs.close()
                    await asyncio.sleep(0.2)

        consumer = asyncio.get_running_loop().create_task(consume())
        await asyncio.sleep(0.3)  # decode_jobs subscribes when first iterated
        await self.nc.flush()
        self.log("ready")
        await asyncio.wait([consumer, asyncio.get_running_loop().create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if consumer.done() and consumer.exception():
            self.log("consumer_failed", error=repr(consumer.exception()))
        self.log("stopped")
        await self.nc.close()


def main() -> None:
    p = common.parser("a decode engine")
    p.add_argument("--durable", default="decode", help="JetStream consumer on the GEN stream")
    p.add_argument("--queue", default="decode", help="queue group on the GEN subject (core mode)")
    p.add_argument("--slots", type=int, default=8, help="sequences decoded at once")
    p.add_argument("--step-ms", type=float, default=4, help="time per generated token")
    asyncio.run(Engine(p.parse_args()).run())


if __name__ == "__main__":
    main()
