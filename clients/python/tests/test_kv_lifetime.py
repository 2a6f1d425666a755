"""The handoff as the engines live it (contract section 11): the TensorRT-LLM
ID minted before the context phase, the KV's own lifetime, and a release
notice for every refusal of a readable handoff."""

from __future__ import annotations

import time

from harness import Worker, next_of, unique

from prefill_handoff import HandoffClient, HandoffError
from prefill_handoff.engines import sglang, trtllm


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_trtllm_result_without_its_id_is_refused_and_its_kv_released(
    core_worker: Worker,
) -> None:
    request_id = unique("noid")
    # The context phase ran without an ID from the ID service.
    params = {"request_type": "context_only", "ctx_request_id": 3, "opaque_state": b"\x00"}
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.kv_releases() as releases:
            await client.publish_result(request_id, [trtllm.frame(params, token_ids=[1])])
            reply = await client.await_reply(request_id, timeout=20)
            notice = await next_of(releases)
    assert isinstance(reply, HandoffError)
    assert reply.code == "missing_disagg_request_id"
    assert not reply.retryable
    assert (notice.request_id, notice.reason, notice.backend) == (
        request_id,
        "missing_disagg_request_id",
        "trtllm",
    )
    assert notice.handoff == params


async def test_expired_kv_is_refused_retryable_and_released(core_worker: Worker) -> None:
    request_id = unique("kvgone")
    sent = sglang.bootstrap_frame("10.0.0.7", 8998, 77)
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.kv_releases() as releases:
            await client.publish_result(request_id, [sent], kv_expires_ms=now_ms() - 1_000)
            reply = await client.await_reply(request_id, timeout=20)
            notice = await next_of(releases)
    assert isinstance(reply, HandoffError)
    assert reply.code == "kv_expired"
    assert reply.retryable
    assert (notice.request_id, notice.reason) == (request_id, "kv_expired")
    assert notice.handoff == sent["disaggregated_params"]


async def test_a_job_carries_its_kv_expiry(core_worker: Worker) -> None:
    request_id = unique("kvheld")
    expires = now_ms() + 600_000
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        async with client.decode_jobs() as jobs:
            sent = sglang.bootstrap_frame("10.0.0.7", 8998, 78)
            await client.publish_result(request_id, [sent], kv_expires_ms=expires)
            job = await next_of(jobs)
    assert (job.request_id, job.kv_expires_ms) == (request_id, expires)


async def test_an_invalid_kv_expiry_is_refused(core_worker: Worker) -> None:
    request_id = unique("kvbad")
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        sent = sglang.bootstrap_frame("10.0.0.7", 8998, 79)
        await client.publish_result(request_id, [sent], kv_expires_ms=-5)
        reply = await client.await_reply(request_id, timeout=20)
    assert isinstance(reply, HandoffError)
    assert reply.code == "invalid_kv_expires"
