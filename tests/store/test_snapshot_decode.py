"""PERF-2: the snapshot reads decode straight into the snapshot types — the same snapshots.

Every snapshot read (the pure functions' input: ARCH-3, PACK-1; the read tools' TOOL-5; the
driver's decision input; the context index, CTX-4) builds JSON with the snapshot types' own
field names, canon facts nested in their commits, and it decodes in one pass — no generic JSON
rebuilt view by view in Python, a cost that would grow with the book on every unit. Statements
returning generic JSON and their assembly in Python are kept below as the reference: on a database holding every shape a
snapshot carries, both give equal snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg
import msgspec
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.store.novels import fetch_outline, parse_config
from novelbus.writers.tools import call_read_tool, prose_to_read, with_prose
from tests.store.helpers import make_body, novel_file

# --- the previous implementation (the reference) -----------------------------------------------


def _reference_sql(body: str) -> str:
    return (
        "SELECT n.*,"
        " (SELECT coalesce(jsonb_agg(jsonb_build_object('unit_id', u.unit_id, 'chapter_id', u.chapter_id,"
        "   'scene_id', u.scene_id, 'fragment', u.fragment, 'state', u.state, 'attempt', u.attempt,"
        "   'continuation_anchor', u.continuation_anchor, 'last_error', u.last_error)"
        "   ORDER BY u.created_seq), '[]'::jsonb) FROM units u WHERE u.novel_id = n.novel_id) AS snap_units,"
        " (SELECT coalesce(jsonb_agg(jsonb_build_object('seq', c.seq, 'commit_id', c.commit_id,"
        "   'unit_id', c.unit_id, 'chapter_id', c.chapter_id, 'scene_id', c.scene_id,"
        f"   'body', {body}, 'effective_chars', c.effective_chars, 'body_hash', c.body_hash,"
        "   'paragraph_count', jsonb_array_length(c.body -> 'paragraphs'))"
        "   ORDER BY c.seq), '[]'::jsonb) FROM commits c WHERE c.novel_id = n.novel_id AND c.seq <= $2) AS snap_commits,"
        " (SELECT coalesce(jsonb_agg(jsonb_build_object('commit_id', f.commit_id, 'kind', f.kind,"
        "   'summary', f.summary, 'detail', f.detail, 'sources', f.sources, 'character_ids', f.character_ids,"
        "   'foreshadowing_id', f.foreshadowing_id, 'foreshadowing_status', f.foreshadowing_status)"
        "   ORDER BY c.seq, f.idx), '[]'::jsonb)"
        "   FROM canon_facts f JOIN commits c ON c.novel_id = f.novel_id AND c.commit_id = f.commit_id"
        "   WHERE f.novel_id = n.novel_id AND c.seq <= $2) AS snap_facts,"
        " (SELECT coalesce(jsonb_agg(jsonb_build_array(o.note_id, o.text) ORDER BY o.created_at, o.note_id),"
        "   '[]'::jsonb) FROM notes o WHERE o.novel_id = n.novel_id) AS snap_notes"
        " FROM novels n WHERE n.novel_id = $1"
    )


REFERENCE_PROSE = _reference_sql("c.body")
REFERENCE_STRUCTURE = _reference_sql(
    "jsonb_build_object('sceneCompletion', c.body -> 'sceneCompletion', 'paragraphs', '[]'::jsonb)"
)

REFERENCE_CONTEXT_INDEX = (
    "SELECT"
    " (SELECT COALESCE(jsonb_agg(jsonb_build_object('seq', seq, 'commit_id', commit_id,"
    "   'unit_id', unit_id, 'chapter_id', chapter_id, 'scene_id', scene_id,"
    "   'scene_completion', body -> 'sceneCompletion',"
    "   'paragraphs', jsonb_array_length(body -> 'paragraphs'),"
    "   'effective_chars', effective_chars, 'body_hash', body_hash) ORDER BY seq), '[]'::jsonb)"
    "  FROM commits WHERE novel_id = $1 AND seq <= $2) AS commits,"
    " (SELECT COALESCE(jsonb_agg(jsonb_build_object('commit_id', f.commit_id, 'kind', f.kind,"
    "   'summary', f.summary, 'detail', f.detail, 'sources', f.sources,"
    "   'character_ids', f.character_ids, 'foreshadowing_id', f.foreshadowing_id,"
    "   'foreshadowing_status', f.foreshadowing_status) ORDER BY c.seq, f.idx), '[]'::jsonb)"
    "  FROM canon_facts f JOIN commits c ON c.novel_id = f.novel_id AND c.commit_id = f.commit_id"
    "  WHERE f.novel_id = $1 AND c.seq <= $2) AS facts"
)


def reference_canon_by_commit(facts: Iterable[Mapping[str, Any]]) -> dict[str, list[CanonChange]]:
    canon: dict[str, list[CanonChange]] = {}
    for f in facts:
        canon.setdefault(f["commit_id"], []).append(
            CanonChange(
                kind=f["kind"],
                summary=f["summary"],
                sources=list(f["sources"]),
                detail=f["detail"],
                character_ids=list(f["character_ids"]),
                foreshadowing_id=f["foreshadowing_id"],
                foreshadowing_status=f["foreshadowing_status"] or "resolved",
            )
        )
    return canon


def reference_assemble(novel_id: str, novel: Any, outline: Any, as_of_seq: int | None) -> NovelSnapshot:
    units, commits = novel["snap_units"], novel["snap_commits"]
    facts, notes = novel["snap_facts"], novel["snap_notes"]
    canon = reference_canon_by_commit(facts)
    commit_views = []
    for c in commits:
        if as_of_seq is not None and c["seq"] > as_of_seq:
            raise AssertionError(f"commit {c['commit_id']!r} is after as_of_seq {as_of_seq}")
        body = c["body"]
        commit_views.append(
            CommitView(
                commit_id=c["commit_id"],
                seq=c["seq"],
                unit_id=c["unit_id"],
                chapter_id=c["chapter_id"],
                scene_id=c["scene_id"],
                paragraphs=list(body["paragraphs"]),
                scene_completion=msgspec.convert(body["sceneCompletion"], SceneCompletion),
                canon_changes=canon.get(c["commit_id"], []),
                effective_characters=c["effective_chars"],
                body_hash=c["body_hash"],
                paragraph_count=c["paragraph_count"],
            )
        )
    return NovelSnapshot(
        novel_id=novel_id,
        title=novel["title"],
        status=novel["status"],
        pause_reason=novel["pause_reason"],
        config=parse_config(novel["config"]),
        outline=outline,
        outline_revision=novel["outline_revision"],
        units=[UnitView(**dict(u)) for u in units],
        commits=commit_views,
        as_of_seq=commit_views[-1].seq if commit_views else 0,
        notes=[(n[0], n[1]) for n in notes],
        requirements_pending=novel["requirements_pending"],
        requirements_blocked=novel["requirements_blocked"],
        requirement_watermark=novel["requirement_watermark"],
    )


async def reference_snapshot(
    pool: asyncpg.Pool, novel_id: str, *, as_of_seq: int | None = None, prose: bool = True
) -> NovelSnapshot:
    async with pool.acquire() as conn:
        novel = await conn.fetchrow(REFERENCE_PROSE if prose else REFERENCE_STRUCTURE, novel_id,
                                    (1 << 31) - 1 if as_of_seq is None else as_of_seq)
        outline = await fetch_outline(conn, novel_id, novel["outline_revision"])
        # CTX-13: a prose snapshot carries the database's date (UTC), for references' expiry
        today = await conn.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date::text") if prose else None
    return msgspec.structs.replace(reference_assemble(novel_id, novel, outline, as_of_seq), read_on=today)


async def reference_context_index(pool: asyncpg.Pool, novel_id: str, as_of: int) -> tuple[list[CommitView], dict[str, int]]:
    row = await pool.fetchrow(REFERENCE_CONTEXT_INDEX, novel_id, as_of)
    canon = reference_canon_by_commit(row["facts"])
    commits = [
        CommitView(
            commit_id=r["commit_id"],
            seq=r["seq"],
            unit_id=r["unit_id"],
            chapter_id=r["chapter_id"],
            scene_id=r["scene_id"],
            paragraphs=[],
            scene_completion=msgspec.convert(r["scene_completion"], SceneCompletion),
            canon_changes=canon.get(r["commit_id"], []),
            effective_characters=r["effective_chars"],
            body_hash=r["body_hash"],
            paragraph_count=int(r["paragraphs"]),
        )
        for r in row["commits"]
    ]
    return commits, {r["commit_id"]: int(r["paragraphs"]) for r in row["commits"]}


# --- a database holding every shape a snapshot carries -----------------------------------------


PROSE = [
    'Mira said "no" twice,\tthen laughed — the lamp\\wick hissed.',
    "灯塔的门半开着，风从缝里灌进来。\n她没有回头。",
    "An emoji 🌊 and a line\r\nbreak; a lone surrogate-free ünïcode run.",
]


async def _write(pool: asyncpg.Pool, novel_id: str, chapter: str, scene: str, fragment: int, *,
                 completed: bool, canon: list[CanonChange]) -> str:
    uid = await store.prepare_unit(pool, novel_id, chapter, scene, fragment=fragment,
                                   continuation_anchor="after the storm" if fragment > 1 else None)
    claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
    body = make_body(*PROSE[: 1 + fragment % 3], completed=completed, canon=canon,
                     next_anchor=None if completed else "the letter")
    await store.commit_body(pool, novel_id, uid, claim.token, body, run_id="r", context_hash=None)
    return uid


@pytest.fixture
async def novel_id(pool: asyncpg.Pool) -> str:
    """Commits over two chapters (a continuation among them) with canon facts of every field, a
    committed unit superseded by a revision, a fact written before the foreshadowing column had a
    value, notes, a prepared unit and a claimed one."""
    nid = await store.create_novel(pool, novel_file())
    await store.add_note(pool, nid, "note-b", "Tomas keeps the ledger.")
    await store.add_note(pool, nid, "note-a", 'She "never" swims.')
    event = CanonChange(kind="event", summary="Mira arrives", sources=["inline#0"], detail="at dusk",
                        character_ids=["mira"])
    state = CanonChange(kind="character-state", summary="Tomas is wary", sources=["inline#0", "inline"],
                        character_ids=["tomas", "mira"])
    await _write(pool, nid, "ch-a", "s1", 1, completed=False, canon=[event, state])
    await _write(pool, nid, "ch-a", "s1", 2, completed=True, canon=[])
    old = await _write(pool, nid, "ch-a", "s2", 1, completed=True, canon=[state])
    await _write(pool, nid, "ch-b", "s3", 1, completed=False, canon=[event])
    # A revision supersedes a committed unit (store.revise_novel); its commit stays, not live.
    await pool.execute("UPDATE units SET state = 'superseded', last_error = 'revised' WHERE novel_id = $1"
                       " AND unit_id = $2", nid, old)
    # Facts of kind foreshadowing, one planted, one from before the status had a value (NULL).
    await pool.execute(
        "INSERT INTO canon_facts (novel_id, commit_id, idx, kind, summary, detail, sources, character_ids,"
        " foreshadowing_id, foreshadowing_status) VALUES"
        " ($1, 'commit-2', 0, 'foreshadowing', 'the letter is planted', NULL, '[\"commit-2#0\"]', '[]', 'f1', 'planted'),"
        " ($1, 'commit-2', 1, 'foreshadowing', 'the key', 'old', '[\"commit-1\"]', '[\"mira\"]', 'f2', NULL)",
        nid)
    await store.prepare_unit(pool, nid, "ch-a", "s2", fragment=2, continuation_anchor=None)
    uid = await store.prepare_unit(pool, nid, "ch-b", "s3", fragment=2, continuation_anchor="the letter")
    await store.claim_unit(pool, nid, uid, "i", mode="subagent")
    return nid


async def test_snapshots_decode_to_the_same_snapshots_as_before(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """ARCH-3, PACK-1, TOOL-5, CTX-4: prose and structural snapshots, at every asOf, the read
    tools' read-only snapshot and the driver's accounting snapshot equal the previous reads'."""
    latest = await reference_snapshot(pool, novel_id)
    assert len(latest.commits) == 4 and any(c.canon_changes for c in latest.commits)
    assert {u.state for u in latest.units} == {"committed", "superseded", "prepared", "claimed"}
    assert len(latest.notes) == 2
    assert await store.load_snapshot(pool, novel_id) == latest
    for as_of in range(0, 5):
        assert await store.load_snapshot(pool, novel_id, as_of_seq=as_of) == await reference_snapshot(
            pool, novel_id, as_of_seq=as_of)
    structure = await reference_snapshot(pool, novel_id, prose=False)
    assert all(c.paragraphs == [] for c in structure.commits)
    assert await store.load_snapshot(pool, novel_id, prose=False) == structure
    snapshot, row = await store.load_snapshot_and_novel(pool, novel_id)
    assert snapshot == structure and row == await store.get_novel(pool, novel_id)
    assert await store.load_snapshot_read_only(read_pool, novel_id) == latest
    _, first, after = await store.account_turn_and_snapshot(pool, novel_id, "turn-1", outcome="committed",
                                                            writer_output_chars=10)
    assert first and after == structure


