"""The handoff parameters of the two flows, as the engines shape them.

vLLM (its NIXL connector's `kv_transfer_params`): the prefill engine's ID,
host and side-channel port, and one list of block IDs per KV-cache group;
the transfer is keyed by the request ID.

TensorRT-LLM (its `DisaggregatedParams` after the context phase):
`ctx_request_id`, `request_type: context_only`, `first_gen_tokens`, the
`disagg_request_id` minted before the context phase, and `opaque_state`,
bytes only the engines read (here: MessagePack of the engine ID, endpoint
and block IDs); the transfer is keyed by `disagg_request_id`, as
TensorRT-LLM's transceiver keys it when it is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

import common  # noqa: F401  (puts the client on sys.path)
from prefill_handoff.engines import trtllm, vllm


@dataclass
class Location:
    engine_id: str
    host: str
    port: int
    key: str
    blocks: list[list[int]]


def handoff_frame(flow: str, *, rid: str, engine_id: str, host: str, port: int, blocks: list[list[int]],
                  first: int, ctx_request_id: int, disagg_request_id: int | None) -> dict[str, Any]:
    if flow == "vllm":
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine_id,
                  "remote_host": host, "remote_port": port, "remote_block_ids": blocks,
                  "remote_request_id": rid, "tp_size": 1}
        return vllm.frame(_RequestOutput(rid, [first], None, params))
    state = msgpack.packb({"engine_id": engine_id, "host": host, "port": port, "blocks": blocks})
    params = {"request_type": "context_only", "first_gen_tokens": [first], "ctx_request_id": ctx_request_id,
              "disagg_request_id": disagg_request_id, "opaque_state": state,
              "ctx_info_endpoint": f"tcp://{host}:{port}"}
    return trtllm.frame(params, token_ids=[first], text="", finish_reason=None)


def terminal_frame(flow: str, rid: str, first: int) -> dict[str, Any]:
    """A request finished at prefill (its stop token came first): no handoff
    parameters, as vLLM returns `kv_transfer_params=None` for it."""
    if flow == "vllm":
        return vllm.frame(_RequestOutput(rid, [first], "stop", None))
    return {"token_ids": [first], "text": "", "finish_reason": "stop"}


def locate(job: Any) -> Location:
    """Where a decode job's KV lives, read through the client's adapters."""
    if job.backend == "vllm":
        p = vllm.kv_transfer_params(job)
        return Location(p["remote_engine_id"], p["remote_host"], int(p["remote_port"]),
                        str(p.get("remote_request_id") or job.request_id), p["remote_block_ids"])
    if job.backend == "trtllm":
        g = trtllm.generation_params(job)
        if g.get("request_type") != "generation_only":
            raise ValueError(f"request_type {g.get('request_type')!r}")
        st = msgpack.unpackb(g["opaque_state"])
        return Location(st["engine_id"], st["host"], int(st["port"]), str(g["disagg_request_id"]), st["blocks"])
    raise ValueError(f"backend {job.backend!r}")


def names_engine(handoff: Any, engine_id: str) -> bool:
    """Whether a release notice's handoff parameters name this engine's KV."""
    if not isinstance(handoff, dict):
        return False
    inner = handoff.get("kv_transfer_params", handoff)
    if isinstance(inner, dict) and inner.get("remote_engine_id") == engine_id:
        return True
    state = handoff.get("opaque_state")
    if isinstance(state, (bytes, bytearray)):
        try:
            return bool(msgpack.unpackb(state).get("engine_id") == engine_id)
        except Exception:  # noqa: BLE001
            return False
    return False


class _Output:
    def __init__(self, token_ids: list[int], finish_reason: str | None) -> None:
        self.index = 0
        self.token_ids = token_ids
        self.text = ""
        self.finish_reason = finish_reason


class _RequestOutput:
    """The shape of vLLM's RequestOutput that the adapter reads."""

    def __init__(self, rid: str, token_ids: list[int], finish_reason: str | None,
                 kv_transfer_params: dict[str, Any] | None) -> None:
        self.request_id = rid
        self.outputs = [_Output(token_ids, finish_reason)]
        self.finished = finish_reason is not None
        self.kv_transfer_params = kv_transfer_params
