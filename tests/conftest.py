"""Real servers for the whole suite: one NATS with JetStream and one PostgreSQL per session.

Embedded (INFRA-1, fast mode) under a temporary directory by default; existing servers when
``NOVELBUS_TEST_NATS_URL`` / ``NOVELBUS_TEST_DATABASE_URL`` are set (INFRA-2). Tests isolate
themselves with a fresh database (``await new_database()``) and a subject ``namespace``.

At the end of the session no ``nats-server`` or ``postgres`` this session started may still
run; survivors are killed and fail the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest
import pytest_asyncio

from novelbus.infra import Infrastructure, dsn_with_database

ENV_TEST_NATS_URL = "NOVELBUS_TEST_NATS_URL"
ENV_TEST_DATABASE_URL = "NOVELBUS_TEST_DATABASE_URL"
SERVER_NAMES = ("nats-server", "postgres")


class ServerTracker:
    """Server processes and data directories this session created, to check none survives."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self._pids: dict[int, float] = {}

    def home(self, name: str) -> Path:
        """A fresh data directory for embedded servers."""
        if self.root is None:
            # Outside pytest's tmp root: that one is 0700 and re-tightened by every new pytest
            # run, which would lock the unprivileged postgres user out of its data directory.
            self.root = Path(tempfile.mkdtemp(prefix=f"novelbus-test-{os.getpid()}-"))
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))

    def add_pid(self, pid: int) -> None:
        try:
            self._pids[pid] = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            pass

    def survivors(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid, created in self._pids.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    found[pid] = proc
            except psutil.NoSuchProcess:
                pass
        if self.root is not None:
            marker = str(self.root)
            for proc in psutil.process_iter(["name", "cmdline"]):
                if proc.info["name"] in SERVER_NAMES and any(
                    marker in arg for arg in proc.info["cmdline"] or ()
                ):
                    found[proc.pid] = proc
        return list(found.values())

    def cleanup(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


_tracker = ServerTracker()


@pytest.fixture(scope="session")
def server_tracker() -> ServerTracker:
    return _tracker


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def infra(server_tracker: ServerTracker) -> AsyncIterator[Infrastructure]:
    """The session's NATS and PostgreSQL (embedded, or external via NOVELBUS_TEST_*_URL)."""
    async with Infrastructure(
        home=server_tracker.home("session"),
        nats_url=os.environ.get(ENV_TEST_NATS_URL) or None,
        database_url=os.environ.get(ENV_TEST_DATABASE_URL) or None,
        fast=True,
        environ={},  # the app's NOVELBUS_* variables must not leak into the suite
    ) as servers:
        for pid in servers.pids.values():
            server_tracker.add_pid(pid)
        yield servers


@pytest.fixture(scope="session", autouse=True)
def count_store_round_trips() -> Iterator[None]:
    """PERF-1: the store's round trips are counted in `bus.tally` for every test, as the
    benchmark counts them (the store itself counts nothing unless a hook is installed)."""
    from novelbus import store
    from novelbus.bus import tally

    store.set_round_trip_hook(tally)
    yield
    store.set_round_trip_hook(None)


@pytest.fixture(scope="session")
def nats_url(infra: Infrastructure) -> str:
    return infra.nats_url


@pytest.fixture(scope="session")
def pg_admin_dsn(infra: Infrastructure) -> str:
    """A DSN allowed to CREATE and DROP databases."""
    return infra.admin_database_url


@pytest_asyncio.fixture(loop_scope="session")
async def new_database(pg_admin_dsn: str) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """``await new_database()`` -> DSN of a brand-new empty database, dropped after the test."""
    created: list[str] = []

    async def create() -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        created.append(name)
        return dsn_with_database(pg_admin_dsn, name)

    yield create
    if created:
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            for name in created:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@pytest.fixture
def namespace() -> str:
    """A subject prefix private to this test, e.g. ``t5f3a9c01.``."""
    return f"t{uuid.uuid4().hex[:8]}."


@pytest.fixture
def tmp_home(server_tracker: ServerTracker) -> Iterator[Path]:
    """A data directory for servers a test starts itself (reachable by the postgres user)."""
    home = server_tracker.home("test")
    yield home
    shutil.rmtree(home, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """INFRA-1: nothing this session started outlives it."""
    deadline = time.monotonic() + 10
    survivors = _tracker.survivors()
    while survivors and time.monotonic() < deadline:
        time.sleep(0.1)
        survivors = _tracker.survivors()
    if survivors:
        lines = []
        for proc in survivors:
            try:
                lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())}")
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        if lines:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = "server processes survived the test session (killed now):\n" + "\n".join(
                lines
            )
            if reporter is not None:
                reporter.write_line(message, red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _tracker.cleanup()
