"""REL-7, PERF-2: the driver's periodic reconciliation sweep looks at a window of recent
history, by index; a starting driver's sweep at all of it. A sweep of every commit and every
finished novel ever written every 2 s would cost more as the database grows."""

from __future__ import annotations

import asyncpg

from novelbus import store
from tests.store.helpers import make_body, novel_file


async def _age(pool: asyncpg.Pool, novel_id: str, hours: float) -> None:
    """Move the novel's finish and commits back in time (as if written `hours` ago)."""
    await pool.execute("UPDATE novels SET finished_at = now() - make_interval(hours => $2::int)"
                       " WHERE novel_id = $1 AND finished_at IS NOT NULL", novel_id, hours)
    await pool.execute("UPDATE commits SET created_at = now() - make_interval(hours => $2::int)"
                       " WHERE novel_id = $1", novel_id, hours)


async def test_periodic_sweep_sees_the_window_and_a_restart_sees_all_history(
    pool: asyncpg.Pool,
) -> None:
    """REL-7"""
    old, recent = [await store.create_novel(pool, novel_file(f"n-{name}")) for name in ("old", "recent")]
    for nid in (old, recent):
        uid = await store.prepare_unit(pool, nid, "ch-a", "s1", fragment=1, continuation_anchor=None)
        claim = await store.claim_unit(pool, nid, uid, "i", mode="subagent")
        await store.commit_body(pool, nid, uid, claim.token, make_body(), run_id="r", context_hash=None)
        assert await store.finish_novel(pool, nid)
    await _age(pool, old, 3)
    # Neither has its novel.finished / unit.committed event: the driver died before each.
    assert await store.finished_without_event(pool) == sorted([old, recent])
    assert await store.finished_without_event(pool, within_s=3600) == [recent]
    assert {m.novel_id for m in await store.commits_without_event(pool, older_than_s=0)} == {old, recent}
    assert {m.novel_id for m in await store.commits_without_event(pool, older_than_s=0, within_s=3600)} == {recent}


async def test_the_sweep_windows_can_be_read_by_index(pool: asyncpg.Pool) -> None:
    """REL-7: The windows are index ranges (migration 011), not scans of the whole history: with
    sequential scans priced out, the planner reads each window through its index."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        commits = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN SELECT c.commit_id FROM commits c WHERE c.created_at > now() - make_interval(secs => 3600)"))
        novels = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN SELECT novel_id FROM novels n WHERE status = 'finished'"
            " AND n.finished_at > now() - make_interval(secs => 3600)"))
    assert "commits_created" in commits, commits
    assert "novels_finished" in novels, novels
