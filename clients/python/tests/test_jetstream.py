"""JetStream mode, on the second nats-server build (2.15): durable results,
decode jobs from a durable pull consumer on the GEN stream."""

from __future__ import annotations

import asyncio

import pytest
from harness import (
    Cluster,
    Etcd,
    Nats,
    Worker,
    jetstream_nats,
    next_of,
    nothing_more,
    unique,
    until,
)

from prefill_handoff import DecodeJob, HandoffClient, Terminal, streams, wire
from prefill_handoff.engines import sglang


async def consumer_settled(client: HandoffClient, durable: str) -> bool:
    """Nothing left for the consumer: every job delivered and acked."""
    info = await client.nc.jetstream().consumer_info(client.subjects.gen_stream, durable)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def publish(client: HandoffClient, request_id: str, room: int) -> None:
    frame = sglang.bootstrap_frame("10.0.0.7", 8998, room)
    await client.publish_result(request_id, [frame], durable=True)


async def test_a_durable_consumer_gets_the_job_and_acks_it(js_worker: Worker) -> None:
    request_id, durable = unique("js-ack"), unique("decoders-ack")
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        async with client.decode_jobs(durable=durable) as jobs:
            await publish(client, request_id, 1)
            job: DecodeJob = await next_of(jobs)
            assert (job.request_id, job.delivery) == (request_id, 1)
            assert job.msg_id == f"handoff-{request_id}"
            await job.ack()
            assert await until(lambda: consumer_settled(client, durable))


async def test_a_nak_redelivers_the_same_job(js_worker: Worker) -> None:
    request_id, durable = unique("js-nak"), unique("decoders-nak")
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        async with client.decode_jobs(durable=durable) as jobs:
            await publish(client, request_id, 2)
            first = await next_of(jobs)
            await first.nak()
            again = await next_of(jobs)
            assert again.request_id == request_id
            assert again.delivery == 2
            assert again.msg_id == first.msg_id == f"handoff-{request_id}"
            assert again.raw == first.raw
            await again.ack()
            assert await until(lambda: consumer_settled(client, durable))


async def test_a_second_consumer_of_the_same_durable_shares_the_work(js_worker: Worker) -> None:
    durable = unique("decoders-shared")
    ids = [unique("js-share-a"), unique("js-share-b")]
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        a = client.decode_jobs(durable=durable)
        b = client.decode_jobs(durable=durable)
        async with a, b:
            for room, request_id in enumerate(ids):
                await publish(client, request_id, 10 + room)
            # a holds its job unacked; b, pulling from the same consumer, gets
            # the other one (a consumer of its own would start with the first).
            held = await next_of(a)
            other = await next_of(b)
            assert {held.request_id, other.request_id} == set(ids)
            await held.ack()
            await other.ack()
            assert await until(lambda: consumer_settled(client, durable))
            assert await nothing_more(a) and await nothing_more(b)


async def test_a_cancel_stored_in_the_stream_reaches_a_durable_result(js_worker: Worker) -> None:
    request_id = unique("js-cancel")
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        async with client.kv_releases() as releases:
            recorded = 'handoff_cancels_total{event="recorded"}'
            before = js_worker.metric(recorded)
            await client.cancel(request_id, durable=True)
            assert await until(lambda: js_worker.metric(recorded) > before)
            await publish(client, request_id, 3)
            reply = await client.await_reply(request_id, timeout=20)
            notice = await next_of(releases)
    assert getattr(reply, "code", None) == "cancelled"
    assert notice.request_id == request_id


async def stored(client: HandoffClient) -> int:
    """The prefill stream's last sequence: how many results it ever stored."""
    info = await client.nc.jetstream().stream_info(client.subjects.prefill_stream)
    return int(info.state.last_seq)


async def test_a_durable_result_published_again_is_stored_once(js_worker: Worker) -> None:
    """A retry after a lost store ack: the same request's result, published
    twice, is one message of the prefill stream (Nats-Msg-Id
    result-{request_id}), answered once."""
    request_id = unique("js-retry")
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        before = await stored(client)
        for _ in range(2):
            await client.publish_result(
                request_id, [{"token_ids": [2], "finish_reason": "stop"}], durable=True
            )
        assert await stored(client) == before + 1
        reply = await client.await_reply(request_id, timeout=20)
        assert isinstance(reply, Terminal) and reply.finish_reason == "stop"


async def test_a_durable_result_keeps_the_callers_msg_id(js_worker: Worker) -> None:
    request_id = unique("js-own-id")
    frames = [{"token_ids": [2], "finish_reason": "stop"}]
    async with await HandoffClient.connect(js_worker.nats.url, js_worker.namespace) as client:
        before = await stored(client)
        for _ in range(2):
            await client.publish_result(
                request_id, frames, headers={"Nats-Msg-Id": f"mine-{request_id}"}, durable=True
            )
        # Its own ID, not result-{request_id}: the default one is new.
        await client.publish_result(request_id, frames, durable=True)
        assert await stored(client) == before + 2


async def test_a_durable_publish_without_a_store_ack_times_out(js_nats_server: Nats) -> None:
    # A subscriber on the results subject and no stream: nothing acks.
    async with await HandoffClient.connect(js_nats_server.url, unique("nostream")) as client:
        silent = await client.nc.subscribe(client.subjects.prefill_results)
        await client.nc.flush()
        try:
            with pytest.raises(TimeoutError, match="store ack"):
                await client.publish_result(
                    unique("js-noack"), [{"finish_reason": "stop"}], durable=True, timeout=0.2
                )
        finally:
            await silent.unsubscribe()


async def test_a_durable_consumer_pulls_again_at_once_after_a_server_restart(
    cluster: Cluster, etcd: Etcd
) -> None:
    """The pull open when nats-server restarts is gone with it; the iterator
    pulls again as soon as the connection is back, instead of waiting out that
    pull's expiry while the job's KV hold runs out. The pull's expiry is made
    a minute here, so a client that waits it out misses the 30 s the test
    gives the job (no timing is measured)."""
    server = cluster.nats(jetstream_nats())
    namespace, durable = unique("restart"), unique("decoders-restart")
    Worker(server, etcd, namespace, "jetstream", cluster.dir).setup()
    client = await HandoffClient.connect(
        server.url, namespace, max_reconnect_attempts=-1, reconnect_time_wait=0.05
    )
    pull_wait = streams._PULL_WAIT_S
    streams._PULL_WAIT_S = 60.0
    try:
        async with client:
            async with client.decode_jobs(durable=durable) as jobs:
                waiting = asyncio.ensure_future(jobs.__anext__())
                await asyncio.sleep(0.5)  # the pull is out
                assert not waiting.done()
                await asyncio.to_thread(server.restart)
                assert await until(
                    lambda: client.nc.is_connected and client.nc.stats["reconnects"] > 0
                )
                job = {
                    "request_id": unique("js-after"),
                    "reply_to": "_INBOX.x",
                    "backend": "sglang",
                }
                body = wire.encode(job, "msgpack")
                await client.nc.jetstream().publish(client.subjects.gen_jobs, body)
                got = await asyncio.wait_for(waiting, 30)
                assert got.request_id == job["request_id"]
                await got.ack()
    finally:
        streams._PULL_WAIT_S = pull_wait
