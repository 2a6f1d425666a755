"""SGLang: the bootstrap triple that pairs a prefill with its decode.

SGLang's prefill and decode servers meet at a bootstrap server on the prefill
side: the request carries ``bootstrap_host``, ``bootstrap_port`` (``None``:
the prefill server's default) and ``bootstrap_room`` (a number naming the
transfer), and both legs run at once. So the bootstrap frame is published
before the prefill engine runs, not after. Nothing here imports ``sglang``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..messages import DecodeJob

BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def bootstrap_frame(
    host: str,
    port: int | None,
    room: int,
    *,
    token_ids: list[int] | None = None,
    text: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """A frame that sends the request to decode with its bootstrap triple;
    ``finish_reason`` is ``None`` (the prefill has not finished)."""
    return {
        "token_ids": list(token_ids or []),
        "text": text,
        "finish_reason": None,
        "disaggregated_params": {
            "bootstrap_host": host,
            "bootstrap_port": port,
            "bootstrap_room": room,
        },
        **extra,
    }


def generate_kwargs(job: DecodeJob) -> dict[str, Any]:
    """``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` for the
    decode server's ``generate`` (its ``GenerateReqInput`` fields)."""
    return {name: job.handoff.get(name) for name in BOOTSTRAP_FIELDS}