async def test_context_index_decodes_to_the_same_index_as_before(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4: the context read's commit index (no prose, canon facts) and paragraph counts, in
    seq order, equal the previous read's at every asOf the unit allows."""
    unit = next(u for u in (await store.load_snapshot(pool, novel_id)).units if u.state == "claimed")
    for as_of in range(0, 5):
        sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=unit.unit_id,
                                                   scenario="generation", purpose="production",
                                                   profile="bounded", as_of=as_of)
        commits, counts = await reference_context_index(pool, novel_id, as_of)
        assert sources.index.commits == commits
        assert list(sources.paragraph_counts.items()) == list(counts.items())  # order too
        reference = await reference_snapshot(pool, novel_id, as_of_seq=as_of)
        assert sources.index.units == reference.units


async def test_tool_snapshot_holds_the_units_chapter_prose_and_the_rest_reads_by_id(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """TOOL-5, TOOL-1: a run's read tools' snapshot carries the prose of its unit's chapter only;
    every read tool call, with the prose it reads filled in by commit id, returns what it returns
    on the whole snapshot; a commit that is not visible fails loud."""
    whole = await store.load_snapshot_read_only(read_pool, novel_id)
    claimed = next(u for u in whole.units if u.state == "claimed")  # a unit of ch-b
    snapshot, held = await store.load_tool_snapshot(read_pool, novel_id, claimed.unit_id)
    assert held == {c.commit_id for c in whole.commits if c.chapter_id == "ch-b"} == {"commit-4"}
    for c, w in zip(snapshot.commits, whole.commits, strict=True):
        assert c == (w if c.commit_id in held else msgspec.structs.replace(w, paragraphs=[]))
    assert msgspec.structs.replace(snapshot, commits=[]) == msgspec.structs.replace(whole, commits=[])
    loaded = set(held)
    for name, args in [("novel_status_read", {}), ("novel_body_read", {"chapterId": "ch-b"}),
                       ("novel_body_read", {"chapterId": "ch-a", "sceneId": "s1"}),
                       ("novel_body_search", {"query": "lamp"}), ("novel_facts_read", {}),
                       ("novel_body_read", {"chapterId": "ch-a"})]:
        missing = prose_to_read(snapshot, loaded, name, args)
        if missing:
            snapshot = with_prose(snapshot, await store.read_prose(read_pool, novel_id, missing,
                                                                   snapshot.as_of_seq))
            loaded.update(missing)
        assert call_read_tool(snapshot, name, args) == call_read_tool(whole, name, args), name
    assert loaded == {c.commit_id for c in whole.commits}
    # An unknown unit: no prose held at all.
    _, none_held = await store.load_tool_snapshot(read_pool, novel_id, "no-such-unit")
    assert none_held == frozenset()
    with pytest.raises(store.CommitNotVisible):
        await store.read_prose(read_pool, novel_id, ["commit-1", "commit-4"], 3)
    with pytest.raises(store.CommitNotVisible):
        await store.read_prose(read_pool, novel_id, ["commit-99"], 99)
    with pytest.raises(store.ReadOnlyRequired):  # TOOL-5: never on a writable connection
        await store.load_tool_snapshot(pool, novel_id, claimed.unit_id)
