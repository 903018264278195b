"""Immutable snapshots for the pure decision functions (ARCH-3, PACK-1, CTX-4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.outline import NovelConfig
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.store._db import Db, transaction
from novelbus.store.errors import NovelNotFound
from novelbus.store.novels import fetch_outline

CANON_COLUMNS = (
    "f.commit_id, f.kind, f.summary, f.detail, f.sources, f.character_ids,"
    " f.foreshadowing_id, f.foreshadowing_status"
)


def canon_by_commit(facts: Iterable[Mapping[str, Any]]) -> dict[str, list[CanonChange]]:
    """Canon fact rows (selected with CANON_COLUMNS) as each commit's canon changes, in order."""
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


async def load_snapshot(
    pool: Db, novel_id: str, *, as_of_seq: int | None = None, prose: bool = True
) -> NovelSnapshot:
    """Everything the pure functions need, read in ONE `REPEATABLE READ READ ONLY` transaction.

    CTX-4: commits (and their canon facts) with seq > `as_of_seq` are excluded in SQL, so no
    future source leaks into a context. Units and notes are their current state. Canon sources
    are already rewritten to commit ids (STORE-3). `as_of_seq=None` means the latest commit.
    `prose=False` leaves commits' paragraphs empty: enough for next_work and the finish guards,
    and it keeps the driver's per-unit read independent of the book's length.
    """
    if as_of_seq is not None and as_of_seq < 0:
        raise ValueError(f"as_of_seq must be >= 0, got {as_of_seq}")
    async with transaction(pool, isolation="repeatable_read", readonly=True) as conn:
        novel = await conn.fetchrow("SELECT * FROM novels WHERE novel_id = $1", novel_id)
        if novel is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        outline = await fetch_outline(conn, novel_id, novel["outline_revision"])
        units = await conn.fetch(
            "SELECT unit_id, chapter_id, scene_id, fragment, state, attempt,"
            " continuation_anchor, last_error FROM units WHERE novel_id = $1"
            " ORDER BY created_seq",
            novel_id,
        )
        limit = (1 << 31) - 1 if as_of_seq is None else as_of_seq
        commits = await conn.fetch(
            "SELECT seq, commit_id, unit_id, chapter_id, scene_id,"
            + (" body," if prose else " jsonb_build_object('sceneCompletion', body -> 'sceneCompletion',"
               " 'paragraphs', '[]'::jsonb) AS body,")
            + " effective_chars, body_hash FROM commits WHERE novel_id = $1 AND seq <= $2 ORDER BY seq",
            novel_id,
            limit,
        )
        facts = await conn.fetch(
            f"SELECT {CANON_COLUMNS}"
            " FROM canon_facts f JOIN commits c"
            "  ON c.novel_id = f.novel_id AND c.commit_id = f.commit_id"
            " WHERE f.novel_id = $1 AND c.seq <= $2 ORDER BY c.seq, f.idx",
            novel_id,
            limit,
        )
        notes = await conn.fetch(
            "SELECT note_id, text FROM notes WHERE novel_id = $1 ORDER BY created_at, note_id",
            novel_id,
        )

    canon = canon_by_commit(facts)
    commit_views = []
    for c in commits:
        if as_of_seq is not None and c["seq"] > as_of_seq:  # fail closed (CTX-4)
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
            )
        )
    return NovelSnapshot(
        novel_id=novel_id,
        title=novel["title"],
        status=novel["status"],
        pause_reason=novel["pause_reason"],
        config=NovelConfig.model_validate(novel["config"]),
        outline=outline,
        outline_revision=novel["outline_revision"],
        units=[UnitView(**dict(u)) for u in units],
        commits=commit_views,
        as_of_seq=commit_views[-1].seq if commit_views else 0,
        notes=[(n["note_id"], n["text"]) for n in notes],
        requirements_pending=novel["requirements_pending"],
        requirements_blocked=novel["requirements_blocked"],
        requirement_watermark=novel["requirement_watermark"],
    )
