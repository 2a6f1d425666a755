"""Python client of prefill-handoff, the NATS worker between the prefill and
decode legs of disaggregated LLM serving.

    client = await HandoffClient.connect("nats://127.0.0.1:4222", namespace="llm")
    [disagg_request_id] = await client.mint_ids()
    await client.publish_result(request_id, frames)
    reply = await client.await_reply(request_id, timeout=30)

Layout:

- ``client``: :class:`HandoffClient`, the connection and every operation.
- ``streams``: the decode-job and KV-release iterators it hands out.
- ``messages``: :class:`DecodeJob`, :class:`ReleaseNotice`, :class:`Terminal`.
- ``errors``: the worker's error codes as exceptions.
- ``wire``: MessagePack and JSON, as the worker reads and writes them.
- ``subjects``: the namespace's subjects and stream names.
- ``engines``: adapters for TensorRT-LLM, vLLM and SGLang (no engine import
  until used).
"""

from .client import Frame, HandoffClient, Reply
from .errors import (
    RETRYABLE_CODES,
    HandoffError,
    IdentityUnavailable,
    ProtocolError,
    RateLimited,
)
from .messages import DecodeJob, ReleaseNotice, Terminal
from .streams import DecodeJobs, KvReleases
from .subjects import Subjects
from .wire import Encoding

__version__ = "0.1.0"

__all__ = [
    "RETRYABLE_CODES",
    "DecodeJob",
    "DecodeJobs",
    "Encoding",
    "Frame",
    "HandoffClient",
    "HandoffError",
    "IdentityUnavailable",
    "KvReleases",
    "ProtocolError",
    "RateLimited",
    "ReleaseNotice",
    "Reply",
    "Subjects",
    "Terminal",
    "__version__",
]
