"""Trusted context read-back from PostgreSQL (CTX-1, CTX-2, CTX-4, CTX-6; PACK-4)."""

from __future__ import annotations

import json

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange
from novelbus.novel.context import (
    ContextInputError,
    FrozenContext,
    WriterPackError,
    canonical_json,
    freeze_from_snapshot,
)
from novelbus.novel.pack import render_writer_pack
from novelbus.novel.text import effective_characters
from tests.store.helpers import make_body

MARK = "Futuremark"
FIRST = "Mira climbed the lighthouse stairs with the lamp oil."


async def write_unit(
    pool: asyncpg.Pool,
    novel_id: str,
    scene: tuple[str, str, int],
    *paragraphs: str,
    completed: bool = True,
    canon: list[CanonChange] | None = None,
) -> str:
    chapter_id, scene_id, fragment = scene
    unit_id = await store.prepare_unit(
        pool, novel_id, chapter_id, scene_id, fragment=fragment, continuation_anchor=None
    )
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    await store.commit_body(
        pool,
        novel_id,
        unit_id,
        claim.token,
        make_body(*paragraphs, completed=completed, canon=canon, next_anchor=None),
        run_id="run-1",
        context_hash=None,
    )
    return unit_id


async def claim_next(pool: asyncpg.Pool, novel_id: str, scene: tuple[str, str, int]) -> str:
    chapter_id, scene_id, fragment = scene
    unit_id = await store.prepare_unit(
        pool, novel_id, chapter_id, scene_id, fragment=fragment, continuation_anchor=None
    )
    await store.claim_unit(pool, novel_id, unit_id, "intent-2", mode="subagent")
    return unit_id


async def two_commits(pool: asyncpg.Pool, novel_id: str) -> tuple[str, str, str]:
    """u1 completes s1; u2 is s2's first fragment and carries the marker in prose and canon;
    u3 (s2, fragment 2) is claimed."""
    u1 = await write_unit(
        pool,
        novel_id,
        ("ch-a", "s1", 1),
        FIRST,
        canon=[
            CanonChange(
                kind="character-state",
                summary="Mira is the new keeper.",
                sources=["inline#0"],
                character_ids=["mira"],
            )
        ],
    )
    u2 = await write_unit(
        pool,
        novel_id,
        ("ch-a", "s2", 1),
        f"{MARK} Tomas brought the letter up from the harbour.",
        completed=False,
        canon=[
            CanonChange(
                kind="relation",
                summary=f"{MARK} Mira and Tomas share a secret.",
                sources=["inline#0"],
                character_ids=["mira", "tomas"],
            )
        ],
    )
    u3 = await claim_next(pool, novel_id, ("ch-a", "s2", 2))
    return u1, u2, u3


async def ctx(pool: asyncpg.Pool, novel_id: str, unit_id: str, **kw: object) -> FrozenContext:
    args: dict[str, object] = {
        "scenario": "generation",
        "purpose": "production",
        "profile": "bounded",
        **kw,
    }
    return await store.load_context(pool, novel_id=novel_id, unit_id=unit_id, **args)  # type: ignore[arg-type]


async def test_a_future_commit_never_leaks_from_the_store(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4: a commit after asOf (prose, canon fact, its characters) is absent from the
    context, the manifest and both pack shapes, in both profiles."""
    _, u2, u3 = await two_commits(pool, novel_id)
    for profile in ("bounded", "wide"):
        # the claimed unit with asOf before the planted commit
        frozen = await ctx(pool, novel_id, u3, as_of=1, profile=profile)
        assert frozen.manifest.request.as_of == 1 and frozen.manifest.commits_visible == 1
        assert MARK.encode() not in canonical_json(frozen.context)
        assert MARK.encode() not in canonical_json(frozen.manifest)
        for shape in ("full", "trimmed"):
            assert MARK not in render_writer_pack(frozen, shape).text  # type: ignore[arg-type]
        assert frozen.context.l0.length.committed == effective_characters(FIRST)  # commit 1 only
        # u2's own context (default asOf = the seq before its commit) never sees its own prose
        own = await ctx(pool, novel_id, u2, profile=profile)
        assert own.manifest.request.as_of == 1
        assert MARK.encode() not in canonical_json(own.context)
    # the same unit at the latest asOf does see it: the marker is really there to leak
    latest = await ctx(pool, novel_id, u3)
    assert latest.manifest.request.as_of == 2
    assert MARK in render_writer_pack(latest, "full").text


async def test_one_repeatable_read_read_only_transaction(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4: The isolation level is read back from the server and recorded; a change committed by
    another connection after the plan is fixed is invisible to the read-back."""
    u1, _, u3 = await two_commits(pool, novel_id)

    async def meddle() -> None:
        async with pool.acquire() as other:
            await other.execute(
                "UPDATE commits SET body = jsonb_set(body, '{paragraphs}', $3::jsonb)"
                " WHERE novel_id = $1 AND unit_id = $2",
                novel_id,
                u1,
                ["Rewritten behind the reader's back."],
            )

    sources = await store.read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=u3,
        scenario="generation",
        purpose="production",
        profile="bounded",
        _before_sources=meddle,
    )
    assert (sources.readback.isolation, sources.readback.read_only) == ("repeatable read", True)
    assert sources.prose["commit-1"] == [FIRST]
    # a new read sees the committed change, so the first read really was one snapshot
    again = await store.read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=u3,
        scenario="generation",
        purpose="production",
        profile="bounded",
    )
    assert again.prose["commit-1"] == ["Rewritten behind the reader's back."]
    frozen = await ctx(pool, novel_id, u3)
    assert frozen.manifest.readback.isolation == "repeatable read"


