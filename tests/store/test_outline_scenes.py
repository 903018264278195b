"""PERF-2 (migration 014): the prepare finds the unit's scene by key.

Each outline revision's scenes are listed once, when it is written, in `outline_scenes`, and
`nb_prepare_unit` looks the (chapter, scene) up there rather than reading the whole revision (a
jsonb document as long as the book's plan) and searching its scenes on every unit.
"""

from __future__ import annotations

import asyncpg
import pytest

from novelbus import store
from novelbus.store.errors import SceneNotFound
from tests.store.helpers import novel_file


async def _listed(pool: asyncpg.Pool, novel_id: str, revision: str | None) -> set[tuple[str, str]]:
    rows = await pool.fetch("SELECT chapter_id, scene_id FROM outline_scenes WHERE novel_id = $1 AND revision = $2",
                            novel_id, revision)
    return {(r["chapter_id"], r["scene_id"]) for r in rows}


async def _outlined(pool: asyncpg.Pool, novel_id: str, revision: str | None) -> set[tuple[str, str]]:
    rows = await pool.fetch("SELECT s ->> 'chapterId' AS c, s ->> 'sceneId' AS s FROM outline_revisions r,"
                            " jsonb_array_elements(r.outline -> 'scenes') s WHERE r.novel_id = $1 AND r.revision = $2",
                            novel_id, revision)
    return {(r["c"], r["s"]) for r in rows}


async def test_each_revisions_scenes_are_listed_and_the_prepare_uses_the_current_ones(
    pool: asyncpg.Pool,
) -> None:
    """PERF-2"""
    nid = await store.create_novel(pool, novel_file("n-scenes"))
    first = (await store.get_novel(pool, nid)).outline_revision
    assert await _listed(pool, nid, first) == await _outlined(pool, nid, first) == {
        ("ch-a", "s1"), ("ch-a", "s2"), ("ch-b", "s3")}
    # A revision that moves s3 to ch-a and adds s4: listed as written, the first one unchanged.
    outline = (await store.get_outline(pool, nid)).model_dump(mode="json")  # type: ignore[union-attr]
    for scene in outline["scenes"]:
        if scene["sceneId"] == "s3":
            scene["chapterId"], scene["order"] = "ch-a", 3
    outline["scenes"].append({"sceneId": "s4", "chapterId": "ch-b", "order": 1, "goal": "The storm breaks."})
    second = await store.revise_outline(pool, nid, outline, expected_revision=first, reason="move s3")
    assert await _listed(pool, nid, second) == await _outlined(pool, nid, second) == {
        ("ch-a", "s1"), ("ch-a", "s2"), ("ch-a", "s3"), ("ch-b", "s4")}
    assert await _listed(pool, nid, first) == {("ch-a", "s1"), ("ch-a", "s2"), ("ch-b", "s3")}
    # The prepare answers from the current revision: (ch-b, s3) is gone, (ch-a, s3) is there.
    with pytest.raises(SceneNotFound):
        await store.prepare_unit(pool, nid, "ch-b", "s3", fragment=1, continuation_anchor=None)
    assert await store.prepare_unit(pool, nid, "ch-a", "s3", fragment=1, continuation_anchor=None)
    assert await store.prepare_unit(pool, nid, "ch-b", "s4", fragment=1, continuation_anchor=None)
