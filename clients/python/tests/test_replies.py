"""Answers to the prefill side: terminal and error replies, cancels, deadlines
and the KV release notices beside them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from harness import Worker, next_of, unique, until

from prefill_handoff import Encoding, HandoffClient, HandoffError, ReleaseNotice, Terminal, wire
from prefill_handoff.engines import sglang, trtllm

SGLANG_PARAMS = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 42}


def frame(finish_reason: str | None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"token_ids": [9906], "text": "Hello", "finish_reason": finish_reason}
    if params is not None:
        f["disaggregated_params"] = params
    return f


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_a_finished_prefill_comes_back_terminal(
    core_worker: Worker, encoding: Encoding
) -> None:
    request_id = unique("eos")
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        await client.publish_result(request_id, [frame("eos", SGLANG_PARAMS)], encoding=encoding)
        reply = await client.await_reply(request_id, timeout=20)
    assert isinstance(reply, Terminal)
    assert reply.request_id == request_id
    assert reply.finish_reason == "eos"
    assert reply.output == frame("eos")  # without disaggregated_params


async def test_an_error_comes_back_typed(core_worker: Worker) -> None:
    request_id = unique("noctx")
    params = {"request_type": "context_only", "opaque_state": b"x"}  # no ctx_request_id
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        await client.publish_result(request_id, [trtllm.frame(params, token_ids=[1])])
        reply = await client.await_reply(request_id, timeout=20)
    assert isinstance(reply, HandoffError)
    assert reply.code == "missing_ctx_request_id"
    assert reply.request_id == request_id
    assert not reply.retryable
    assert "ctx_request_id" in reply.message


async def test_a_reply_that_came_before_await_reply_is_kept(core_worker: Worker) -> None:
    first, second = unique("early"), unique("late")
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        await client.publish_result(first, [frame("stop")])
        await client.publish_result(second, [frame("length")])  # no params: an error
        # One worker answers in order: once the second answer is here, the
        # first one arrived before anyone awaited it.
        late = await client.await_reply(second, timeout=20)
        early = await client.await_reply(first, timeout=1)
    assert isinstance(late, HandoffError) and late.code == "no_disaggregated_params"
    assert isinstance(early, Terminal) and early.finish_reason == "stop"


async def test_await_reply_times_out_without_an_answer(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        with pytest.raises(TimeoutError):
            await client.await_reply(unique("never"), timeout=0.2)


async def test_cancel_before_the_result_gives_cancelled_and_a_release_notice(
    core_worker: Worker,
) -> None:
    request_id = unique("cancel")
    recorded = 'handoff_cancels_total{event="recorded"}'
    before = core_worker.metric(recorded)
    sent = sglang.bootstrap_frame("10.0.0.7", 8998, 4242)
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.kv_releases() as releases:
            await client.cancel(request_id, reason="client went away")
            # The cancel listener and the results are separate subscriptions
            # of the worker: the result goes once the worker holds the cancel.
            assert await until(lambda: core_worker.metric(recorded) > before)
            await client.publish_result(request_id, [sent])
            reply = await client.await_reply(request_id, timeout=20)
            notice = await next_of(releases)
    assert isinstance(reply, HandoffError)
    assert reply.code == "cancelled"
    assert isinstance(notice, ReleaseNotice)
    assert notice.request_id == request_id
    assert notice.reason == "cancelled"
    assert notice.backend == "sglang"
    assert notice.handoff == sent["disaggregated_params"]


async def test_an_expired_deadline_gives_deadline_exceeded(core_worker: Worker) -> None:
    request_id = unique("late")
    past = int(time.time() * 1000) - 5_000
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.kv_releases() as releases:
            await client.publish_result(request_id, [frame(None, SGLANG_PARAMS)], deadline_ms=past)
            reply = await client.await_reply(request_id, timeout=20)
            notice = await next_of(releases)
    assert isinstance(reply, HandoffError)
    assert reply.code == "deadline_exceeded"
    assert not reply.retryable
    assert (notice.request_id, notice.reason) == (request_id, "deadline_exceeded")


async def test_a_deadline_ahead_is_carried_by_the_job(core_worker: Worker) -> None:
    request_id = unique("intime")
    ahead = int(time.time() * 1000) + 600_000
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.decode_jobs() as jobs:
            await client.publish_result(request_id, [frame(None, SGLANG_PARAMS)], deadline_ms=ahead)
            job = await next_of(jobs)
    assert (job.request_id, job.deadline_ms) == (request_id, ahead)
    assert job.headers.get("Handoff-Deadline") == str(ahead)


async def test_request_ids_outside_the_contract_are_refused_before_sending(
    core_worker: Worker,
) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        for bad in ["", "x" * 257]:
            with pytest.raises(ValueError, match="request_id"):
                await client.publish_result(bad, [frame("eos")])
        # 256 bytes with dots and spaces: one reply subject token, answered.
        odd = ("a. b*>" * 43)[:256]
        await client.publish_result(odd, [frame("eos")])
        reply = await client.await_reply(odd, timeout=20)
    assert isinstance(reply, Terminal) and reply.request_id == odd


async def test_a_core_queue_group_shares_the_jobs(core_worker: Worker) -> None:
    ids = [unique(f"q{i}") for i in range(6)]
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        a = client.decode_jobs(queue="decoders")
        b = client.decode_jobs(queue="decoders")
        await a.start()
        await b.start()
        for i, request_id in enumerate(ids):
            await client.publish_result(request_id, [frame(None, {**SGLANG_PARAMS, "n": i})])
        seen: list[str] = []

        async def drain(stream: Any) -> None:
            async for job in stream:
                seen.append(job.request_id)

        tasks = [asyncio.ensure_future(drain(a)), asyncio.ensure_future(drain(b))]
        assert await until(lambda: len(seen) >= len(ids))
        await a.close()
        await b.close()
        for t in tasks:
            t.cancel()
    assert sorted(seen) == sorted(ids), "each job reached exactly one member"


async def test_closing_a_stream_ends_an_iteration_in_progress(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        jobs = client.decode_jobs(queue="closing")
        releases = client.kv_releases()
        await jobs.start()
        await releases.start()

        async def iterate(stream: Any) -> str:
            async for _ in stream:
                pass
            return "ended"

        waiting = [asyncio.ensure_future(iterate(jobs)), asyncio.ensure_future(iterate(releases))]
        await jobs.close()
        await client.close()  # closes the releases too
        assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == ["ended", "ended"]


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_a_decode_side_error_comes_back_typed(
    core_worker: Worker, encoding: Encoding
) -> None:
    request_id = unique("decode-error")
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.decode_jobs() as jobs:
            await client.publish_result(
                request_id,
                [frame(None, SGLANG_PARAMS)],
                encoding=encoding,
                headers={"traceparent": traceparent},
            )
            job = await next_of(jobs)
        tap = await client.nc.subscribe(job.reply_to)
        await client.answer_error(job, "kv_transfer_failed", "the prefill engine went away")
        seen = await tap.next_msg(timeout=20)
        reply = await client.await_reply(request_id, timeout=20)
    assert job.encoding == encoding
    assert isinstance(reply, HandoffError)
    assert (reply.code, reply.message) == ("kv_transfer_failed", "the prefill engine went away")
    assert reply.request_id == request_id
    assert reply.raw == {
        "request_id": request_id,
        "kind": "error",
        "error": {"code": "kv_transfer_failed", "message": "the prefill engine went away"},
    }
    assert seen.headers is not None and seen.headers.get("traceparent") == traceparent
    assert wire.encoding_of(seen.headers) == encoding
