"""INFRA-1: embedded servers live and die with the process that started them.

Each test runs ``python -m infra`` (an Infrastructure under a fresh home) in a child process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import nats
import psutil
import pytest

from tests.infra.procs import (
    InfraProcess,
    alive,
    servers_under,
    set_child_subreaper,
    wait_gone,
)

if TYPE_CHECKING:
    from tests.conftest import ServerTracker


@pytest.fixture
def start_infra(
    tmp_home: Path, server_tracker: ServerTracker
) -> Iterator[Callable[[], InfraProcess]]:
    """Start ``python -m infra`` over ``tmp_home``; whatever still runs is stopped after."""
    started: list[InfraProcess] = []

    def start() -> InfraProcess:
        p = InfraProcess(tmp_home)
        started.append(p)
        server_tracker.add_pid(p.proc.pid)
        for pid in p.pids.values():
            server_tracker.add_pid(pid)
        return p

    set_child_subreaper(True)
    try:
        yield start
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.signal(signal.SIGTERM)
                p.wait()
        set_child_subreaper(False)


def _server_pids(p: InfraProcess) -> list[int]:
    """The two servers plus PostgreSQL's own worker processes."""
    pids = list(p.pids.values())
    return pids + [c.pid for c in psutil.Process(p.pids["postgres"]).children()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_both_servers_and_leaves_no_orphans(
    sig: signal.Signals,
    tmp_home: Path,
    start_infra: Callable[[], InfraProcess],
) -> None:
    """INFRA-1"""
    p = start_infra()
    assert p.ready["embedded"] == {"nats": True, "postgres": True}
    assert all(alive(pid) for pid in p.pids.values())
    pids = _server_pids(p)

    p.signal(sig)
    assert p.wait(timeout=20) == 0
    assert wait_gone(pids, timeout=2) == []
    assert servers_under(tmp_home) == []
    log = p.stderr_path.read_text()
    assert "stopped embedded PostgreSQL" in log and "stopped embedded nats-server" in log
    assert not (tmp_home / "pg" / "data" / "postmaster.pid").exists()  # clean shutdown


def test_sigkill_of_parent_takes_servers_down_via_pdeathsig(
    tmp_home: Path, start_infra: Callable[[], InfraProcess]
) -> None:
    """INFRA-1"""
    p = start_infra()
    pids = _server_pids(p)

    p.signal(signal.SIGKILL)  # no cleanup code runs: only the kernel's parent-death signal
    p.wait()
    assert wait_gone(pids, timeout=10) == []
    assert servers_under(tmp_home) == []


async def test_restart_after_sigkill_reuses_home_and_keeps_data(
    tmp_home: Path, start_infra: Callable[[], InfraProcess]
) -> None:
    """INFRA-1"""
    first = start_infra()
    pids = _server_pids(first)
    conn = await asyncpg.connect(first.ready["databaseUrl"])
    try:
        await conn.execute("SET synchronous_commit = on")  # fast mode: make this one durable
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('survives')")
    finally:
        await conn.close()
    nc = await nats.connect(first.ready["natsUrl"])
    try:
        js = nc.jetstream()
        await js.add_stream(name="KEPT", subjects=["kept.>"])
    finally:
        await nc.close()

    # Kill everything hard, servers first: stale postmaster.pid and nats-server.pid remain.
    for pid in (first.pids["postgres"], first.pids["nats"], first.proc.pid):
        psutil.Process(pid).kill()
    first.wait()
    assert wait_gone(pids, timeout=10) == []
    assert (tmp_home / "pg" / "data" / "postmaster.pid").exists()
    assert (tmp_home / "nats" / "nats-server.pid").exists()

    second = start_infra()
    conn = await asyncpg.connect(second.ready["databaseUrl"])
    try:
        assert await conn.fetchval("SELECT v FROM kept") == "survives"
    finally:
        await conn.close()
    nc = await nats.connect(second.ready["natsUrl"])
    try:
        info = await nc.jetstream().stream_info("KEPT")
        assert info.config.subjects == ["kept.>"]
    finally:
        await nc.close()
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    assert servers_under(tmp_home) == []


ATEXIT_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from novelbus.infra import Infrastructure

async def main():
    infra = Infrastructure(home=Path(sys.argv[1]), fast=True, environ={})
    await infra.start()  # never stopped: only the atexit backstop is left
    print(json.dumps(infra.pids), flush=True)

asyncio.run(main())
"""


def test_atexit_backstop_stops_servers_left_running(tmp_home: Path) -> None:
    """INFRA-1"""
    pids: dict[str, int] = {}
    set_child_subreaper(True)
    try:
        done = subprocess.run(
            [sys.executable, "-c", ATEXIT_SCRIPT, str(tmp_home)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        pids = json.loads(done.stdout)
        assert set(pids) == {"nats", "postgres"}
        # Stopped and reaped before the interpreter exited, not later by PDEATHSIG.
        assert [pid for pid in pids.values() if alive(pid)] == []
        assert not (tmp_home / "pg" / "data" / "postmaster.pid").exists()
    finally:
        wait_gone(list(pids.values()), timeout=10)
        set_child_subreaper(False)
