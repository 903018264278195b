"""OPS-11: events-table retention — a novel's own retention, else the deployment's `--days`,
else kept; the prune writes its receipt, and the ledger still refuses every other delete."""

from __future__ import annotations

import asyncpg
import pytest

from novelbus import store
from novelbus.store import retention
from tests.store.helpers import novel_file


async def _event(pool: asyncpg.Pool, novel_id: str, days_old: int) -> int:
    seq: int = await pool.fetchval(
        "INSERT INTO events (novel_id, type, created_at) VALUES ($1, 'test.aged', now() - make_interval(days => $2))"
        " RETURNING seq", novel_id, days_old)
    return seq


async def _left(pool: asyncpg.Pool) -> set[int]:
    return {r["seq"] for r in await pool.fetch("SELECT seq FROM events WHERE type = 'test.aged'")}


async def test_prune_keeps_each_novels_events_its_own_days_else_the_deployments(pool: asyncpg.Pool) -> None:
    """OPS-11: novel a keeps 5 days, novel b the deployment's 100: a's 10-day-old event goes, b's
    stays, b's 200-day-old goes; without --days only a's retention prunes; a receipt per prune."""
    a = await store.create_novel(pool, novel_file().model_copy(update={"novelId": "n-a"}))
    b = await store.create_novel(pool, novel_file().model_copy(update={"novelId": "n-b"}))
    await retention.set_events_retention(pool, a, 5)
    a_new, a_old = await _event(pool, a, 1), await _event(pool, a, 10)
    b_mid, b_old = await _event(pool, b, 10), await _event(pool, b, 200)
    assert await _left(pool) == {a_new, a_old, b_mid, b_old}
    assert await retention.prune_events(pool, default_days=None) == 1
    assert await _left(pool) == {a_new, b_mid, b_old}
    assert await retention.prune_events(pool, default_days=100) == 1
    assert await _left(pool) == {a_new, b_mid}
    receipts = await pool.fetch("SELECT kind, receipt FROM ledger_deletions ORDER BY deletion_id")
    assert [(r["kind"], r["receipt"]["events"]) for r in receipts] == [("events-retention", 1)] * 2
    with pytest.raises(asyncpg.RestrictViolationError):
        await pool.execute("DELETE FROM events WHERE seq = $1", a_new)
    with pytest.raises(store.NovelNotFound):
        await retention.set_events_retention(pool, "n-none", 3)
