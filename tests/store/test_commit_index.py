"""PERF-2: snapshots read only the commits after those the process knows (`store.commit_index`).

The driver's structural snapshot, its accounting snapshot, the read tools' snapshot and the
context index each carried every commit with its canon facts, per unit: a unit cost more the
longer the book. They now send the last commit seq the process knows and its mark, and the
statement returns only the commits after it — or all of them when the commit at that seq is not
the one the process knew (another database behind the same novel id, a snapshot older than what
is known). Checked here against whole reads on real PostgreSQL, commit by commit.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import msgspec
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.store import snapshots
from novelbus.store.commit_index import CACHE, EXTRACTED, UNITS, Known
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
    """The structural snapshot of `s`: no prose, and so no read date (CTX-13: it dates prose reads)."""
    return msgspec.structs.replace(s, read_on=None,
                                   commits=[msgspec.structs.replace(c, paragraphs=[]) for c in s.commits])


async def test_snapshots_after_the_known_commits_equal_whole_reads_commit_by_commit(
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


async def test_the_statement_returns_only_the_commits_after_the_known_mark(
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
                                   novel_id, (1 << 31) - 1, known, mark, None, None)
        row = snapshots.decode_snapshot_row(text)
        assert ([c.seq for c in row.commits], row.commits_after) == (expected, after)
        assert row.mark == marks[4]["mark"]


async def test_a_known_index_of_another_database_is_never_served(
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
            if summary == "second":  # the units differ too: one more, prepared
                await store.prepare_unit(p, NOVEL_ID, "ch-b", "s3", fragment=9, continuation_anchor="on")
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


async def test_a_known_index_ahead_of_the_read_gives_the_read_its_own_asof(
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
    UNITS.clear()


async def _units_now(pool: asyncpg.Pool, novel_id: str) -> list[tuple[str, str, int]]:
    rows = await pool.fetch("SELECT unit_id, state, attempt FROM units WHERE novel_id = $1 ORDER BY created_seq",
                            novel_id)
    return [(r["unit_id"], r["state"], r["attempt"]) for r in rows]


def _states(s: NovelSnapshot) -> list[tuple[str, str, int]]:
    return [(u.unit_id, u.state, u.attempt) for u in s.units]


async def test_units_written_since_the_known_snapshot_equal_a_whole_read(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """ARCH-3: through prepare, claim, release, commit and a revision, every read that sends the
    snapshot its units were read at (driver, accounting, read tools, context index) gets the
    units exactly as a whole read does; the statement sends only the units written since."""
    uid = await write_unit(pool, novel_id, 0)
    nxt = await store.prepare_unit(pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None)
    claim = await store.claim_unit(pool, novel_id, nxt, "i1", mode="subagent")
    for step in range(5):
        if step == 1:
            assert await store.release_claim(pool, novel_id, nxt, reason="given back", claim_id=claim.claim_id)
        elif step == 2:
            claim = await store.claim_unit(pool, novel_id, nxt, "i2", mode="subagent")
        elif step == 3:
            await store.commit_body(pool, novel_id, nxt, claim.token, make_body("More."), run_id="r2",
                                    context_hash=None)
        elif step == 4:  # as a revision does (store.revise_novel)
            await pool.execute("UPDATE units SET state = 'superseded', last_error = 'revised'"
                               " WHERE novel_id = $1 AND unit_id = $2", novel_id, uid)
        expected = await _units_now(pool, novel_id)
        before = UNITS.partial_reads
        assert _states(await store.load_snapshot(pool, novel_id, prose=False)) == expected
        _, _, after = await store.account_turn_and_snapshot(pool, novel_id, f"t{step}", outcome="committed")
        assert _states(after) == expected
        tools, _ = await store.load_tool_snapshot(read_pool, novel_id, nxt)
        assert _states(tools) == expected
        sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=nxt, scenario="generation",
                                                   purpose="production", profile="bounded", as_of=1)
        assert [(u.unit_id, u.state, u.attempt) for u in sources.index.units] == expected
        whole = await reference_snapshot(pool, novel_id, prose=False)
        assert after.units == whole.units
        if step:
            assert UNITS.partial_reads - before == 4  # each of the four reads asked only for what changed
    # The statement itself: known at the current snapshot, one unit written since -> that unit only.
    known = UNITS.known(novel_id)
    await pool.execute("UPDATE units SET last_error = 'touched' WHERE novel_id = $1 AND unit_id = $2", novel_id, uid)
    text = await pool.fetchval("SELECT snap FROM (" + snapshots._SNAPSHOT_STRUCTURE + ") s", novel_id,
                               (1 << 31) - 1, 0, None, known.snapshot, known.mark)
    row = snapshots.decode_snapshot_row(text)
    assert row.units_known and [u.unit_id for _, u in row.unit_rows] == [uid]
    assert row.unit_rows[0][1].last_error == "touched"
    # Another novel's mark: all units.
    text = await pool.fetchval("SELECT snap FROM (" + snapshots._SNAPSHOT_STRUCTURE + ") s", novel_id,
                               (1 << 31) - 1, 0, None, known.snapshot, "0")
    row = snapshots.decode_snapshot_row(text)
    assert not row.units_known and len(row.unit_rows) == 2


async def test_a_reader_older_than_the_known_units_reads_its_own_snapshot(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """A repeatable-read reader whose snapshot predates what the process knows (another read saw
    a unit's claim it cannot see) is never given the newer state: it reads all units, as of its
    own snapshot."""
    uid = await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    async with pool.acquire() as old:
        async with old.transaction(isolation="repeatable_read", readonly=True):
            await old.fetchval("SELECT count(*) FROM units")  # its snapshot is taken here
            await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
            newer = await store.load_snapshot(pool, novel_id, prose=False)  # the process now knows "claimed"
            assert [u.state for u in newer.units] == ["claimed"]
            assert UNITS.known(novel_id).units[0][1].state == "claimed"
            mine = await store.load_snapshot(old, novel_id, prose=False)
            assert [u.state for u in mine.units] == ["prepared"]


async def _extract(db: Any, novel_id: str, commit_id: str, seq: int, summary: str) -> None:
    """The extractor's ledger row and one fact of `commit_id`, as the keeper writes them."""
    fact = CanonChange(kind="character-state", summary=summary, sources=[f"{commit_id}#0"], character_ids=["mira"])
    await store.save_extraction(db, ("canon.extracted", {"novel_id": novel_id}), once_key=f"x:{novel_id}:{commit_id}",
                                novel_id=novel_id, commit_id=commit_id, seq=seq, mode="offline",
                                outcome="extracted", proposed=1, facts=[fact])


async def _canon_seen(pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str, unit_id: str) -> list[Any]:
    """The canon summaries per commit that the read tools' snapshot and the context index hold."""
    tools, _ = await store.load_tool_snapshot(read_pool, novel_id, unit_id)
    sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=unit_id, scenario="generation",
                                               purpose="production", profile="bounded")
    return [[[f.summary for f in c.canon_changes] for c in s] for s in (tools.commits, sources.index.commits)]


