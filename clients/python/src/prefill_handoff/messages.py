"""What the worker publishes, as typed values that keep every field.

Each type holds the decoded message in ``raw``: fields the worker adds in a
later release are there without a new client. The typed fields are read from
it and never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ProtocolError
from .wire import Encoding


class _JetStreamMsg(Protocol):
    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


def _str(value: Any, what: str, raw: Mapping[Any, Any]) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} is {value!r:.80}, not a string, in {dict(raw)!r:.200}")
    return value


def _opt_int(value: Any) -> int | None:
    # bool is an int in Python; the wire never sends one where an integer belongs.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _map(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Terminal:
    """A request answered without decode: its prefill already finished (EOS,
    stop, cancelled, ...), or the final answer a decode worker sent to the
    same reply subject. ``output`` is the first frame without
    ``disaggregated_params``; ``kind`` is ``"terminal"`` for the worker's own
    answers."""

    request_id: str | None
    output: dict[Any, Any]
    raw: dict[Any, Any]
    kind: str = "terminal"

    @property
    def finish_reason(self) -> Any:
        return self.output.get("finish_reason")


@dataclass(frozen=True)
class DecodeJob:
    """A decode job from the GEN subject.

    ``handoff`` is the engine's params exactly as the worker passed them on
    (for TensorRT-LLM with ``request_type: generation_only`` and the
    ``disagg_request_id``); ``raw`` the whole job. In JetStream mode
    :meth:`ack`, :meth:`nak` and :meth:`in_progress` settle the delivery; on a
    core subscription they do nothing.
    """

    request_id: str
    reply_to: str
    backend: str
    handoff: dict[Any, Any]
    prefill_output: dict[Any, Any]
    request: dict[Any, Any] | None
    deadline_ms: int | None
    kv_expires_ms: int | None
    disagg_request_id: int | None
    worker: dict[Any, Any]
    raw: dict[Any, Any]
    headers: dict[str, str] = field(default_factory=dict)
    encoding: Encoding = "msgpack"
    # The delivery's count in JetStream mode (1 the first time); 1 in core mode.
    delivery: int = 1
    _msg: _JetStreamMsg | None = field(default=None, repr=False, compare=False)

    @property
    def msg_id(self) -> str | None:
        """The GEN message's ``Nats-Msg-Id`` (``handoff-{request_id}``)."""
        return self.headers.get("Nats-Msg-Id")

    @property
    def traceparent(self) -> str | None:
        return self.headers.get("traceparent")

    async def ack(self) -> None:
        """Done with the job: JetStream will not deliver it again."""
        if self._msg is not None:
            await self._msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        """Give the job back: JetStream delivers it again, after ``delay``
        seconds when given."""
        if self._msg is not None:
            await self._msg.nak(delay=delay)

    async def in_progress(self) -> None:
        """Still working: JetStream waits another ack-wait before it delivers
        the job elsewhere."""
        if self._msg is not None:
            await self._msg.in_progress()

    @classmethod
    def from_message(
        cls,
        body: dict[Any, Any],
        headers: Mapping[str, str] | None = None,
        *,
        encoding: Encoding = "msgpack",
        delivery: int = 1,
        msg: _JetStreamMsg | None = None,
    ) -> DecodeJob:
        if not isinstance(body, dict):
            raise ProtocolError(f"a decode job is {type(body).__name__}, not a map")
        request = body.get("request")
        return cls(
            request_id=_str(body.get("request_id"), "request_id", body),
            reply_to=_str(body.get("reply_to"), "reply_to", body),
            backend=_str(body.get("backend"), "backend", body),
            handoff=_map(body.get("handoff")),
            prefill_output=_map(body.get("prefill_output")),
            request=request if isinstance(request, dict) else None,
            deadline_ms=_opt_int(body.get("deadline_ms")),
            kv_expires_ms=_opt_int(body.get("kv_expires_ms")),
            disagg_request_id=_opt_int(body.get("disagg_request_id")),
            worker=_map(body.get("worker")),
            raw=body,
            headers=dict(headers or {}),
            encoding=encoding,
            delivery=delivery,
            _msg=msg,
        )


@dataclass(frozen=True)
class ReleaseNotice:
    """The worker refused a handoff whose KV the prefill engine still holds:
    free it now (``reason`` is the error code the request was answered
    with; ``handoff`` the engine's params as the worker received them)."""

    request_id: str
    reason: str
    backend: str
    handoff: dict[Any, Any]
    worker: dict[Any, Any]
    raw: dict[Any, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_message(cls, body: dict[Any, Any]) -> ReleaseNotice:
        if not isinstance(body, dict):
            raise ProtocolError(f"a KV release notice is {type(body).__name__}, not a map")
        return cls(
            request_id=_str(body.get("request_id"), "request_id", body),
            reason=_str(body.get("reason"), "reason", body),
            backend=_str(body.get("backend"), "backend", body),
            handoff=_map(body.get("handoff")),
            worker=_map(body.get("worker")),
            raw=body,
        )
