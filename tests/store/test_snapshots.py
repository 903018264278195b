"""load_snapshot: the pure functions' only input (ARCH-3), frozen as of a commit (CTX-4)."""

from __future__ import annotations

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange
from novelbus.novel.snapshot import NovelSnapshot
from tests.store.helpers import make_body


async def _write(pool: asyncpg.Pool, novel_id: str, scene: str, text: str) -> store.Receipt:
    chapter = "ch-b" if scene == "s3" else "ch-a"
    uid = await store.prepare_unit(
        pool, novel_id, chapter, scene, fragment=1, continuation_anchor=None
    )
    claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
    body = make_body(text, canon=[CanonChange(kind="event", summary=scene, sources=["inline#0"])])
    return await store.commit_body(
        pool, novel_id, uid, claim.token, body, run_id="r", context_hash=None
    )


async def test_snapshot_carries_novel_outline_units_commits_and_notes(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    await store.add_note(pool, novel_id, "note-1", "Mira fears the sea.")
    await store.add_note(pool, novel_id, "note-1", "Mira fears deep water.")  # replaced
    await _write(pool, novel_id, "s1", "Mira arrived at dusk.")
    pending = await store.prepare_unit(
        pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor="dusk"
    )
    snap = await store.load_snapshot(pool, novel_id)
    assert isinstance(snap, NovelSnapshot)
    assert (snap.novel_id, snap.status, snap.title) == (novel_id, "active", "The Lighthouse Keeper")
    assert snap.outline is not None and snap.outline_revision is not None
    assert [(u.unit_id, u.state, u.attempt) for u in snap.units] == [
        ("s1-01", "committed", 1),
        (pending, "prepared", 0),
    ]
    assert snap.units[1].continuation_anchor == "dusk"
    assert snap.as_of_seq == 1
    [commit] = snap.commits
    assert (commit.commit_id, commit.seq, commit.unit_id, commit.chapter_id) == (
        "commit-1",
        1,
        "s1-01",
        "ch-a",
    )
    assert commit.paragraphs == ["Mira arrived at dusk."]
    assert commit.scene_completion.completed is True
    assert commit.canon_changes[0].sources == ["commit-1#0"]  # STORE-3, already rewritten
    assert snap.committed_characters == commit.effective_characters == 17
    assert snap.notes == [("note-1", "Mira fears deep water.")]
    assert await store.list_notes(pool, novel_id) == snap.notes


async def test_snapshot_as_of_seq_excludes_later_commits(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4"""
    await _write(pool, novel_id, "s1", "Mira arrived.")
    await _write(pool, novel_id, "s2", "The letter was old.")
    await _write(pool, novel_id, "s3", "The storm broke.")

    frozen = await store.load_snapshot(pool, novel_id, as_of_seq=1)
    assert [c.commit_id for c in frozen.commits] == ["commit-1"]
    assert frozen.as_of_seq == 1
    facts = [s for c in frozen.commits for ch in c.canon_changes for s in ch.sources]
    assert facts == ["commit-1#0"]  # no canon fact from the future either
    assert frozen.committed_characters == 11

    assert [c.seq for c in (await store.load_snapshot(pool, novel_id, as_of_seq=2)).commits] == [
        1,
        2,
    ]
    assert (await store.load_snapshot(pool, novel_id, as_of_seq=0)).commits == []
    assert (await store.load_snapshot(pool, novel_id, as_of_seq=0)).as_of_seq == 0
    latest = await store.load_snapshot(pool, novel_id)
    assert latest.as_of_seq == 3 and len(latest.commits) == 3
    assert (await store.load_snapshot(pool, novel_id, as_of_seq=99)).as_of_seq == 3
    with pytest.raises(ValueError):
        await store.load_snapshot(pool, novel_id, as_of_seq=-1)


async def test_snapshot_reads_in_one_repeatable_read_read_only_transaction(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4"""
    async with pool.acquire() as conn:
        # Called inside an outer read-write transaction of another isolation level, asyncpg
        # refuses to nest it, which shows the snapshot demands its own isolation level.
        async with conn.transaction():
            with pytest.raises(asyncpg.InterfaceError, match="isolation"):
                await store.load_snapshot(conn, novel_id)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            snap = await store.load_snapshot(conn, novel_id)
            assert snap.novel_id == novel_id


async def test_snapshot_of_unknown_novel(pool: asyncpg.Pool) -> None:
    with pytest.raises(store.NovelNotFound):
        await store.load_snapshot(pool, "n-none")
