"""The client: one NATS connection, the worker's subjects, typed messages.

The prefill side mints IDs (:meth:`HandoffClient.mint_ids`), publishes results
(:meth:`HandoffClient.publish_result`) and reads the answers
(:meth:`HandoffClient.await_reply`); the decode side reads
:meth:`HandoffClient.decode_jobs`; whoever holds prefill KV reads
:meth:`HandoffClient.kv_releases`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from . import wire
from .errors import HandoffError, IdentityUnavailable, ProtocolError, from_response
from .messages import DecodeJob, Terminal
from .streams import DecodeJobs, KvReleases
from .subjects import Subjects
from .wire import Encoding

# The contract's bounds (docs/protocol.md): a request ID is 1 to 256 bytes,
# an ID request asks for 1 to 1024 IDs.
MAX_REQUEST_ID_BYTES = 256
MAX_ID_COUNT = 1024

# How long minting waits for the ID service by default: an engine mints on
# its request path, before the context phase, so a worker that does not
# answer (killed, partitioned) costs one second, and the caller retries or
# fails the request.
MINT_TIMEOUT_S = 1.0
# How long a durable publish waits for the stream's store ack by default
# (nats-py's JetStream default).
PUBLISH_TIMEOUT_S = 5.0

# JetStream's deduplication header.
MSG_ID_HEADER = "Nats-Msg-Id"

Frame = Mapping[str, Any]
Reply = Terminal | HandoffError


class HandoffClient:
    """A client of the prefill-handoff workers of one namespace.

    Make one with :meth:`connect`, or around a connection you hold with
    ``HandoffClient(nc, namespace=...)`` (then :meth:`close` leaves the
    connection open). Every answer to :meth:`reply_subject` is kept from the
    moment the client has subscribed its inbox (:meth:`start`, done by
    :meth:`connect` and by the first publish) until :meth:`await_reply` takes
    it, at most ``max_kept_replies`` request IDs' worth (the oldest unclaimed
    are dropped beyond, and counted in :attr:`dropped_replies`).

    The client chains itself into the connection's reconnected callback (the
    one given to ``nats.connect`` still runs), so that a durable
    :meth:`decode_jobs` pulls again as soon as the connection is back;
    :meth:`close` puts the connection's own callback back.
    """

    def __init__(
        self,
        nc: NATS,
        namespace: str = "llm",
        *,
        subjects: Subjects | None = None,
        max_kept_replies: int = 10_000,
    ) -> None:
        self.nc = nc
        self.namespace = namespace
        self.subjects = subjects or Subjects.for_namespace(namespace)
        self.max_kept_replies = max_kept_replies
        self.dropped_replies = 0
        # Under `_INBOX.`, which the workers' default allowlist
        # (allowed_reply_subjects) accepts.
        self._inbox = nc.new_inbox()
        self._inbox_sub: Any = None
        self._owns_connection = False
        self._replies: OrderedDict[str, deque[Msg]] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._streams: list[DecodeJobs | KvReleases] = []
        self._start_lock = asyncio.Lock()
        # Set, and replaced by a fresh one, at each reconnect: a waiting pull
        # holds the event of the connection it was sent on.
        self._reconnected = asyncio.Event()
        self._previous_reconnected_cb = nc._reconnected_cb
        nc._reconnected_cb = self._on_reconnected

    @classmethod
    async def connect(
        cls,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        namespace: str = "llm",
        *,
        subjects: Subjects | None = None,
        **options: Any,
    ) -> HandoffClient:
        """Connects to NATS (``options`` go to ``nats.connect``) and subscribes
        the client's reply inbox."""
        nc = await nats.connect(servers, **options)
        client = cls(nc, namespace, subjects=subjects)
        client._owns_connection = True
        try:
            await client.start()
        except BaseException:
            await nc.close()
            raise
        return client

    async def __aenter__(self) -> HandoffClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_reconnected(self) -> None:
        reconnected, self._reconnected = self._reconnected, asyncio.Event()
        reconnected.set()
        if self._previous_reconnected_cb is not None:
            await self._previous_reconnected_cb()

    # --- replies ------------------------------------------------------------

    async def start(self) -> None:
        """Subscribes the reply inbox, confirmed by the server, if not yet."""
        async with self._start_lock:
            if self._inbox_sub is not None:
                return
            self._inbox_sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
            await self.nc.flush()

    def reply_subject(self, request_id: str) -> str:
        """The subject this client reads ``request_id``'s answers from."""
        _check_request_id(request_id)
        # One subject token per request ID, whatever characters it holds
        # (dots, spaces and `*` are not allowed in a token): URL-safe base64,
        # which keeps a 256-byte ID within the workers' 512-byte subject limit.
        token = base64.urlsafe_b64encode(request_id.encode()).rstrip(b"=").decode()
        return f"{self._inbox}.{token}"

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject.rsplit(".", 1)[-1]
        try:
            request_id = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        except ValueError:
            return  # not a subject reply_subject() handed out
        queue = self._replies.get(request_id)
        if queue is None:
            queue = self._replies[request_id] = deque()
            self._evict()
        queue.append(msg)
        for waiter in self._waiters.pop(request_id, []):
            if not waiter.done():
                waiter.set_result(None)

    def _evict(self) -> None:
        # The newest entry is the one just added; a waiter takes its answer
        # at once, so only answers nobody asked for grow old here.
        while len(self._replies) > self.max_kept_replies:
            _, dropped = self._replies.popitem(last=False)
            self.dropped_replies += len(dropped)

    async def await_reply(self, request_id: str, timeout: float | None = 30.0) -> Reply:
        """The next answer on ``request_id``'s reply subject: a :class:`Terminal`,
        or the :class:`HandoffError` the worker answered with (returned, not
        raised). Raises ``TimeoutError`` when none came within ``timeout``
        seconds (``None``: wait for ever)."""
        _check_request_id(request_id)
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            queue = self._replies.get(request_id)
            if queue:
                msg = queue.popleft()
                if not queue:
                    del self._replies[request_id]
                return _reply(msg)
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(request_id, []).append(waiter)
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(waiter, left)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"no answer for request {request_id!r} within {timeout} s "
                    f"on {self.reply_subject(request_id)}"
                ) from None
            finally:
                waiters = self._waiters.get(request_id, [])
                if waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        del self._waiters[request_id]

    # --- the prefill side ------------------------------------------------------

    async def mint_ids(self, count: int = 1, *, timeout: float = MINT_TIMEOUT_S) -> list[int]:
        """``count`` request IDs (1 to 1024) from the workers' ID service, for
        TensorRT-LLM's ``disagg_request_id``: mint before the context phase.

        Waits ``timeout`` seconds for the answer (1 s by default: an engine's
        request path waits on it). Raises :class:`IdentityUnavailable` when
        no worker holds a machine-ID slot or none answers in time,
        :class:`RateLimited` beyond the service's budget,
        :class:`HandoffError` for any other refusal."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ID_COUNT:
            raise ValueError(f"count is {count!r}; expected an integer in 1..={MAX_ID_COUNT}")
        body = wire.encode({"count": count}, "msgpack")
        try:
            msg = await self.nc.request(self.subjects.ids, body, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise IdentityUnavailable(
                "identity_unavailable",
                f"no prefill-handoff worker listens on {self.subjects.ids}",
            ) from None
        except nats.errors.TimeoutError:
            raise IdentityUnavailable(
                "identity_unavailable",
                f"no answer on {self.subjects.ids} within {timeout} s",
            ) from None
        answer = wire.decode(msg.data, wire.encoding_of(msg.headers))
        if not isinstance(answer, dict):
            raise ProtocolError(f"the ID service answered {answer!r:.200}")
        if answer.get("kind") == "error":
            raise from_response(answer)
        ids = answer.get("ids")
        if (
            not isinstance(ids, list)
            or len(ids) != count
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise ProtocolError(f"the ID service answered {answer!r:.200} for {count} IDs")
        return ids

    async def publish_result(
        self,
        request_id: str,
        frames: Iterable[Frame],
        *,
        reply_to: str | None = None,
        request: Mapping[str, Any] | None = None,
        deadline_ms: int | None = None,
        kv_expires_ms: int | None = None,
        headers: Mapping[str, str] | None = None,
        encoding: Encoding = "msgpack",
        durable: bool = False,
        timeout: float = PUBLISH_TIMEOUT_S,
    ) -> None:
        """Publishes a prefill result for the workers to decide.

        ``reply_to`` defaults to :meth:`reply_subject`, so that
        :meth:`await_reply` gets the answer. ``deadline_ms`` and
        ``kv_expires_ms`` are Unix epoch milliseconds. ``headers`` are sent as
        given (``traceparent`` and ``tracestate`` reach the decode job).

        ``durable`` publishes through JetStream and returns once the prefill
        stream stored the result (workers in ``mode = "jetstream"``), or
        raises ``TimeoutError`` when the store ack did not come within
        ``timeout`` seconds. The message carries ``Nats-Msg-Id:
        result-{request_id}`` unless ``headers`` has one, so publishing the
        same result again after a lost ack stores it once (within the
        stream's duplicate window)."""
        _check_request_id(request_id)
        await self.start()
        body: dict[str, Any] = {
            "request_id": request_id,
            "reply_to": reply_to if reply_to is not None else self.reply_subject(request_id),
            "frames": [dict(f) for f in frames],
        }
        if request is not None:
            body["request"] = dict(request)
        if deadline_ms is not None:
            body["deadline_ms"] = deadline_ms
        if kv_expires_ms is not None:
            body["kv_expires_ms"] = kv_expires_ms
        sent_headers = wire.headers_for(encoding, headers)
        if durable and not any(k.lower() == MSG_ID_HEADER.lower() for k in sent_headers):
            sent_headers[MSG_ID_HEADER] = f"result-{request_id}"
        await self._publish(
            self.subjects.prefill_results,
            wire.encode(body, encoding),
            sent_headers,
            durable,
            timeout,
        )

    async def cancel(
        self, request_id: str, reason: str | None = None, *, durable: bool = False
    ) -> None:
        """Tells every worker that ``request_id`` is cancelled: a result of it
        that would go to decode is answered ``cancelled`` instead, with a KV
        release notice. Returns once the server has the cancel (``durable``:
        once the workers' cancel stream stored it, for workers that start
        later)."""
        _check_request_id(request_id)
        body: dict[str, Any] = {"request_id": request_id}
        if reason is not None:
            body["reason"] = reason
        await self._publish(self.subjects.cancel, wire.encode(body, "msgpack"), {}, durable)
        if not durable:
            await self.nc.flush()

    async def _publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        durable: bool,
        timeout: float | None = None,
    ) -> None:
        if not durable:
            await self.nc.publish(subject, payload, headers=headers or None)
            return
        try:
            await self.nc.jetstream().publish(
                subject, payload, timeout=timeout, headers=headers or None
            )
        except nats.errors.TimeoutError:
            raise TimeoutError(
                f"no store ack for the message on {subject} within {timeout} s"
            ) from None

    # --- the decode side and the KV holders -------------------------------------

    async def answer(self, job: DecodeJob, output: Mapping[str, Any]) -> None:
        """The decode side's final answer to the client, on the job's
        ``reply_to``, in the shape and encoding of the worker's own terminal
        answers: :meth:`await_reply` returns it as a :class:`Terminal`."""
        body = {"request_id": job.request_id, "kind": "terminal", "output": dict(output)}
        await self._answer_job(job, body)

    async def answer_error(self, job: DecodeJob, code: str, message: str) -> None:
        """The decode side's refusal of a job (its KV transfer failed, the KV
        was gone, ...), on the job's ``reply_to``, in the shape and encoding
        of the worker's own error answers, ``{"request_id", "kind": "error",
        "error": {"code", "message"}}``: :meth:`await_reply` returns it as a
        :class:`HandoffError` with this ``code`` and ``message``."""
        if not isinstance(code, str) or not code:
            raise ValueError(f"code is {code!r}; expected a non-empty string")
        body = {
            "request_id": job.request_id,
            "kind": "error",
            "error": {"code": code, "message": message},
        }
        await self._answer_job(job, body)

    async def _answer_job(self, job: DecodeJob, body: dict[str, Any]) -> None:
        trace = {k: v for k, v in job.headers.items() if k in ("traceparent", "tracestate")}
        await self.nc.publish(
            job.reply_to,
            wire.encode(body, job.encoding),
            headers=wire.headers_for(job.encoding, trace) or None,
        )

    def decode_jobs(
        self, durable: str | None = None, queue: str | None = None, *, batch: int = 1
    ) -> DecodeJobs:
        """The decode jobs, as an async iterator that subscribes when first
        iterated (or entered with ``async with``).

        Without ``durable``: a core subscription to the GEN subject, in the
        queue group ``queue`` when given (each job to one member). With
        ``durable``: the JetStream pull consumer of that name on the GEN
        stream (created when missing), shared by every iterator naming it;
        ``batch`` jobs are fetched per pull."""
        stream = DecodeJobs(self, durable=durable, queue=queue, batch=batch)
        self._streams.append(stream)
        return stream

    def kv_releases(self, queue: str | None = None) -> KvReleases:
        """The KV release notices, as an async iterator that subscribes when
        first iterated (or entered with ``async with``)."""
        stream = KvReleases(self, queue=queue)
        self._streams.append(stream)
        return stream

    def _forget(self, stream: DecodeJobs | KvReleases) -> None:
        with contextlib.suppress(ValueError):
            self._streams.remove(stream)

    async def close(self) -> None:
        """Ends the client's subscriptions; closes the connection when
        :meth:`connect` opened it (after flushing what was published)."""
        for stream in list(self._streams):
            await stream.close()
        if self._inbox_sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._inbox_sub.unsubscribe()
            self._inbox_sub = None
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
        self._waiters.clear()
        if self.nc._reconnected_cb == self._on_reconnected:
            self.nc._reconnected_cb = self._previous_reconnected_cb
        if self._owns_connection and not self.nc.is_closed:
            await self.nc.drain()


def _check_request_id(request_id: str) -> None:
    if not isinstance(request_id, str) or not (
        1 <= len(request_id.encode()) <= MAX_REQUEST_ID_BYTES
    ):
        raise ValueError(
            f"request_id is {request_id!r:.80}; expected a string of 1 to "
            f"{MAX_REQUEST_ID_BYTES} bytes"
        )


def _reply(msg: Msg) -> Reply:
    body = wire.decode(msg.data, wire.encoding_of(msg.headers))
    if not isinstance(body, dict):
        raise ProtocolError(f"an answer on {msg.subject} is {body!r:.200}, not a map")
    request_id = body.get("request_id")
    request_id = request_id if isinstance(request_id, str) else None
    kind = body.get("kind")
    if kind == "error":
        return from_response(body)
    output = body.get("output")
    return Terminal(
        request_id=request_id,
        output=output if isinstance(output, dict) else {},
        raw=body,
        kind=kind if isinstance(kind, str) else "",
    )
