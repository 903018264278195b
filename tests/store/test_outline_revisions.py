"""Outline revisions (SPEC §16 Outline): compare-and-set, refusals, automatic supersede."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.outline import Outline, outline_revision
from tests.store.helpers import make_body


async def _outline(pool: asyncpg.Pool, novel_id: str) -> dict[str, Any]:
    outline = await store.get_outline(pool, novel_id)
    assert outline is not None
    return outline.model_dump(mode="json")


async def _revision(pool: asyncpg.Pool, novel_id: str) -> str | None:
    return (await store.get_novel(pool, novel_id)).outline_revision


async def _commit(pool: asyncpg.Pool, novel_id: str, chapter: str, scene: str) -> str:
    uid = await store.prepare_unit(
        pool, novel_id, chapter, scene, fragment=1, continuation_anchor=None
    )
    claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
    await store.commit_body(
        pool, novel_id, uid, claim.token, make_body(), run_id="r", context_hash=None
    )
    return uid


async def test_revise_outline_compare_and_set(pool: asyncpg.Pool, novel_id: str) -> None:
    parent = await _revision(pool, novel_id)
    outline = await _outline(pool, novel_id)
    outline["story"]["theme"] = "forgiveness"
    new = Outline.model_validate(outline)
    revision = await store.revise_outline(
        pool, novel_id, new, expected_revision=parent, reason="theme"
    )
    assert revision == outline_revision(parent, "theme", new) != parent
    assert await _revision(pool, novel_id) == revision
    assert await store.get_outline(pool, novel_id) == new
    row = await pool.fetchrow(
        "SELECT parent, reason, seq FROM outline_revisions WHERE revision = $1", revision
    )
    assert dict(row) == {"parent": parent, "reason": "theme", "seq": 2}

    with pytest.raises(store.RevisionConflict) as stale:  # the old expected revision is stale
        await store.revise_outline(pool, novel_id, new, expected_revision=parent, reason="again")
    assert stale.value.code == "revision-conflict"
    assert await _revision(pool, novel_id) == revision


async def test_revise_outline_overlay_carries_omitted_layers_forward(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    before = await _outline(pool, novel_id)
    lore = [{"entryId": "lamp", "keys": ["lamp"], "content": "The lamp never goes out."}]
    await store.revise_outline(
        pool,
        novel_id,
        {"lore": lore},
        expected_revision=await _revision(pool, novel_id),
        reason="lore",
    )
    after = await _outline(pool, novel_id)
    assert after["lore"][0]["entryId"] == "lamp"
    assert {k: v for k, v in after.items() if k != "lore"} == {
        k: v for k, v in before.items() if k != "lore"
    }
    with pytest.raises(ValueError):
        await store.revise_outline(
            pool,
            novel_id,
            {"plot": []},
            expected_revision=await _revision(pool, novel_id),
            reason="x",
        )


async def test_revise_outline_refused_while_a_unit_is_claimed(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    revision = await _revision(pool, novel_id)
    with pytest.raises(store.UnitInFlight) as err:
        await store.revise_outline(
            pool, novel_id, {"lore": []}, expected_revision=revision, reason="x"
        )
    assert unit_id in str(err.value)
    assert await _revision(pool, novel_id) == revision


async def test_revise_outline_keeps_committed_chapters_and_their_order(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    await _commit(pool, novel_id, "ch-a", "s1")
    await _commit(pool, novel_id, "ch-b", "s3")
    outline = await _outline(pool, novel_id)
    revision = await _revision(pool, novel_id)

    dropped = {
        "chapters": [c for c in outline["chapters"] if c["chapterId"] != "ch-b"],
        "scenes": [s for s in outline["scenes"] if s["chapterId"] != "ch-b"],
    }
    with pytest.raises(store.RevisionRefused) as gone:
        await store.revise_outline(
            pool, novel_id, dropped, expected_revision=revision, reason="drop"
        )
    assert gone.value.code == "revision-refused" and "ch-b" in str(gone.value)

    swapped = [dict(c, order=3 - c["order"]) for c in outline["chapters"]]
    with pytest.raises(store.RevisionRefused):
        await store.revise_outline(
            pool, novel_id, {"chapters": swapped}, expected_revision=revision, reason="swap"
        )

    # Inserting a new chapter between committed ones keeps their relative order: allowed.
    spaced = [dict(c, order=c["order"] * 10) for c in outline["chapters"]]
    spaced.append({"chapterId": "ch-mid", "order": 15, "title": "Interlude"})
    new = await store.revise_outline(
        pool, novel_id, {"chapters": spaced}, expected_revision=revision, reason="interlude"
    )
    assert await _revision(pool, novel_id) == new


async def test_revise_outline_supersedes_prepared_units_of_removed_scenes(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    kept = await store.prepare_unit(
        pool, novel_id, "ch-b", "s3", fragment=1, continuation_anchor=None
    )
    outline = await _outline(pool, novel_id)
    scenes = [s for s in outline["scenes"] if s["sceneId"] != "s1"]
    await store.revise_outline(
        pool,
        novel_id,
        {"scenes": scenes},
        expected_revision=await _revision(pool, novel_id),
        reason="cut s1",
    )
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "superseded"
    assert (await store.get_unit(pool, novel_id, kept)).state == "prepared"


async def test_revise_outline_refused_for_unknown_or_finished_novel(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    with pytest.raises(store.NovelNotFound):
        await store.revise_outline(pool, "n-none", {"lore": []}, expected_revision=None, reason="x")
    revision = await _revision(pool, novel_id)
    await store.finish_novel(pool, novel_id)
    with pytest.raises(store.NovelNotActive):
        await store.revise_outline(
            pool, novel_id, {"lore": []}, expected_revision=revision, reason="x"
        )
