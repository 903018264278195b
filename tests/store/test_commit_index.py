"""Issue 14: snapshots read only the commits after those the process knows (`store.commit_index`).

The driver's structural snapshot, its accounting snapshot, the read tools' snapshot and the
context index each carried every commit with its canon facts, per unit: a unit cost more the
longer the book. They now send the last commit seq the process knows and its mark, and the
statement returns only the commits after it — or all of them when the commit at that seq is not
the one the process knew (another database behind the same novel id, a snapshot older than what
is known). Checked here against whole reads on real PostgreSQL, commit by commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import msgspec
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.store import snapshots
from novelbus.store.commit_index import CACHE, Known
from tests.store.helpers import NOVEL_ID, make_body, novel_file
from tests.store.test_snapshot_decode import reference_context_index, reference_snapshot

SCENES = [("ch-a", "s1"), ("ch-a", "s2"), ("ch-b", "s3")]


async def write_unit(pool: asyncpg.Pool, novel_id: str, n: int, summary: str = "fact") -> str:
    chapter, scene = SCENES[n % 3]
    uid = await store.prepare_unit(pool, novel_id, chapter, scene, fragment=n // 3 + 1,
                                   continuation_anchor=None if n < 3 else "on")
    claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
    canon = [CanonChange(kind="event", summary=f"{summary} {n}", sources=["inline#0"], character_ids=["mira"])]
    body = make_body(f"Paragraph {n} of {summary}.", completed=False, canon=canon, next_anchor="on")
    await store.commit_body(pool, novel_id, uid, claim.token, body, run_id="r", context_hash=None)
    return uid


def structure(s: NovelSnapshot) -> NovelSnapshot:
    return msgspec.structs.replace(s, commits=[msgspec.structs.replace(c, paragraphs=[]) for c in s.commits])


async def test_issue14_snapshots_after_the_known_commits_equal_whole_reads_commit_by_commit(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """ARCH-3, CTX-4, TOOL-5: as the book grows, every incremental read equals the whole read —
    the driver's snapshot (alone and with the accounting), the read tools' (its chapter's prose
    beside it), the context index at every asOf — and it really read only the new commits."""
    CACHE.clear()
    for n in range(6):
        uid = await write_unit(pool, novel_id, n)
        whole = await reference_snapshot(pool, novel_id)
        before = CACHE.partial_reads
        assert await store.load_snapshot(pool, novel_id, prose=False) == structure(whole)
        _, _, after = await store.account_turn_and_snapshot(pool, novel_id, f"turn-{n}", outcome="committed",
                                                            writer_output_chars=10)
        assert after == structure(whole)
        tools, held = await store.load_tool_snapshot(read_pool, novel_id, uid)
        chapter = SCENES[n % 3][0]
        assert held == {c.commit_id for c in whole.commits if c.chapter_id == chapter}
        assert tools == msgspec.structs.replace(whole, commits=[
            c if c.commit_id in held else msgspec.structs.replace(c, paragraphs=[]) for c in whole.commits])
        for as_of in range(n + 2):  # n + 1 commits: every asOf, and the context index's own
            sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=uid, scenario="generation",
                                                       purpose="production", profile="bounded", as_of=min(as_of, n))
            assert sources.index.commits == (await reference_context_index(pool, novel_id, min(as_of, n)))[0]
        if n:  # after the first read, each read asked only for what came after the known commits
            assert CACHE.partial_reads - before >= 3 + n + 2
    assert CACHE.known(novel_id).after == 6


async def test_issue14_the_statement_returns_only_the_commits_after_the_known_mark(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """The read really is incremental: told the 3rd commit's mark, the statement sends commits 4
    and 5 only; told a stale mark (or one of another database), it sends all five."""
    for n in range(5):
        await write_unit(pool, novel_id, n)
    marks = await pool.fetch(f"SELECT seq, {snapshots.MARK_SQL.format(t='t')} AS mark FROM commits t"
                             " WHERE novel_id = $1 ORDER BY seq", novel_id)
    for known, mark, expected, after in [(3, marks[2]["mark"], [4, 5], 3), (3, "0:stale", [1, 2, 3, 4, 5], 0),
                                         (0, None, [1, 2, 3, 4, 5], 0), (9, marks[2]["mark"], [1, 2, 3, 4, 5], 0)]:
        text = await pool.fetchval("SELECT snap FROM (" + snapshots._SNAPSHOT_STRUCTURE + ") s",
                                   novel_id, (1 << 31) - 1, known, mark)
        row = snapshots.decode_snapshot_row(text)
        assert ([c.seq for c in row.commits], row.commits_after) == (expected, after)
        assert row.mark == marks[4]["mark"]


async def test_issue14_a_known_index_of_another_database_is_never_served(
    new_database: Callable[[], Awaitable[str]],
) -> None:
    """The same novel id in two databases (as a restored backup, or tests, have it), each with as
    many commits: what this process knew of one is never mixed into a read of the other."""
    CACHE.clear()
    pools = []
    try:
        for summary in ("first", "second"):
            p = await store.connect(await new_database(), max_size=4)
            await store.migrate(p)
            pools.append(p)
            assert await store.create_novel(p, novel_file()) == NOVEL_ID
            for n in range(3):
                await write_unit(p, NOVEL_ID, n, summary)
        for _ in range(2):
            for p in pools:
                whole = await reference_snapshot(p, NOVEL_ID)
                assert await store.load_snapshot(p, NOVEL_ID, prose=False) == structure(whole)
                snap, _ = await store.load_snapshot_and_novel(p, NOVEL_ID)
                assert snap == structure(whole)
        await write_unit(pools[1], NOVEL_ID, 3, "second")
        whole = await reference_snapshot(pools[1], NOVEL_ID)
        assert await store.load_snapshot(pools[1], NOVEL_ID, prose=False) == structure(whole)
        assert CACHE.full_reads >= 4
    finally:
        for p in pools:
            await p.close()


async def test_issue14_a_known_index_ahead_of_the_read_gives_the_read_its_own_asof(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4: the process knows commits beyond a context read's asOf (another actor read later):
    the read still sees exactly the commits at or before its asOf."""
    uids = [await write_unit(pool, novel_id, n) for n in range(4)]
    await store.load_snapshot(pool, novel_id, prose=False)
    assert CACHE.known(novel_id).after == 4
    for as_of in range(4):
        sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=uids[3], scenario="generation",
                                                   purpose="production", profile="bounded", as_of=as_of)
        assert [c.seq for c in sources.index.commits] == list(range(1, as_of + 1))
        assert sources.index.commits == (await reference_context_index(pool, novel_id, as_of))[0]
    # A known index that is not this database's (a wrong mark) is not used either.
    forged = [msgspec.structs.replace(c, canon_changes=[], body_hash="forged") for c in CACHE.known(novel_id).commits]
    CACHE.remember(novel_id, 0, forged, "0:not-this-one")
    assert CACHE.known(novel_id) == Known(tuple(forged), "0:not-this-one")
    whole = await reference_snapshot(pool, novel_id)
    assert await store.load_snapshot(pool, novel_id, prose=False) == structure(whole)


@pytest.fixture(autouse=True)
def _fresh_index() -> None:
    CACHE.clear()
