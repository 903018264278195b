"""INFRA-1 / INFRA-2 in-process: one code path for embedded and external servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import asyncpg
import nats
import pytest

from novelbus.infra import (
    EmbeddedNats,
    EmbeddedPostgres,
    Infrastructure,
    ServerStartError,
    dsn_with_database,
    free_port,
    redact_url,
)
from novelbus.infra._process import raise_if_cancelled
from novelbus.infra.postgres import socket_dir_fits
from tests.infra.procs import alive, servers_under, wait_gone


async def _jetstream_works(url: str, namespace: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stream = namespace.replace(".", "") + "_S"
        await js.add_stream(name=stream, subjects=[f"{namespace}probe.>"])
        ack = await js.publish(f"{namespace}probe.x", b"1")
        assert ack.stream == stream
        await js.delete_stream(stream)
    finally:
        await nc.close()


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


async def test_embedded_servers_start_answer_and_stop(
    tmp_home: Path, namespace: str
) -> None:
    """INFRA-1"""
    lines: list[str] = []
    async with Infrastructure(home=tmp_home, fast=True, log=lines.append, environ={}) as infra:
        assert infra.embedded == {"nats": True, "postgres": True}
        assert infra.nats_url.startswith("nats://novelbus:") and "@127.0.0.1:" in infra.nats_url  # REL-11
        assert not any(infra.nats_url.split("@")[0].split(":")[-1] in line for line in lines)  # never logged
        assert infra.database_url.startswith("postgresql://postgres:") and "@127.0.0.1:" in infra.database_url
        assert not any(infra.database_url.split("@")[0].split(":")[-1] in line for line in lines)
        assert infra.database_url.endswith("/novelbus")
        assert infra.admin_database_url.endswith("/postgres")
        await _jetstream_works(infra.nats_url, namespace)
        assert await _select_one(infra.database_url) == 1
        pids = list(infra.pids.values())
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert wait_gone(pids, timeout=1) == []
    assert servers_under(tmp_home) == []
    assert any("started embedded nats-server" in line for line in lines)
    assert any("started embedded PostgreSQL" in line for line in lines)
    assert any("stopped embedded PostgreSQL" in line for line in lines)
    assert (tmp_home / "nats" / "jetstream").is_dir() and (tmp_home / "pg" / "data").is_dir()


async def test_cancelled_start_leaves_nothing_and_the_next_start_works(
    tmp_home: Path,
) -> None:
    """INFRA-1: Cancel at several points of start-up (also mid-initdb); then a full start succeeds.

    The points are found by watching start-up, not by fixed delays: a fresh start takes
    0.6-1.1 s here, so a delay could outlast it and cancel nothing."""
    pg = tmp_home / "pg"
    points: list[tuple[str, Callable[[], bool]]] = [
        ("at once", lambda: True),
        ("mid-initdb", lambda: (pg / ".novelbus-initdb-running").exists()),
        ("after initdb, the server starting", lambda: (pg / ".novelbus-initdb-complete").exists()),
    ]
    for point, reached in points:
        infra = Infrastructure(home=tmp_home, fast=True, environ={})
        start = asyncio.create_task(infra.start())
        while not reached():
            assert not start.done(), f"start-up finished before the point {point!r}"
            await asyncio.sleep(0.005)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert infra.pids == {}, point
        left = [p for p in servers_under(tmp_home) if alive(p)]
        assert wait_gone(left, timeout=5) == [], point
    async with Infrastructure(home=tmp_home, fast=True, environ={}) as infra:
        assert await _select_one(infra.database_url) == 1
    assert servers_under(tmp_home) == []


async def test_a_start_whose_cancel_was_swallowed_still_ends_cancelled() -> None:
    """INFRA-1: Python 3.11's nested wait_for can drop a cancel that lands as its inner step finishes;
    a server start checks after its last step, so a cancelled start never returns running."""
    finished_steps: list[str] = []

    async def start_like() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            finished_steps.append("step")  # the swallowed cancel: the step "finished" anyway
        raise_if_cancelled()
        finished_steps.append("returned running")

    task = asyncio.create_task(start_like())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished_steps == ["step"]
    raise_if_cancelled()  # a task nobody cancelled goes on


async def test_an_interrupted_initdb_is_redone_even_when_the_directory_looks_complete(
    tmp_home: Path,
) -> None:
    """INFRA-1: A cancel can land late in initdb: template0/template1 and the "postgres" directory exist
    but the catalog has no "postgres" yet. Such a directory must be initialised again, not
    adopted as a cluster from elsewhere (which then never accepts connections)."""
    data_dir = tmp_home / "pg"
    async with EmbeddedPostgres(data_dir, fast=True) as pg:
        conn = await asyncpg.connect(pg.dsn)  # the "novelbus" database
        try:
            await conn.execute("DROP DATABASE postgres")
        finally:
            await conn.close()
    # What an initdb cancelled at that point leaves: our "running" marker, no "complete" one.
    (data_dir / ".novelbus-initdb-complete").unlink()
    (data_dir / ".novelbus-initdb-running").touch()
    async with EmbeddedPostgres(data_dir, fast=True) as pg:
        assert await _select_one(pg.admin_dsn) == 1
        assert await _select_one(pg.dsn) == 1
    assert (data_dir / ".novelbus-initdb-complete").exists()
    assert not (data_dir / ".novelbus-initdb-running").exists()


async def test_orphaned_postgres_of_a_dead_owner_is_stopped_and_replaced(
    tmp_home: Path,
) -> None:
    """INFRA-1"""
    old = EmbeddedPostgres(tmp_home, fast=True)
    await old.start()
    old_pid = old.pid
    assert old_pid is not None
    # Make it look like its owner was SIGKILLed: the owner file names a process that is gone.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_home / "owner.json").write_text(json.dumps({"pid": dead.pid, "createTime": 0.0}))
    new = EmbeddedPostgres(tmp_home, fast=True)
    try:
        await new.start()
        assert new.pid != old_pid and not alive(old_pid)
        assert await _select_one(new.dsn) == 1
    finally:
        await new.stop()
        old.stop_sync()


async def test_server_in_use_by_a_live_process_is_not_taken_over(tmp_home: Path) -> None:
    """INFRA-1"""
    async with EmbeddedPostgres(tmp_home / "pg", fast=True) as first:
        with pytest.raises(ServerStartError, match="in use by the running process"):
            await EmbeddedPostgres(tmp_home / "pg", fast=True).start()
        assert first.running and await _select_one(first.dsn) == 1
    async with EmbeddedNats(tmp_home / "nats") as first_nats:
        with pytest.raises(ServerStartError, match="in use by the running process"):
            await EmbeddedNats(tmp_home / "nats").start()
        assert first_nats.running


async def test_nats_start_failure_shows_the_server_log(tmp_home: Path) -> None:
    """INFRA-1"""
    config = tmp_home / "broken.conf"
    config.write_text("this is { not a valid config\n")
    server = EmbeddedNats(tmp_home / "nats", config_file=config)
    with pytest.raises(ServerStartError, match="nats-server exited during start-up") as err:
        await server.start()
    assert str(tmp_home / "nats" / "nats-server.log") in str(err.value)
    assert not server.running


def test_a_unix_socket_of_any_port_must_fit_in_107_bytes() -> None:
    """INFRA-1: PostgreSQL refuses a socket path over 107 bytes; the path is the directory plus
    "/.s.PGSQL.<port>" (15 bytes with a five-digit port), counted in bytes."""
    assert socket_dir_fits(Path("/" + "d" * 91))  # 92 + 15 = 107
    assert not socket_dir_fits(Path("/" + "d" * 92))  # 108: a directory ≤ 100 bytes is not enough
    assert not socket_dir_fits(Path("/" + "é" * 46))  # 93 bytes, 47 characters


@pytest.mark.parametrize("run_dir_bytes", [92, 93, 100])
async def test_postgres_starts_under_a_long_home(tmp_home: Path, run_dir_bytes: int) -> None:
    """INFRA-1: A home whose socket directory (`<home>/run`) is 93–100 bytes long (as under
    pytest-xdist's longer temporary paths) would stop PostgreSQL at start-up ("could not create any
    Unix-domain sockets"); such a home gets a short socket directory."""
    pad = run_dir_bytes - len(str(tmp_home / "x" / "run")) + 1
    assert pad > 0
    home = tmp_home / ("h" * pad)
    assert len(str(home / "run")) == run_dir_bytes
    async with EmbeddedPostgres(home, fast=True) as pg:
        assert await _select_one(pg.dsn) == 1
    assert servers_under(tmp_home) == []


async def test_postgres_on_a_busy_fixed_port_fails_with_the_log(tmp_home: Path) -> None:
    """INFRA-1"""
    port = free_port()
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
    try:
        server = EmbeddedPostgres(tmp_home, fast=True, port=port)
        with pytest.raises(ServerStartError, match="(?s)exited during start-up.*could not"):
            await server.start()
        assert not server.running
    finally:
        blocker.close()
        await blocker.wait_closed()


def test_missing_nats_binary_is_a_clear_error(
    tmp_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INFRA-1"""
    monkeypatch.setattr("sys.executable", str(tmp_home / "python"))
    monkeypatch.setenv("PATH", str(tmp_home))
    with pytest.raises(ServerStartError, match="nats-server not found.*NOVELBUS_NATS_URL"):
        asyncio.run(EmbeddedNats(tmp_home).start())


async def test_external_urls_start_nothing(
    infra: Infrastructure, tmp_home: Path, namespace: str
) -> None:
    """INFRA-2"""
    lines: list[str] = []
    external = Infrastructure(
        home=tmp_home / "unused",
        nats_url=infra.nats_url,
        database_url=infra.database_url,
        log=lines.append,
        environ={},
    )
    async with external:
        assert external.embedded == {"nats": False, "postgres": False}
        assert external.pids == {}
        assert (external.nats_url, external.database_url) == (infra.nats_url, infra.database_url)
        await _jetstream_works(external.nats_url, namespace)
        assert await _select_one(external.database_url) == 1
    assert not (tmp_home / "unused").exists()
    assert lines == [f"using NATS at {redact_url(infra.nats_url)}", f"using PostgreSQL at {redact_url(infra.database_url)}"]
    assert await _select_one(infra.database_url) == 1  # the external servers still run


async def test_environment_variables_select_external_servers(
    infra: Infrastructure, tmp_home: Path
) -> None:
    """INFRA-2"""
    env = {
        "NOVELBUS_NATS_URL": infra.nats_url,
        "NOVELBUS_DATABASE_URL": infra.database_url,
        "NOVELBUS_HOME": str(tmp_home / "from-env"),
    }
    async with Infrastructure(environ=env) as external:
        assert external.embedded == {"nats": False, "postgres": False}
        assert external.nats_url == infra.nats_url
        assert external.database_url == infra.database_url
        assert external.home == tmp_home / "from-env"
    explicit = Infrastructure(nats_url=infra.nats_url, environ={**env, "NOVELBUS_NATS_URL": "x"})
    async with explicit:  # an argument beats the environment
        assert explicit.nats_url == infra.nats_url


async def test_one_external_one_embedded(infra: Infrastructure, tmp_home: Path) -> None:
    """INFRA-2"""
    async with Infrastructure(
        home=tmp_home, nats_url=infra.nats_url, fast=True, environ={}
    ) as mixed:
        assert mixed.embedded == {"nats": False, "postgres": True}
        assert set(mixed.pids) == {"postgres"}
        assert mixed.nats_url == infra.nats_url
        assert mixed.database_url != infra.database_url
        assert await _select_one(mixed.database_url) == 1
        pg_pid = mixed.pids["postgres"]
    assert wait_gone([pg_pid], timeout=1) == []
    assert not (tmp_home / "nats").exists()


async def test_session_fixtures_give_fresh_databases(
    new_database: object, pg_admin_dsn: str, nats_url: str
) -> None:
    assert callable(new_database)
    first, second = await new_database(), await new_database()
    assert first != second
    conn = await asyncpg.connect(first)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        )
        assert tables == 0
    finally:
        await conn.close()
    assert dsn_with_database(pg_admin_dsn, "x").endswith("/x")
    assert nats_url.startswith("nats://")


def test_redact_url_hides_passwords() -> None:
    assert redact_url("postgresql://app:s3cret@db:5432/novelbus") == (
        "postgresql://app:***@db:5432/novelbus"
    )
    assert redact_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert "s3cret" not in redact_url("nats://u:s3cret@h")
