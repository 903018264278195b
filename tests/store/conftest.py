"""Store test fixtures: every test gets its own fresh, migrated PostgreSQL database.

`new_database` (and the embedded server behind it) comes from tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from novelbus import store
from tests.store.helpers import novel_file


@pytest.fixture
async def dsn(new_database: Callable[[], Awaitable[str]]) -> str:
    """A fresh database of this test: `pool` and `read_pool` connect to it."""
    return await new_database()


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await store.connect(dsn, max_size=25)
    await store.migrate(p)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def read_pool(dsn: str, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """INFRA-4: read-only connections to the same (migrated) database as `pool`."""
    p = await store.connect_read_only(dsn, max_size=2)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def novel_id(pool: asyncpg.Pool) -> str:
    return await store.create_novel(pool, novel_file())


@pytest.fixture
async def unit_id(pool: asyncpg.Pool, novel_id: str) -> str:
    return await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None
    )