async def test_facts_extracted_since_the_known_snapshot_equal_a_whole_read(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool
) -> None:
    """ROLE-3 / PERF-2: the read tools' snapshot and the context index ask only for the commits
    extracted since the snapshot this process read the facts at, and hold exactly what a process
    that knew nothing reads — extractions landing out of commit order, and one whose transaction
    was still open when a read took its snapshot, included."""
    novel_id = await store.create_novel(pool, novel_file("n-x-since", canonSource="both", extractor="offline"))
    for n in range(3):
        await write_unit(pool, novel_id, n)
    nxt = await store.prepare_unit(pool, novel_id, "ch-b", "s3", fragment=2, continuation_anchor="on")
    commits = await store.list_commits(pool, novel_id)

    async def check(expected_facts: dict[str, str]) -> None:
        before = EXTRACTED.partial_reads
        seen = await _canon_seen(pool, read_pool, novel_id, nxt)
        assert EXTRACTED.partial_reads - before == 2  # both reads asked only for what changed
        EXTRACTED.clear()  # what a process that knew nothing reads
        assert await _canon_seen(pool, read_pool, novel_id, nxt) == seen
        for views in seen:  # the writer's fact, then the extractor's of that commit (canonSource both)
            assert [v[1:] for v in views] == [[expected_facts[c.commit_id]] if c.commit_id in expected_facts else []
                                              for c in commits]

    await _canon_seen(pool, read_pool, novel_id, nxt)  # the process knows the (empty) facts now
    await check({})
    await _extract(pool, novel_id, commits[2].commit_id, commits[2].seq, "third first")  # out of commit order
    await check({commits[2].commit_id: "third first"})
    async with pool.acquire() as conn:
        async with conn.transaction():  # an extraction in flight while a later one lands and a read takes its snapshot
            await _extract(conn, novel_id, commits[0].commit_id, commits[0].seq, "first, in flight")
            await _extract(pool, novel_id, commits[1].commit_id, commits[1].seq, "second")
            seen = await _canon_seen(pool, read_pool, novel_id, nxt)
            assert [[v[1:] for v in views] for views in seen] == [[[], ["second"], ["third first"]]] * 2
    await check({c.commit_id: s for c, s in zip(commits, ["first, in flight", "second", "third first"], strict=True)})
    # Another novel's mark: every extracted commit, not only those since.
    known = EXTRACTED.known(novel_id)
    row = await pool.fetchrow(f"SELECT {snapshots.extracted_columns('$2::text', '$3::text')} 1 FROM novels n"
                              " WHERE n.novel_id = $1", novel_id, known.snapshot, "0")
    assert not row["snap_extracted_known"] and len(json.loads(row["snap_extracted"])) == 3
    row = await pool.fetchrow(f"SELECT {snapshots.extracted_columns('$2::text', '$3::text')} 1 FROM novels n"
                              " WHERE n.novel_id = $1", novel_id, known.snapshot, known.mark)
    assert row["snap_extracted_known"] and json.loads(row["snap_extracted"]) == []
