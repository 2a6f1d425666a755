"""The worker's error responses as Python exceptions.

An error response is ``{"request_id", "kind": "error", "error": {"code",
"message"}}``; its ``code`` is one of the contract's codes (docs/protocol.md,
"Codes"). :func:`from_response` turns one into the matching class, so callers
can ``except IdentityUnavailable`` or look at ``.code`` and ``.retryable``.
"""

from __future__ import annotations

import re
from typing import Any

# Codes whose request may succeed when sent again as it is, later: the worker
# was saturated (over_budget), its KV expired before decode could take it
# (kv_expired: the whole request is retried, prefill included), no worker held
# an ID slot at that moment (identity_unavailable), or the ID service's budget
# was spent (rate_limited). Every other code describes the request itself or a
# decision the client made (cancelled, deadline_exceeded), and repeats.
RETRYABLE_CODES = frozenset({"over_budget", "kv_expired", "identity_unavailable", "rate_limited"})


class HandoffError(Exception):
    """An error response of the worker (or of its ID service).

    ``code`` is the contract's wire code, ``message`` the worker's sentence,
    ``request_id`` the request it answers (``None`` when the worker could not
    read one), ``raw`` the whole decoded response, unknown fields included.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        raw: dict[Any, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.raw: dict[Any, Any] = raw if raw is not None else {}

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again later may succeed."""
        return self.code in RETRYABLE_CODES

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"request_id={self.request_id!r})"
        )


class IdentityUnavailable(HandoffError):
    """No worker could mint an ID: none held a machine-ID slot (it lost its
    etcd lease), or none answered on the ID service subject."""


class RateLimited(HandoffError):
    """The ID service's budget (``id_service.ids_per_sec``) is spent.

    ``retry_after_s`` is when the IDs will be there, in seconds, as the
    worker's message says; ``None`` when the request asked for more IDs than
    one request may take (``id_service.max_count``), which no wait fixes.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        raw: dict[Any, Any] | None = None,
    ) -> None:
        super().__init__(code, message, request_id=request_id, raw=raw)
        self.retry_after_s = retry_after_seconds(message)

    @property
    def retryable(self) -> bool:
        return self.retry_after_s is not None


class ProtocolError(Exception):
    """A message from the worker that does not have the contract's shape."""


# The worker states the wait only in its sentence ("...; retry after 12 ms",
# src/id_service/budget.rs), so it is read from there.
_RETRY_AFTER = re.compile(r"retry after (\d+(?:\.\d+)?) ?(ms|s)\b")


def retry_after_seconds(message: str) -> float | None:
    """The wait a ``rate_limited`` message names, in seconds, or ``None``."""
    found = _RETRY_AFTER.search(message)
    if found is None:
        return None
    value = float(found.group(1))
    return value / 1000.0 if found.group(2) == "ms" else value


_BY_CODE: dict[str, type[HandoffError]] = {
    "identity_unavailable": IdentityUnavailable,
    "rate_limited": RateLimited,
}


def from_response(response: dict[Any, Any]) -> HandoffError:
    """The exception an error response stands for (``kind == "error"``)."""
    error = response.get("error")
    if not isinstance(error, dict):
        raise ProtocolError(f"an error response without an error map: {response!r:.200}")
    code = error.get("code")
    message = error.get("message")
    if not isinstance(code, str):
        raise ProtocolError(f"an error response without a string code: {response!r:.200}")
    request_id = response.get("request_id")
    cls = _BY_CODE.get(code, HandoffError)
    return cls(
        code,
        message if isinstance(message, str) else "",
        request_id=request_id if isinstance(request_id, str) else None,
        raw=response,
    )
