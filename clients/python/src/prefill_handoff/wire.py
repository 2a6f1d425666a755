"""Bytes on the wire: MessagePack (the default) or JSON, chosen per message.

MessagePack keeps what JSON cannot: binary values stay ``bytes`` (a
TensorRT-LLM ``opaque_state``), map keys that are integers stay integers
(``first_gen_log_probs`` keyed by token ID). JSON travels with the header
``Content-Type: application/json``, and the worker answers in the encoding of
the message that caused the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import msgpack

Encoding = Literal["msgpack", "json"]

CONTENT_TYPE = "Content-Type"
JSON_CONTENT_TYPE = "application/json"


def encode(value: Any, encoding: Encoding) -> bytes:
    """``value`` as MessagePack (binary as bin, strings as str) or JSON."""
    if encoding == "msgpack":
        packed: bytes = msgpack.packb(value, use_bin_type=True, default=_msgpack_default)
        return packed
    if encoding == "json":
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except TypeError as e:
            raise TypeError(
                f"{e}; JSON has no binary type: send bytes with encoding='msgpack', "
                "or base64 them first (as trtllm-serve's encoded_opaque_state does)"
            ) from e
    raise ValueError(f"encoding is {encoding!r}; expected 'msgpack' or 'json'")


def _msgpack_default(value: Any) -> Any:
    # Tuples are packed as arrays by msgpack itself; sets and other iterables
    # of an engine's objects (a numpy int, an IntEnum subclass) are not.
    if isinstance(value, (set, frozenset)):
        return list(value)
    if hasattr(value, "__index__"):
        return value.__index__()
    raise TypeError(f"cannot encode {type(value).__name__} as MessagePack")


def decode(data: bytes, encoding: Encoding) -> Any:
    """One MessagePack or JSON value; binary stays ``bytes``, integer map keys
    stay integers."""
    if encoding == "json":
        return json.loads(data)
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def encoding_of(headers: Mapping[str, str] | None) -> Encoding:
    """The encoding a message's headers announce; the content type is matched
    without regard to case or parameters, as the worker matches it."""
    if not headers:
        return "msgpack"
    for name, value in headers.items():
        if name.lower() == CONTENT_TYPE.lower():
            media = value.split(";", 1)[0].strip().lower()
            return "json" if media == JSON_CONTENT_TYPE else "msgpack"
    return "msgpack"


def headers_for(encoding: Encoding, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers a message in ``encoding`` is sent with, ``extra`` added."""
    out: dict[str, str] = dict(extra or {})
    if encoding == "json":
        out[CONTENT_TYPE] = JSON_CONTENT_TYPE
    return out
