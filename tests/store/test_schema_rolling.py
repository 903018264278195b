"""OPS-10: the rolling-upgrade rule, with real actors. Actors that know schema version N (this
package's migrations) run against a database a newer release took to N + 1 when that migration
is additive, and write a novel to its end; when it is not, they refuse to start and say so, in
process and as a `novelbus actor` process."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.store.schema import SchemaTooNew, packaged_migrations, parse_migration
from tests.store.helpers import novel_file
from tests.waiting import drive

REPO = Path(__file__).resolve().parents[2]
# What a newer release might add without breaking older processes: a table, nullable columns.
ADDITIVE = """-- upgrade: additive
CREATE TABLE IF NOT EXISTS rolling_notes (novel_id text REFERENCES novels (novel_id), note text);
ALTER TABLE novels ADD COLUMN IF NOT EXISTS rolling_label text;
ALTER TABLE units ADD COLUMN IF NOT EXISTS rolling_hint text;
"""
# And what breaks them: a column they read is renamed.
BREAKING = """-- upgrade: breaking
ALTER TABLE units RENAME COLUMN last_error TO last_failure;
"""


async def database_at_next_version(new_database: Callable[[], Awaitable[str]], sql: str) -> tuple[str, str]:
    """A database migrated by this package's migrations and one more, as a newer release would
    leave it; its DSN and the extra migration's name."""
    known = packaged_migrations()
    kind = "additive" if "additive" in sql.splitlines()[0] else "breaking"
    extra = parse_migration(f"{known[-1].version + 1:03d}_rolling_{kind}.sql", sql)
    dsn = await new_database()
    pool = await store.connect(dsn, max_size=2)
    try:
        assert await store.migrate(pool, known=[*known, extra])
    finally:
        await pool.close()
    return dsn, extra.name


async def test_actors_that_know_n_write_a_novel_against_a_database_at_n_plus_one_additive(
        nats_url: str, new_database: Callable[[], Awaitable[str]], namespace: str) -> None:
    """OPS-10"""
    dsn, name = await database_at_next_version(new_database, ADDITIVE)
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        driven = await drive(rt, novel_file(), timeout=90)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        counts = await store.count_commits_per_unit(rt.ctx.pool, driven.novel_id)
        assert counts and set(counts.values()) == {1}  # one commit per unit
        held = {r["name"] for r in await rt.ctx.pool.fetch("SELECT name FROM schema_migrations")}
        assert name in held  # the newer migration is still there, nothing undone


async def test_actors_that_know_n_refuse_a_database_at_n_plus_one_breaking(
        nats_url: str, new_database: Callable[[], Awaitable[str]], namespace: str) -> None:
    """OPS-10: in process, and as a process: exit 1, one message naming the migration."""
    dsn, name = await database_at_next_version(new_database, BREAKING)
    with pytest.raises(SchemaTooNew, match=rf"{name} is not additive, so it may not run against it"):
        async with running(nats_url, dsn, subjects=Subjects(namespace)):
            pytest.fail("the actors started")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", "actor", "driver", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "NOVELBUS_NATS_URL": nats_url,
             "NOVELBUS_DATABASE_URL": dsn})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err.decode()
    said = err.decode()
    assert "database schema: the database's schema is newer than this process knows" in said, said
    assert f"{name} is not additive" in said and "Traceback" not in said and b"ready" not in out
