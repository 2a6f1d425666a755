"""Fixtures: one set of servers per test session (tests/harness.py), and
async test functions run on a fresh event loop each, bounded in time: a test
that hangs fails instead of holding CI."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator

import pytest
from harness import Cluster, Etcd, Nats, Worker, debian_nats, jetstream_nats

# A test that runs longer than this failed: every wait in the tests is a
# bounded wait for a state, so only a hang reaches it.
TEST_TIMEOUT_S = 90.0


# --- async tests ------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIMEOUT_S))
    return True


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = Cluster()
    yield c
    failed = request.session.testsfailed > 0
    c.close(keep=failed or os.environ.get("PYTEST_KEEP_LOGS") == "1")


@pytest.fixture(scope="session")
def nats_server(cluster: Cluster) -> Nats:
    """Debian's nats-server 2.9.10, with JetStream on (the core-mode tests do
    not use it)."""
    return cluster.nats(debian_nats())


@pytest.fixture(scope="session")
def js_nats_server(cluster: Cluster) -> Nats:
    return cluster.nats(jetstream_nats())


@pytest.fixture(scope="session")
def etcd(cluster: Cluster) -> Etcd:
    return cluster.etcd()


@pytest.fixture(scope="session")
def core_worker(cluster: Cluster, nats_server: Nats, etcd: Etcd) -> Worker:
    """A core-mode worker in the default namespace `llm`, default settings."""
    return cluster.worker(nats_server, etcd, "llm")


@pytest.fixture
def js_worker(cluster: Cluster, js_nats_server: Nats, etcd: Etcd) -> Iterator[Worker]:
    """A JetStream-mode worker on the second nats-server, in a namespace of its
    own: its GEN stream holds only this test's decode jobs."""
    namespace = f"js{len(cluster.workers)}"
    worker = cluster.worker(js_nats_server, etcd, namespace, "jetstream")
    yield worker
    worker.stop()
