"""TensorRT-LLM: its ``DisaggregatedParams`` in and out of the handoff.

The flow, as TensorRT-LLM's own disaggregated orchestrator runs it: mint the
``disagg_request_id`` before the context phase (:func:`context_params`), run
the context phase with it, publish its output (:func:`frame`); the decode side
turns the job back into the generation phase's params
(:func:`generation_params`, or :func:`serve_json` for trtllm-serve's HTTP
API). The engine's objects are read by attribute, so ``tensorrt_llm`` is
never imported here; plain dicts of the same fields work too.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..client import HandoffClient
    from ..messages import DecodeJob

# The fields of tensorrt_llm.disaggregated_params.DisaggregatedParams, the
# generation phase's kwargs; anything else in a handoff is dropped from them.
PARAMS_FIELDS = (
    "request_type",
    "first_gen_tokens",
    "first_gen_log_probs",
    "first_gen_logits",
    "ctx_request_id",
    "opaque_state",
    "draft_tokens",
    "disagg_request_id",
    "ctx_dp_rank",
    "ctx_info_endpoint",
    "schedule_style",
    "multimodal_embedding_handles",
    "multimodal_hashes",
    "mrope_position_ids_handle",
    "mrope_position_deltas_handle",
)

# The fields of trtllm-serve's JSON model of the same params
# (tensorrt_llm/serve/openai_protocol.py, DisaggregatedParams, extra="forbid"):
# opaque_state travels base64-encoded as encoded_opaque_state.
SERVE_JSON_FIELDS = (
    "request_type",
    "first_gen_tokens",
    "first_gen_log_probs",
    "first_gen_logits",
    "ctx_request_id",
    "encoded_opaque_state",
    "draft_tokens",
    "disagg_request_id",
    "ctx_dp_rank",
    "ctx_info_endpoint",
    "schedule_style",
    "ctx_usage",
    "return_prompt_token_ids_b64",
    "resolved_thinking",
)


async def context_params(
    client: HandoffClient, *, timeout: float | None = None, **fields: Any
) -> dict[str, Any]:
    """The context phase's params, with a ``disagg_request_id`` minted from the
    workers' ID service: ``DisaggregatedParams(**await context_params(client))``.

    TensorRT-LLM keys the KV transfer by this ID on both sides, so it must be
    known before the context phase runs. ``timeout`` is
    :meth:`HandoffClient.mint_ids`'s (``None``: its default, 1 s). Raises
    what :meth:`HandoffClient.mint_ids` raises."""
    if timeout is None:
        [disagg_request_id] = await client.mint_ids(1)
    else:
        [disagg_request_id] = await client.mint_ids(1, timeout=timeout)
    return {**fields, "request_type": "context_only", "disagg_request_id": disagg_request_id}


def params_dict(params: Any) -> dict[str, Any]:
    """A ``DisaggregatedParams`` (or a mapping of its fields) as a dict for the
    wire: fields that are ``None`` left out, enum values as integers,
    ``opaque_state`` kept as bytes. A mapping is copied as it is, unknown keys
    included."""
    if isinstance(params, Mapping):
        return dict(params)
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        names = [f.name for f in dataclasses.fields(params)]
    else:
        names = [n for n in PARAMS_FIELDS if hasattr(params, n)]
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(params, name)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            value = int(value)  # DisaggScheduleStyle is an IntEnum
        out[name] = value
    return out


def frame(
    params: Any,
    *,
    token_ids: list[int],
    text: str = "",
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A frame of the context phase's output: its first token(s), its finish
    reason (``None`` or ``"length"`` when the request goes on to decode) and
    its ``disaggregated_params``; ``extra`` keys (``completion_usage``, ...)
    are added as given."""
    return {
        "token_ids": list(token_ids),
        "text": text,
        "finish_reason": finish_reason,
        "disaggregated_params": params_dict(params),
        **extra,
    }


def generation_params(job: DecodeJob) -> dict[str, Any]:
    """The keyword arguments of ``DisaggregatedParams`` for the generation
    phase: ``request_type="generation_only"``, the job's
    ``disagg_request_id``, ``opaque_state`` as bytes; keys the class does not
    have are dropped."""
    handoff = job.handoff
    out = {k: handoff[k] for k in PARAMS_FIELDS if k in handoff and handoff[k] is not None}
    out["request_type"] = "generation_only"
    if job.disagg_request_id is not None:
        out["disagg_request_id"] = job.disagg_request_id
    opaque = _opaque_bytes(handoff)
    if opaque is not None:
        out["opaque_state"] = opaque
    if "first_gen_log_probs" in out:
        out["first_gen_log_probs"] = _int_keyed(out["first_gen_log_probs"])
    return out


def serve_json(job: DecodeJob) -> dict[str, Any]:
    """trtllm-serve's JSON ``disaggregated_params`` for the generation request:
    only the fields its model allows, ``opaque_state`` as base64
    ``encoded_opaque_state``."""
    handoff = job.handoff
    out = {k: handoff[k] for k in SERVE_JSON_FIELDS if k in handoff and handoff[k] is not None}
    out["request_type"] = "generation_only"
    if job.disagg_request_id is not None:
        out["disagg_request_id"] = job.disagg_request_id
    opaque = _opaque_bytes(handoff)
    if opaque is not None:
        out["encoded_opaque_state"] = base64.b64encode(opaque).decode()
    return out


def _opaque_bytes(handoff: Mapping[Any, Any]) -> bytes | None:
    """``opaque_state`` as bytes, whichever way it travelled: as bytes
    (MessagePack), as trtllm-serve's base64 ``encoded_opaque_state``, or as a
    base64 string under its own name (Dynamo's DisaggregatedParamsCodec)."""
    opaque = handoff.get("opaque_state")
    if isinstance(opaque, (bytes, bytearray)):
        return bytes(opaque)
    if isinstance(opaque, str):
        return base64.b64decode(opaque)
    encoded = handoff.get("encoded_opaque_state")
    if isinstance(encoded, str):
        return base64.b64decode(encoded)
    return None


def _int_keyed(log_probs: Any) -> Any:
    """``first_gen_log_probs`` with its token-ID keys as integers again: JSON
    turns them into strings on the way (MessagePack keeps them)."""
    if not isinstance(log_probs, list):
        return log_probs

    def fix(item: Any) -> Any:
        if isinstance(item, list):
            return [fix(i) for i in item]
        if isinstance(item, dict):
            return {
                (int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k): v
                for k, v in item.items()
            }
        return item

    return fix(log_probs)
