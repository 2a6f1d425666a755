"""vLLM: a ``RequestOutput`` of the prefill instance in, the decode request's
``kv_transfer_params`` out.

vLLM's KV connectors (NIXL and others) return, on the prefill side's final
``RequestOutput``, ``kv_transfer_params`` such as ``{"do_remote_prefill":
True, "remote_engine_id", "remote_block_ids", "remote_host",
"remote_port", ...}``; the decode request carries the same dict back. With the
hybrid KV cache manager ``remote_block_ids`` holds one list per KV-cache
group. Nothing here imports ``vllm``: its objects are read by attribute, and
plain dicts of the same fields work too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..messages import DecodeJob


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# The finish reasons with which a prefill still goes on to decode (the
# worker's rule: absent, null, "length", "not_finished"); vLLM finishes a
# prefill-only request (max_tokens=1) with "length".
_DECODE_FINISH_REASONS = (None, "length", "not_finished")


def frame(request_output: Any, *, nested: bool = False, **extra: Any) -> dict[str, Any]:
    """A frame from the prefill's ``RequestOutput`` (or a dict of its fields):
    the first completion's ``token_ids``, ``text`` and ``finish_reason``, and
    ``kv_transfer_params`` as ``disaggregated_params``, exactly as vLLM
    returned them. ``nested=True`` wraps them as Dynamo does,
    ``{"kv_transfer_params": {...}}``.

    A request that finished at prefill (its first token was EOS or a stop
    string: ``finish_reason`` ``"stop"``, ``"abort"``, ...) comes back from
    vLLM with ``kv_transfer_params=None``, since the KV connector keeps no KV
    for it; its frame then has no ``disaggregated_params`` and the worker
    answers it terminal. Raises ``ValueError`` when the params are missing
    from a request that goes on to decode (``finish_reason`` ``None`` or
    ``"length"``)."""
    outputs = _get(request_output, "outputs") or []
    first = outputs[0] if outputs else {}
    finish_reason = _get(first, "finish_reason")
    out: dict[str, Any] = {
        "token_ids": list(_get(first, "token_ids") or []),
        "text": _get(first, "text") or "",
        "finish_reason": finish_reason,
    }
    params = _get(request_output, "kv_transfer_params")
    if isinstance(params, Mapping):
        handoff: dict[str, Any] = dict(params)
        out["disaggregated_params"] = {"kv_transfer_params": handoff} if nested else handoff
    elif params is not None or finish_reason in _DECODE_FINISH_REASONS:
        raise ValueError(
            f"the RequestOutput (finish_reason {finish_reason!r}) has kv_transfer_params "
            f"{params!r:.80}, and it goes on to decode: was the prefill request sent with "
            "kv_transfer_params {'do_remote_decode': True} to an engine with a KV connector?"
        )
    out.update(extra)
    return out


def kv_transfer_params(job: DecodeJob) -> dict[str, Any]:
    """The dict to put in the decode request's ``kv_transfer_params`` (its
    ``SamplingParams.extra_args`` or the OpenAI request's field): the prefill's
    params as they came, grouped ``remote_block_ids`` included, unwrapped
    from Dynamo's ``{"kv_transfer_params": ...}`` when nested."""
    handoff = job.handoff
    nested = handoff.get("kv_transfer_params")
    if isinstance(nested, dict) and len(handoff) == 1:
        return dict(nested)
    return dict(handoff)
