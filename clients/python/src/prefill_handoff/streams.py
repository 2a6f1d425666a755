"""The subscriptions a client hands out: decode jobs and KV release notices.

Each is an async iterator that subscribes when first iterated or entered with
``async with``, and unsubscribes on :meth:`close` (or leaving the ``async
with``, or the client's close). An explicit end matters in a queue group: the
server goes on routing jobs to a subscription until it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from . import wire
from .messages import DecodeJob, ReleaseNotice

if TYPE_CHECKING:
    from .client import HandoffClient

T = TypeVar("T")


class _Interrupted(Exception):
    """A wait given up because the connection was replaced."""


# How long one pull waits for jobs before it asks again; it bounds how long a
# closed iterator's last pull lingers, not how long a job waits. A pull open
# when the connection drops is lost with it (a restarted server forgets it):
# the iterator pulls again as soon as the connection is back, without
# waiting this out.
_PULL_WAIT_S = 5.0


class _Subscription:
    def __init__(self, client: HandoffClient, subject: str, queue: str | None) -> None:
        self._client = client
        self._subject = subject
        self._queue = queue
        self._sub: Any = None
        self._closed = False
        # Set by close(): a waiting __anext__ ends at once instead of waiting
        # on a subscription that will never deliver again.
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Subscribes now, confirmed by the server, if not yet."""
        async with self._lock:
            if self._sub is not None:
                return
            if self._closed:
                raise RuntimeError(f"the subscription to {self._subject} is closed")
            self._sub = await self._subscribe()
            await self._client.nc.flush()

    async def _subscribe(self) -> Any:
        return await self._client.nc.subscribe(self._subject, queue=self._queue or "")

    async def _until_closed(self, wait: Awaitable[T], interrupt: asyncio.Event | None = None) -> T:
        """``wait``'s result; StopAsyncIteration once the subscription is
        closed; _Interrupted (``wait`` cancelled) when ``interrupt`` is set
        first."""
        got = asyncio.ensure_future(wait)
        closing = asyncio.ensure_future(self._closing.wait())
        others = {closing}
        if interrupt is not None:
            others.add(asyncio.ensure_future(interrupt.wait()))
        try:
            await asyncio.wait({got, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for other in others:
                other.cancel()
        if got.done():
            return got.result()
        got.cancel()
        with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
            await got
        if self._closing.is_set():
            raise StopAsyncIteration
        raise _Interrupted

    async def _next_msg(self) -> Msg:
        await self.start()
        return await self._until_closed(self._sub.next_msg(timeout=None))

    async def close(self) -> None:
        """Unsubscribes; iterating ends."""
        self._closed = True
        self._closing.set()
        self._client._forget(self)  # type: ignore[arg-type]
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class DecodeJobs(_Subscription):
    """Decode jobs from the GEN subject or its JetStream stream."""

    def __init__(
        self, client: HandoffClient, *, durable: str | None, queue: str | None, batch: int
    ) -> None:
        super().__init__(client, client.subjects.gen_jobs, queue)
        if batch < 1:
            raise ValueError(f"batch is {batch}; expected at least 1")
        self.durable = durable
        self._batch = batch
        self._fetched: list[Msg] = []

    async def _subscribe(self) -> Any:
        if self.durable is None:
            return await super()._subscribe()
        # Explicit acks; every job the stream holds, also those stored before
        # this consumer was made (a decode fleet that starts late still gets
        # the jobs waiting for it).
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
        )
        return await self._client.nc.jetstream().pull_subscribe(
            self._subject,
            durable=self.durable,
            stream=self._client.subjects.gen_stream,
            config=config,
        )

    async def __aenter__(self) -> DecodeJobs:
        await self.start()
        return self

    def __aiter__(self) -> DecodeJobs:
        return self

    async def __anext__(self) -> DecodeJob:
        if self._closed:
            raise StopAsyncIteration
        if self.durable is None:
            return _job(await self._next_msg(), jetstream=False)
        await self.start()
        while not self._fetched:
            if self._closed or self._sub is None:
                raise StopAsyncIteration
            try:
                fetch = self._sub.fetch(self._batch, timeout=_PULL_WAIT_S)
                # The event of the connection this pull goes out on: set when
                # it is replaced by a reconnect.
                reconnected = self._client._reconnected
                self._fetched = list(await self._until_closed(fetch, reconnected))
            except (nats.errors.TimeoutError, _Interrupted):
                continue
        return _job(self._fetched.pop(0), jetstream=True)


class KvReleases(_Subscription):
    """KV release notices from the release subject."""

    def __init__(self, client: HandoffClient, *, queue: str | None) -> None:
        super().__init__(client, client.subjects.kv_release, queue)

    async def __aenter__(self) -> KvReleases:
        await self.start()
        return self

    def __aiter__(self) -> KvReleases:
        return self

    async def __anext__(self) -> ReleaseNotice:
        if self._closed:
            raise StopAsyncIteration
        msg = await self._next_msg()
        return ReleaseNotice.from_message(wire.decode(msg.data, wire.encoding_of(msg.headers)))


def _job(msg: Msg, *, jetstream: bool) -> DecodeJob:
    encoding = wire.encoding_of(msg.headers)
    body = wire.decode(msg.data, encoding)
    return DecodeJob.from_message(
        body,
        msg.headers,
        encoding=encoding,
        delivery=msg.metadata.num_delivered if jetstream else 1,
        msg=msg if jetstream else None,
    )
