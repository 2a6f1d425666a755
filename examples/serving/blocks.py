"""The KV transfer: a decode engine reads a prefill engine's blocks over TCP.

The stand-in for NIXL, Mooncake or TensorRT-LLM's transceiver, on
127.0.0.1. Frames are a 4-byte big-endian length and a MessagePack map. One
connection per transfer:

    decode -> prefill  {"op": "read", "key", "blocks": [[ids] per group], "reader"}
    prefill -> decode  {"ok": true, "gens", "data": [[[entries] per block] per group], "n_tokens"}
                       or {"ok": false, "error": "kv_gone" | "wrong_blocks"}
    decode -> prefill  {"op": "done", "key"}     (the read is complete: free the blocks)
    prefill -> decode  {"ok": true}

`key` names the transfer session the way the engines do: vLLM's request ID,
TensorRT-LLM's disagg_request_id.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

MAX_FRAME = 16 << 20


async def send(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    body = msgpack.packb(msg)
    writer.write(struct.pack(">I", len(body)) + body)
    await writer.drain()


async def recv(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readexactly(4)
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes")
    return msgpack.unpackb(await reader.readexactly(n))  # type: ignore[no-any-return]


class TransferFailed(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


async def read_blocks(host: str, port: int, key: str, blocks: list[list[int]], reader_id: str,
                      timeout: float = 3.0) -> tuple[dict[str, Any], Any]:
    """Reads the blocks; returns the answer and a `confirm` coroutine function
    that tells the prefill engine the read is done."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        raise TransferFailed("kv_unreachable") from e
    try:
        await send(w, {"op": "read", "key": key, "blocks": blocks, "reader": reader_id})
        answer = await asyncio.wait_for(recv(r), timeout)
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
        w.close()
        raise TransferFailed("kv_transfer_failed") from e
    if not answer.get("ok"):
        w.close()
        raise TransferFailed(str(answer.get("error", "kv_transfer_failed")))

    async def confirm() -> None:
        try:
            await send(w, {"op": "done", "key": key})
            await asyncio.wait_for(recv(r), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass  # the prefill engine's hold frees the blocks then
        finally:
            w.close()

    return answer, confirm
