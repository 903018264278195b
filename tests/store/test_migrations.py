"""INFRA-3: versioned SQL migrations applied under an advisory lock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from novelbus import store
from novelbus.store.pool import migration_files


async def test_five_concurrent_migrations_apply_each_file_once(
    new_database: Callable[[], Awaitable[str]],
) -> None:
    """INFRA-3"""
    dsn = await new_database()
    pools = [await store.connect(dsn, max_size=2) for _ in range(5)]
    try:
        results = await asyncio.gather(*(store.migrate(p) for p in pools))
        names = [name for name, _ in migration_files()]
        assert sorted(results, key=len, reverse=True)[0] == names
        assert sum(len(r) for r in results) == len(names)  # each file applied by exactly one
        rows = await pools[0].fetch("SELECT name FROM schema_migrations ORDER BY name")
        assert [r["name"] for r in rows] == names
        assert await store.migrate(pools[0]) == []  # nothing pending afterwards
        assert await pools[0].fetchval("SELECT count(*) FROM novels") == 0
    finally:
        await asyncio.gather(*(p.close() for p in pools))


def test_migrations_are_versioned_sql_sorted_by_name() -> None:
    """INFRA-3"""
    names = [name for name, _ in migration_files()]
    assert names and names == sorted(names)
    assert names[0] == "018_baseline.sql"  # HOUSE-8: the baseline comes first
    assert all(name.endswith(".sql") for name in names)


async def test_migrate_accepts_a_connection(
    new_database: Callable[[], Awaitable[str]],
) -> None:
    """INFRA-3"""
    pool = await store.connect(await new_database())
    try:
        async with pool.acquire() as conn:
            assert await store.migrate(conn) == [name for name, _ in migration_files()]
        assert await store.migrate(pool) == []
    finally:
        await pool.close()


async def test_the_restart_read_of_recent_once_events_has_an_index(pool: asyncpg.Pool) -> None:
    """REL-7, PERF-2: `store.recent_once_events` (a restarted claim manager's first read) can be
    served by migration 010's partial index — its predicate matches the query's, so a large ledger
    is not scanned whole at every start (planner told to avoid a sequential scan if it can)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) SELECT seq, novel_id, type, payload, created_at FROM events"
            " WHERE type = $1 AND once_key IS NOT NULL AND created_at > now() - make_interval(secs => $2)"
            " ORDER BY seq", "unit.committed", 60.0)
    assert "events_once_recent" in str(plan), plan
