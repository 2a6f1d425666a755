"""The frontend: sends N requests at a steady rate and collects the answers.

    frontend.py --nats URL --ns NS --id frontend --events FILE --count N --rate R --seed S

A seeded mix of four kinds:
- normal: prefill, handoff, decode; the answer carries the tokens;
- finished: a stop token the model produces first, so the request finishes
  at prefill and the handoff worker answers it (terminal);
- cancel: cancelled on the handoff's cancel subject while prefill runs;
- deadline: a deadline shorter than the context phase.

Each request waits for one answer (or `--answer-timeout` seconds: the
client gives up, as an HTTP gateway would). A tap on the reply subjects
logs every reply that arrives, so a second answer is seen too.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgpack

import common
import model
from events import EventLog, now_ms
from prefill_handoff import HandoffClient

KINDS = [("normal", 70), ("finished", 10), ("cancel", 10), ("deadline", 10)]


def make_request(rng: random.Random, run: str, i: int) -> dict[str, Any]:
    kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    prompt = [rng.randrange(model.VOCAB) for _ in range(rng.randint(6, 40))]
    req: dict[str, Any] = {"request_id": f"{run}-{i}", "kind": kind, "prompt": prompt,
                           "max_tokens": rng.randint(2, 12), "stop": []}
    if kind == "finished":
        req["stop"] = [model.next_token(model.prefill(prompt))]
    return req


class Frontend:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.log = EventLog(args.events, args.id)
        self.rng = random.Random(args.seed)

    async def one(self, req: dict[str, Any]) -> None:
        rid = req["request_id"]
        kind = req.pop("kind")
        req["reply_to"] = self.client.reply_subject(rid)
        if kind == "deadline":
            req["deadline_ms"] = int(now_ms()) + 2
        self.log("sent", rid=rid, kind=kind, prompt=req["prompt"], max_tokens=req["max_tokens"],
                 stop=req["stop"], deadline_ms=req.get("deadline_ms"))
        await self.nc.publish(common.prefill_subject(self.args.ns), msgpack.packb(req))
        if kind == "cancel":
            await asyncio.sleep(self.rng.uniform(0, self.args.cancel_within_ms) / 1000)
            try:
                await self.client.cancel(rid, reason="client went away")
                self.log("cancel", rid=rid)
            except Exception as e:  # noqa: BLE001 -- NATS reconnecting: the request goes on uncancelled
                self.log("cancel_failed", rid=rid, error=f"{type(e).__name__}: {e}")
        try:
            reply = await self.client.await_reply(rid, timeout=self.args.answer_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            self.log("answer", rid=rid, outcome="timeout")
            return
        code = getattr(reply, "code", None)
        if code is not None:
            self.log("answer", rid=rid, outcome="error", code=code)
            return
        output = reply.output
        self.log("answer", rid=rid, outcome="tokens", tokens=output.get("token_ids"),
                 finish_reason=output.get("finish_reason"))

    async def run(self) -> None:
        self.nc = await common.connect(self.args.nats, self.args.id)
        self.client = HandoffClient(self.nc, namespace=self.args.ns)
        prefix = self.client.reply_subject("tap").rsplit(".", 1)[0]

        async def tap(msg: Any) -> None:
            try:
                body = msgpack.unpackb(msg.data)
                self.log("reply", rid=body.get("request_id"), kind=body.get("kind"),
                         code=(body.get("error") or {}).get("code"))
            except Exception:  # noqa: BLE001
                self.log("reply", subject=msg.subject, undecodable=True)

        await self.nc.subscribe(prefix + ".>", cb=tap)
        await self.nc.flush()
        self.log("start", count=self.args.count, rate=self.args.rate, seed=self.args.seed)
        tasks = []
        t0 = asyncio.get_running_loop().time()
        for i in range(self.args.count):
            req = make_request(self.rng, self.args.run, i)
            delay = t0 + i / self.args.rate - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.get_running_loop().create_task(self.one(req)))
        for rid, result in zip((f"{self.args.run}-{i}" for i in range(len(tasks))),
                               await asyncio.gather(*tasks, return_exceptions=True)):
            if isinstance(result, BaseException):
                self.log("frontend_error", rid=rid, error=f"{type(result).__name__}: {result}")
        await asyncio.sleep(0.5)  # late duplicates reach the tap
        self.log("done")
        await self.nc.close()


def main() -> None:
    p = common.parser("the frontend")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--run", default="r", help="request ID prefix")
    p.add_argument("--answer-timeout", type=float, default=20.0)
    p.add_argument("--cancel-within-ms", type=float, default=10.0)
    asyncio.run(Frontend(p.parse_args()).run())


if __name__ == "__main__":
    main()