async def test_store_reads_prose_by_pointer_only(pool: asyncpg.Pool, novel_id: str) -> None:
    """CTX-2"""
    _, _, u3 = await two_commits(pool, novel_id)
    sources = await store.read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=u3,
        scenario="generation",
        purpose="production",
        profile="bounded",
    )
    assert set(sources.prose) == {"commit-1", "commit-2"}  # chapter ch-a
    assert all(c.paragraphs == [] for c in sources.index.commits)  # the index holds no prose
    assert sources.paragraph_counts == {"commit-1": 1, "commit-2": 1}
    # finish ch-a, then a ch-b unit: bounded reads nothing of ch-a, wide reads it as baseline
    await store.release_claim(pool, novel_id, u3, reason="test")
    await write_unit(pool, novel_id, ("ch-a", "s2", 2), "Tomas left again before dawn.")
    u4 = await claim_next(pool, novel_id, ("ch-b", "s3", 1))
    bounded = await store.read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=u4,
        scenario="generation",
        purpose="production",
        profile="bounded",
    )
    assert bounded.prose == {}
    wide = await store.read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=u4,
        scenario="generation",
        purpose="production",
        profile="wide",
    )
    assert set(wide.prose) == {"commit-1", "commit-2", "commit-3"}
    assert wide.plan.baseline_chapters == ["ch-a", "ch-b"]


async def test_store_and_in_memory_read_back_assemble_the_same_context(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-4"""
    _, _, u3 = await two_commits(pool, novel_id)
    snapshot = await store.load_snapshot(pool, novel_id)
    for profile in ("bounded", "wide"):
        from_db = await ctx(pool, novel_id, u3, profile=profile)
        in_memory = freeze_from_snapshot(snapshot, u3, profile=profile)
        assert from_db.context_sha256 == in_memory.context_sha256
        assert from_db.manifest.sources == in_memory.manifest.sources
        assert from_db.manifest.readback.isolation == "repeatable read"
        assert in_memory.manifest.readback.isolation == "in-memory snapshot"
        for shape in ("full", "trimmed"):
            a = render_writer_pack(from_db, shape)  # type: ignore[arg-type]
            b = render_writer_pack(in_memory, shape)  # type: ignore[arg-type]
            assert a.text == b.text and a.prefix_sha256 == b.prefix_sha256


async def test_store_rejects_bad_input_before_touching_the_database(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-1"""
    _, _, u3 = await two_commits(pool, novel_id)
    with pytest.raises(ContextInputError, match="unknown scenario 'draft'"):
        await ctx(pool, "no-such-novel", u3, scenario="draft")
    with pytest.raises(ContextInputError, match="unknown purpose 'audit'"):
        await ctx(pool, novel_id, u3, purpose="audit")
    with pytest.raises(ContextInputError, match="unknown profile 'everything'"):
        await ctx(pool, novel_id, u3, profile="everything")
    with pytest.raises(ContextInputError, match="after the novel's latest commit 2"):
        await ctx(pool, novel_id, u3, as_of=3)
    with pytest.raises(store.NovelNotFound):
        await ctx(pool, "no-such-novel", u3)
    with pytest.raises(WriterPackError) as err:
        await ctx(pool, novel_id, "u-nope")
    assert err.value.missing_blocks == ["unit"]


async def test_freeze_is_append_only_and_idempotent_on_the_manifest_hash(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-6"""
    _, _, u3 = await two_commits(pool, novel_id)
    frozen = await ctx(pool, novel_id, u3)
    again = await ctx(pool, novel_id, u3)
    assert again.manifest_sha256 == frozen.manifest_sha256  # same snapshot, same freeze

    async def save() -> bool:
        return await store.save_context_freeze(
            pool,
            novel_id=novel_id,
            unit_id=u3,
            manifest_hash=frozen.manifest_sha256,
            context_hash=frozen.context_sha256,
            manifest=frozen.manifest_builtins(),
        )

    assert await save() is True
    assert await save() is False
    row = await store.get_context_freeze(pool, frozen.manifest_sha256)
    assert row is not None and row["context_hash"] == frozen.context_sha256
    assert row["manifest"]["contextSha256"] == frozen.context_sha256
    assert row["manifest"]["request"]["asOf"] == 2
    stored = json.dumps(row["manifest"])
    assert MARK not in stored and "lighthouse stairs" not in stored  # ids and counts, no prose
    with pytest.raises(asyncpg.PostgresError, match="append-only"):
        await pool.execute("UPDATE context_freeze SET context_hash = 'x'")
    assert await pool.fetchval("SELECT count(*) FROM context_freeze") == 1
