"""INFRA-3: versioned SQL migrations applied under an advisory lock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from novelbus import store
from novelbus.store.pool import migration_files


async def test_infra3_five_concurrent_migrations_apply_each_file_once(
    new_database: Callable[[], Awaitable[str]],
) -> None:
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


def test_infra3_migrations_are_versioned_sql_sorted_by_name() -> None:
    names = [name for name, _ in migration_files()]
    assert names and names == sorted(names)
    assert names[0] == "001_init.sql"
    assert all(name.endswith(".sql") for name in names)


async def test_infra3_migrate_accepts_a_connection(
    new_database: Callable[[], Awaitable[str]],
) -> None:
    pool = await store.connect(await new_database())
    try:
        async with pool.acquire() as conn:
            assert await store.migrate(conn) == [name for name, _ in migration_files()]
        assert await store.migrate(pool) == []
    finally:
        await pool.close()
