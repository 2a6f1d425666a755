"""Round trips through a real worker: what the decode side receives equals
what the prefill side sent, for each engine's real shapes."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pytest
from harness import Worker, next_of, unique

from prefill_handoff import DecodeJob, Encoding, HandoffClient, Terminal
from prefill_handoff.engines import sglang, trtllm, vllm

OPAQUE = b"\x00\x01\xff"


async def hand_off(
    worker: Worker, frames: list[dict[str, Any]], **publish: Any
) -> tuple[str, DecodeJob]:
    """Publishes one result and returns the decode job it became."""
    request_id = unique("rt")
    async with await HandoffClient.connect(worker.nats.url, worker.namespace) as client:
        async with client.decode_jobs() as jobs:
            await client.publish_result(request_id, frames, **publish)
            job: DecodeJob = await next_of(jobs)
    assert job.request_id == request_id
    return request_id, job


# What a context phase returns, as tensorrt_llm's DisaggregatedParams holds it
# (tensorrt_llm/disaggregated_params.py): a slots dataclass read by attribute.
@dataclass(slots=True, kw_only=True)
class DisaggregatedParams:
    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    first_gen_log_probs: list[Any] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None
    disagg_request_id: int | None = None
    ctx_dp_rank: int | None = None
    ctx_info_endpoint: str | None = None


async def test_trtllm_minted_id_is_kept_and_opaque_state_stays_bytes(core_worker: Worker) -> None:
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        ctx = await trtllm.context_params(client)
    assert ctx["request_type"] == "context_only"
    minted = ctx["disagg_request_id"]
    # The context phase ran with the minted ID and returns it in its params.
    params = DisaggregatedParams(
        **ctx,
        first_gen_tokens=[1917],
        ctx_request_id=77,
        opaque_state=OPAQUE,
        ctx_dp_rank=0,
        ctx_info_endpoint="tcp://10.0.0.7:5555",
    )
    sent = trtllm.frame(params, token_ids=[1917], text="Hi", finish_reason="length")
    _, job = await hand_off(core_worker, [sent], request={"model": "llama", "max_tokens": 8})

    assert job.backend == "trtllm"
    assert job.disagg_request_id == minted
    assert job.request == {"model": "llama", "max_tokens": 8}
    assert job.prefill_output == {k: v for k, v in sent.items() if k != "disaggregated_params"}
    assert trtllm.generation_params(job) == {
        "request_type": "generation_only",
        "first_gen_tokens": [1917],
        "ctx_request_id": 77,
        "opaque_state": OPAQUE,
        "disagg_request_id": minted,
        "ctx_dp_rank": 0,
        "ctx_info_endpoint": "tcp://10.0.0.7:5555",
    }
    assert trtllm.serve_json(job)["encoded_opaque_state"] == base64.b64encode(OPAQUE).decode()


async def test_trtllm_serve_json_shape_round_trips(core_worker: Worker) -> None:
    """trtllm-serve's JSON: base64 encoded_opaque_state, unknown keys passed on
    by the worker, dropped by serve_json (its model forbids extra fields)."""
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        [minted] = await client.mint_ids()
    params = {
        "request_type": "context_only",
        "first_gen_tokens": [7],
        "ctx_request_id": 9,
        "encoded_opaque_state": base64.b64encode(OPAQUE).decode(),
        "draft_tokens": None,
        "disagg_request_id": minted,
        "some_future_field": {"kept": True},
    }
    sent = trtllm.frame(params, token_ids=[7], finish_reason=None)
    _, job = await hand_off(core_worker, [sent], encoding="json")

    assert job.encoding == "json"
    assert job.handoff["some_future_field"] == {"kept": True}
    assert job.handoff["encoded_opaque_state"] == params["encoded_opaque_state"]
    assert trtllm.serve_json(job) == {
        "request_type": "generation_only",
        "first_gen_tokens": [7],
        "ctx_request_id": 9,
        "encoded_opaque_state": params["encoded_opaque_state"],
        "disagg_request_id": minted,
    }
    assert trtllm.generation_params(job)["opaque_state"] == OPAQUE


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_first_gen_log_probs_keep_integer_token_keys(
    core_worker: Worker, encoding: Encoding
) -> None:
    # One entry per token, each a map token ID -> its logprob (TensorRT-LLM's
    # TokenLogprobs), with a second candidate token.
    log_probs = [[{1917: {"logprob": -0.25, "rank": 1}, 42: {"logprob": -1.5, "rank": 2}}]]
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        [minted] = await client.mint_ids()
    params = {
        "request_type": "context_only",
        "ctx_request_id": 5,
        "disagg_request_id": minted,
        "first_gen_tokens": [1917],
        "first_gen_log_probs": log_probs,
    }
    _, job = await hand_off(
        core_worker, [trtllm.frame(params, token_ids=[1917])], encoding=encoding
    )
    assert trtllm.generation_params(job)["first_gen_log_probs"] == log_probs
    if encoding == "msgpack":
        # MessagePack carries the integer keys themselves, not only the adapter.
        assert job.handoff["first_gen_log_probs"] == log_probs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class RequestOutput:
    """The fields of vllm.outputs.RequestOutput the adapter reads."""

    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    kv_transfer_params: dict[str, Any] | None


def vllm_params(block_ids: Any) -> dict[str, Any]:
    # As vLLM's NIXL connector returns them from request_finished.
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": block_ids,
        "remote_engine_id": "prefill-0",
        "remote_request_id": "cmpl-123",
        "remote_host": "10.0.0.8",
        "remote_port": 5600,
        "tp_size": 1,
    }


@pytest.mark.parametrize(
    ("block_ids", "nested"),
    [
        ([3, 4, 5], False),
        ([[3, 4, 5], [9, 10]], False),  # one list per KV-cache group
        ([[3, 4, 5], [9, 10]], True),  # Dynamo's {"kv_transfer_params": {...}}
    ],
    ids=["flat", "grouped", "dynamo-nested"],
)
async def test_vllm_kv_transfer_params_round_trip(
    core_worker: Worker, block_ids: Any, nested: bool
) -> None:
    params = vllm_params(block_ids)
    output = RequestOutput(
        request_id="cmpl-123",
        outputs=[CompletionOutput(0, "Hi", [1917], "length")],
        finished=True,
        kv_transfer_params=params,
    )
    sent = vllm.frame(output, nested=nested)
    _, job = await hand_off(core_worker, [sent])
    assert job.backend == "vllm"
    assert job.handoff == sent["disaggregated_params"]
    assert vllm.kv_transfer_params(job) == params


@pytest.mark.parametrize("port", [8998, None], ids=["port", "null-port"])
async def test_sglang_bootstrap_round_trip(core_worker: Worker, port: int | None) -> None:
    sent = sglang.bootstrap_frame("10.0.0.7", port, 123456789)
    _, job = await hand_off(core_worker, [sent])
    assert job.backend == "sglang"
    assert sglang.generate_kwargs(job) == {
        "bootstrap_host": "10.0.0.7",
        "bootstrap_port": port,
        "bootstrap_room": 123456789,
    }


async def test_traceparent_reaches_the_decode_job(core_worker: Worker) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sent = sglang.bootstrap_frame("10.0.0.7", 8998, 1)
    _, job = await hand_off(core_worker, [sent], headers={"traceparent": traceparent})
    assert job.traceparent == traceparent


async def test_unknown_fields_flow_through(core_worker: Worker) -> None:
    sent = sglang.bootstrap_frame("h", 1, 2, logprobs_blob=b"\x00\xfe")
    sent["disaggregated_params"]["bootstrap_future"] = {1: b"\x01"}
    _, job = await hand_off(core_worker, [sent], request={"extra": [1, {"x": b"\x02"}]})
    assert job.prefill_output["logprobs_blob"] == b"\x00\xfe"
    assert job.handoff["bootstrap_future"] == {1: b"\x01"}
    assert job.request == {"extra": [1, {"x": b"\x02"}]}


@pytest.mark.parametrize("finish_reason", ["stop", "abort"])
async def test_vllm_a_request_finished_at_prefill_is_answered_terminal(
    core_worker: Worker, finish_reason: str
) -> None:
    """vLLM's KV connector returns no kv_transfer_params for a request that
    finished at prefill (its first token was EOS, a stop string, an abort):
    its frame carries the finish reason and no params, and the worker answers
    it without decode."""
    output = RequestOutput(
        request_id="cmpl-eos",
        outputs=[CompletionOutput(0, "", [2], finish_reason)],
        finished=True,
        kv_transfer_params=None,
    )
    sent = vllm.frame(output)
    assert sent == {"token_ids": [2], "text": "", "finish_reason": finish_reason}
    request_id = unique("vllm-eos")
    async with await HandoffClient.connect(core_worker.nats.url) as client:
        await client.publish_result(request_id, [sent])
        reply = await client.await_reply(request_id, timeout=20)
    assert isinstance(reply, Terminal)
    assert (reply.request_id, reply.finish_reason) == (request_id, finish_reason)


@pytest.mark.parametrize("finish_reason", ["length", None])
def test_vllm_a_request_going_to_decode_needs_kv_transfer_params(
    finish_reason: str | None,
) -> None:
    output = RequestOutput(
        request_id="cmpl-x",
        outputs=[CompletionOutput(0, "Hi", [1917], finish_reason)],
        finished=finish_reason is not None,
        kv_transfer_params=None,
    )
    with pytest.raises(ValueError, match="kv_transfer_params"):
        vllm.frame(output)
