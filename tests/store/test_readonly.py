"""INFRA-4, TOOL-5: read tools and context assembly read through read-only transactions."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.store._db import transaction


async def test_read_only_transactions_refuse_writes(new_database: Any) -> None:
    """INFRA-4"""
    pool = await store.connect(await new_database())
    try:
        await store.migrate(pool)
        async with transaction(pool, isolation="repeatable_read", readonly=True) as conn:
            assert await conn.fetchval("SELECT current_setting('transaction_read_only')") == "on"
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                await conn.execute("INSERT INTO processed_messages (message_id) VALUES ('x')")
        assert await pool.fetchval("SELECT count(*) FROM processed_messages") == 0
    finally:
        await pool.close()
