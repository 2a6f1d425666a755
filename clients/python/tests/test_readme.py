"""The README's examples, run as they are written (only the server URL is
changed), against a real worker: each side in its own Python process."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from harness import Worker, until

from prefill_handoff import HandoffClient
from prefill_handoff.engines import sglang

README = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_URL = "nats://127.0.0.1:4222"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


class Example:
    """One README example as a running Python process."""

    def __init__(self, code: str, url: str) -> None:
        assert DEFAULT_URL in code, "every example connects to the default URL"
        self.code = code.replace(DEFAULT_URL, url)
        self.lines: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> Example:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            self.code,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode().rstrip("\n"))

    def printed(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in self.lines)

    async def wait_for(self, pattern: str) -> None:
        ok = await until(lambda: self.printed(pattern) or self.exited(), timeout=30)
        assert ok and self.printed(pattern), f"{pattern!r} not printed:\n" + "\n".join(self.lines)

    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def finish(self) -> int:
        assert self.proc is not None and self._reader is not None
        code = await asyncio.wait_for(self.proc.wait(), 60)
        await self._reader
        return code

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


async def test_the_readme_examples_run(core_worker: Worker) -> None:
    prefill_trt, decode, vllm_sglang, releases, cancel = examples()
    url = core_worker.nats.url
    decoder = await Example(decode, url).start()
    listener = await Example(releases, url).start()
    try:
        await decoder.wait_for("decode side ready")
        await listener.wait_for("listening for release notices")

        # TensorRT-LLM: minted ID, handed off, decoded, answered.
        prefill = await Example(prefill_trt, url).start()
        assert await prefill.finish() == 0, "\n".join(prefill.lines)
        assert prefill.lines[-1] == "answer:  there", prefill.lines
        await decoder.wait_for(r"^req-1 trtllm \[.*'disagg_request_id'.*'opaque_state'")

        # vLLM (grouped block IDs) and SGLang (default bootstrap port).
        both = await Example(vllm_sglang, url).start()
        assert await both.finish() == 0, "\n".join(both.lines)
        assert len([line for line in both.lines if "Terminal(" in line]) == 2, both.lines
        await decoder.wait_for(r"^req-vllm vllm \[.*'remote_block_ids'")
        await decoder.wait_for(r"^req-sgl sglang \['bootstrap_host', 'bootstrap_port'")

        # A cancel, then the request's result: cancelled, and its KV released.
        recorded = 'handoff_cancels_total{event="recorded"}'
        before = core_worker.metric(recorded)
        canceller = await Example(cancel, url).start()
        assert await canceller.finish() == 0, "\n".join(canceller.lines)
        assert await until(lambda: core_worker.metric(recorded) > before)
        async with await HandoffClient.connect(url) as client:
            await client.publish_result("req-2", [sglang.bootstrap_frame("10.0.0.7", 8998, 5)])
            reply = await client.await_reply("req-2", timeout=20)
        assert getattr(reply, "code", None) == "cancelled"
        await listener.wait_for(r"^release req-2 cancelled sglang$")
    finally:
        await decoder.stop()
        await listener.stop()
