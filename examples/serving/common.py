"""What every engine process shares: its command line, its NATS connection
and the subject the frontend sends requests on."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
# The client library lives in the repository's clients/python/src; an installed
# copy (pip install ./clients/python) is used when there is one.
sys.path.append(os.path.join(HERE, "..", "..", "clients", "python", "src"))

import nats


def prefill_subject(ns: str) -> str:
    """Requests from the frontend to the prefill engines (a queue group)."""
    return f"{ns}.serving.prefill"


def parser(what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=what)
    p.add_argument("--nats", required=True, help="NATS URL")
    p.add_argument("--ns", default="llm", help="the handoff namespace")
    p.add_argument("--id", required=True, help="this process's name (engine ID)")
    p.add_argument("--events", required=True, help="event log path (JSON lines)")
    p.add_argument("--flow", choices=["vllm", "trtllm"], required=True)
    p.add_argument("--mode", choices=["core", "jetstream"], required=True)
    p.add_argument("--bug", default="", help="a deliberate defect, for the checker's tests")
    return p


async def connect(url: str, name: str, reconnected: Callable[[], Awaitable[None]] | None = None) -> nats.NATS:
    # Reconnect for ever, quickly: a nats-server restart is one of the
    # injected faults, and an engine must outlive it.
    options: dict[str, Any] = {}
    if reconnected is not None:
        options["reconnected_cb"] = reconnected
    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                              connect_timeout=2, allow_reconnect=True, **options)


def stop_event() -> asyncio.Event:
    """Set on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
