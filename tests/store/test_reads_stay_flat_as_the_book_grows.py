"""PERF-2 (migration 013): what a unit's statements read does not grow with the book.

Each commit carries its running total of characters and its paragraph count, so the commit, the
verifier's receipt, the reconciliation sweep and the context read never sum earlier commits or
read their prose; the units written since a snapshot are a range of the `units_written` index,
so the four snapshot reads do not visit every unit of the novel.
"""

from __future__ import annotations

import re

import asyncpg

from novelbus import store
from novelbus.store.commit_index import NOVEL_MARK_SQL
from novelbus.store.snapshots import unit_rows_json
from tests.store.helpers import make_body, novel_file

# (chapter, scene, paragraphs) of three units, committed in this order.
UNITS = [("ch-a", "s1", ["Mira arrived.", "她点亮了灯。"]), ("ch-a", "s2", ["The letter."]),
         ("ch-b", "s3", ["Storm.", "Rain.", "雷声。"])]


async def _write(pool: asyncpg.Pool, novel_id: str) -> None:
    for chapter, scene, paragraphs in UNITS:
        uid = await store.prepare_unit(pool, novel_id, chapter, scene, fragment=1, continuation_anchor=None)
        claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
        await store.commit_body(pool, novel_id, uid, claim.token, make_body(*paragraphs), run_id="r",
                                context_hash=None)


async def _sums(pool: asyncpg.Pool, novel_id: str) -> list[tuple[int, int, int, int, int]]:
    """(seq, stored total, summed total, stored paragraph count, counted paragraphs) per commit."""
    rows = await pool.fetch(
        "SELECT seq, total_chars, SUM(effective_chars) OVER (ORDER BY seq) AS summed,"
        " paragraph_count, jsonb_array_length(body -> 'paragraphs') AS counted"
        " FROM commits WHERE novel_id = $1 ORDER BY seq", novel_id)
    return [tuple(int(v) for v in r.values()) for r in rows]


async def test_a_commit_carries_the_books_running_total_and_its_paragraph_count(
    pool: asyncpg.Pool,
) -> None:
    """PERF-2"""
    a, b = [await store.create_novel(pool, novel_file(f"n-flat-{x}")) for x in "ab"]
    await _write(pool, a)
    await _write(pool, b)  # another novel's commits never enter a's totals
    rows = await _sums(pool, a)
    assert [r[0] for r in rows] == [1, 2, 3]
    assert all(stored == summed and pc == counted for _, stored, summed, pc, counted in rows), rows
    assert [r[3] for r in rows] == [2, 1, 3]
    # What reads them: the verifier's commit, the receipt of a repeated commit, the check's counts.
    for commit, (_, stored, *_rest) in zip(await store.list_commits(pool, a), rows, strict=True):
        assert commit.total_chars == stored
    last = await store.get_commit_for_unit(pool, a, (await store.list_commits(pool, a))[-1].unit_id)
    assert last is not None and last.total_chars == rows[-1][1]
    assert await store.commit_paragraph_counts(pool, a) == {"commit-1": 2, "commit-2": 1, "commit-3": 3}
    # A body changed afterwards (as some tests do to plant prose) keeps its count in step.
    await pool.execute("UPDATE commits SET body = jsonb_set(body, '{paragraphs}', '[\"x\"]'::jsonb)"
                       " WHERE novel_id = $1 AND seq = 1", a)
    assert (await _sums(pool, a))[0][3:] == (1, 1)


async def test_units_written_since_a_snapshot_are_an_index_range(pool: asyncpg.Pool) -> None:
    """PERF-2: The read of the units written since the caller's snapshot can use `units_written`: its
    range condition is one the planner can put on the index (with sequential scans priced out,
    it does), so it does not visit every unit of the book."""
    nid = await store.create_novel(pool, novel_file("n-flat-units"))
    await _write(pool, nid)
    # A long book: 2,000 more units (the planner prices a visit of them all by the statistics).
    await pool.execute("INSERT INTO units (novel_id, unit_id, chapter_id, scene_id, fragment, state)"
                       " SELECT $1, 'u-bulk-' || i, 'ch-b', 's3', i + 1, 'committed'"
                       " FROM generate_series(1, 2000) i", nid)
    await pool.execute("ANALYZE units")
    snapshot, mark = await pool.fetchrow(
        f"SELECT pg_current_snapshot()::text, {NOVEL_MARK_SQL} FROM novels n WHERE n.novel_id = $1", nid)
    sql = f"SELECT {unit_rows_json('$2::text', '$3::text')} FROM novels n WHERE n.novel_id = $1"
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {sql}", nid, snapshot, mark))
        assert re.search(r"(Index Scan using|Bitmap Index Scan on) units_written.*\n\s*Index Cond: .*written_xid >= s\.since",
                         plan), plan
        # The bound is computed once per read: no row evaluates the snapshot check again.
        assert not re.search(r"(Filter|Cond): .*(pg_snapshot_xip|SubPlan|InitPlan)", plan), plan
        # And it reads what it should: nothing written since, then the one unit written since.
        assert await conn.fetchval(sql, nid, snapshot, mark) == []
    uid = await store.prepare_unit(pool, nid, "ch-a", "s1", fragment=2, continuation_anchor=None)
    rows = await pool.fetchval(sql, nid, snapshot, mark)
    assert [r[1]["unit_id"] for r in rows] == [uid]
