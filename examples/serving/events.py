"""Event logs: one JSON object per line, one file per process.

Each line is written with a single write(2) on a file opened O_APPEND, so a
process killed with SIGKILL leaves every event it logged before, and at
worst a last line cut short (the checker skips it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def now_ms() -> float:
    return time.time() * 1000.0


class EventLog:
    def __init__(self, path: str, proc: str) -> None:
        self.proc = proc
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, ev: str, **fields: Any) -> None:
        fields["t"] = round(now_ms(), 3)
        fields["ev"] = ev
        fields["proc"] = self.proc
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def read(path: str) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the last line of a killed process
    return out
