"""The ID service through mint_ids: IDs, and its refusals as exceptions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from harness import Cluster, Etcd, Nats, Worker, unique, until

from prefill_handoff import HandoffClient, IdentityUnavailable, RateLimited
from prefill_handoff.engines import trtllm

# rc22 IDs lie in [2^40, 2^63 - 1) (docs/protocol.md, "Request IDs").
LOWEST, HIGHEST = 1 << 40, (1 << 63) - 1


async def test_mint_ids_returns_distinct_ids_in_the_layout(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        ids = await client.mint_ids(count=64)
        more = await client.mint_ids()
    assert len(ids) == 64 and len(more) == 1
    assert len(set(ids + more)) == 65
    assert all(LOWEST <= i < HIGHEST for i in ids + more)


async def test_mint_ids_refuses_counts_outside_the_contract(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        for bad in [0, 1025, -1]:
            with pytest.raises(ValueError, match="count"):
                await client.mint_ids(bad)


async def test_no_worker_on_the_namespace_is_identity_unavailable(nats_server: Nats) -> None:
    async with await HandoffClient.connect(nats_server.url, "nobody") as client:
        with pytest.raises(IdentityUnavailable) as refused:
            await client.mint_ids()
    assert refused.value.retryable
    assert "nobody.handoff.ids" in refused.value.message


@pytest.fixture(scope="module")
def limited_worker(cluster: Cluster, nats_server: Nats, etcd: Etcd) -> Worker:
    # One ID per second, one per request: the second request in a row is over
    # the budget.
    return cluster.worker(
        nats_server,
        etcd,
        "limited",
        "core",
        "id_service.ids_per_sec=1",
        "id_service.max_count=1",
    )


async def test_a_spent_budget_raises_rate_limited_with_the_wait(limited_worker: Worker) -> None:
    async with await HandoffClient.connect(limited_worker.nats.url, "limited") as client:
        with pytest.raises(RateLimited) as refused:
            for _ in range(3):
                await client.mint_ids()
    limited = refused.value
    assert limited.code == "rate_limited"
    assert limited.retry_after_s is not None
    # At one ID a second, the next one is at most a second away.
    assert 0 < limited.retry_after_s <= 1.0
    assert limited.retryable


async def test_more_than_max_count_raises_rate_limited_without_a_wait(
    limited_worker: Worker,
) -> None:
    async with await HandoffClient.connect(limited_worker.nats.url, "limited") as client:
        with pytest.raises(RateLimited) as refused:
            await client.mint_ids(2)
    assert refused.value.retry_after_s is None
    assert not refused.value.retryable
    assert "max_count" in refused.value.message


async def test_a_fenced_worker_raises_identity_unavailable(
    cluster: Cluster, nats_server: Nats
) -> None:
    own_etcd = cluster.etcd()
    worker = cluster.worker(nats_server, own_etcd, "fenced")
    async with await HandoffClient.connect(nats_server.url, "fenced") as client:
        assert len(await client.mint_ids()) == 1
        # etcd gone: once the slot's reservation is used up, the worker fences.
        assert own_etcd.proc is not None
        own_etcd.proc.kill()
        own_etcd.proc.wait()
        assert await until(lambda: worker.metric("handoff_fenced") == 1.0, timeout=60)
        with pytest.raises(IdentityUnavailable) as refused:
            await client.mint_ids()
    assert refused.value.code == "identity_unavailable"
    assert refused.value.retryable


@asynccontextmanager
async def silent_id_service(nats_server: Nats) -> AsyncIterator[HandoffClient]:
    """A client of a namespace whose ID service subject has a subscriber that
    never answers (a worker killed or stuck after it subscribed)."""
    namespace = unique("silent")
    async with await HandoffClient.connect(nats_server.url, namespace) as client:
        silent = await client.nc.subscribe(client.subjects.ids)
        await client.nc.flush()
        try:
            yield client
        finally:
            await silent.unsubscribe()  # what it holds would keep close()'s drain waiting


async def test_mint_ids_gives_up_after_one_second_by_default(nats_server: Nats) -> None:
    async with silent_id_service(nats_server) as client:
        with pytest.raises(IdentityUnavailable, match=r"within 1\.0 s"):
            await client.mint_ids()


async def test_mint_ids_and_context_params_take_a_timeout(nats_server: Nats) -> None:
    async with silent_id_service(nats_server) as client:
        mints: list[Callable[[], Awaitable[object]]] = [
            lambda: client.mint_ids(timeout=0.2),
            lambda: trtllm.context_params(client, timeout=0.2),
        ]
        for mint in mints:
            with pytest.raises(IdentityUnavailable, match=r"within 0\.2 s") as refused:
                await mint()
            assert refused.value.retryable


async def test_context_params_mints_within_its_timeout(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        params = await trtllm.context_params(client, timeout=5.0, ctx_dp_rank=0)
    assert set(params) == {"request_type", "disagg_request_id", "ctx_dp_rank"}
    assert LOWEST <= params["disagg_request_id"] < HIGHEST
