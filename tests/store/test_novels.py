"""Novels: creation, status, writer mode and counters (SPEC §16 Budgets, DRV-3, DRV-6, USE-3)."""

from __future__ import annotations

import re

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.outline import NovelConfig, outline_revision
from tests.store.helpers import novel_file


async def test_create_and_get_novel(pool: asyncpg.Pool) -> None:
    nf = novel_file(writerMode="inline")
    novel_id = await store.create_novel(pool, nf)
    assert novel_id == "n-test"
    novel = await store.get_novel(pool, novel_id)
    assert novel.title == "The Lighthouse Keeper"
    assert isinstance(novel.config, NovelConfig) and novel.config == nf.config
    assert (novel.writer_mode, novel.status, novel.pause_reason) == ("inline", "active", None)
    assert novel.outline_revision == outline_revision(None, "create", nf.outline)
    assert (novel.turns, novel.writer_runs, novel.writer_output_chars) == (0, 0, 0)
    assert (novel.consecutive_failures, novel.stall_signature, novel.stall_count) == (0, None, 0)
    assert novel.finished_at is None and novel.duration_window_start is not None
    assert await store.get_outline(pool, novel_id) == nf.outline
    assert await store.novel_exists(pool, novel_id)
    assert not await store.novel_exists(pool, "n-none")


async def test_create_novel_generates_an_id_and_refuses_duplicates(pool: asyncpg.Pool) -> None:
    generated = await store.create_novel(pool, novel_file(None))
    assert re.fullmatch(r"n-[0-9a-f]{8}", generated)
    await store.create_novel(pool, novel_file("n-dup"))
    with pytest.raises(store.NovelExists) as err:
        await store.create_novel(pool, novel_file("n-dup"))
    assert err.value.code == "novel-exists" and "n-dup" in str(err.value)
    assert [n.novel_id for n in await store.list_novels(pool)] == [generated, "n-dup"]
    with pytest.raises(store.NovelNotFound) as missing:
        await store.get_novel(pool, "n-none")
    assert missing.value.code == "novel-not-found"


async def test_set_writer_mode_updates_column_and_config(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """DRV-3"""
    await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    novel = await store.set_writer_mode(pool, novel_id, "inline")
    assert (novel.writer_mode, novel.config.writerMode) == ("inline", "inline")
    # The claimed unit finishes in the mode it was claimed in.
    assert (await store.get_unit(pool, novel_id, unit_id)).claimed_mode == "subagent"
    with pytest.raises(ValueError):
        await store.set_writer_mode(pool, novel_id, "batch")


async def test_pause_resume_finish(pool: asyncpg.Pool, novel_id: str) -> None:
    await store.account_turn(pool, novel_id, "claim-1", outcome="failed", failure_signature="u:x")
    before = await store.get_novel(pool, novel_id)
    assert await store.pause_novel(pool, novel_id, "stalled") is True
    assert await store.pause_novel(pool, novel_id, "user-request") is False
    paused = await store.get_novel(pool, novel_id)
    assert (paused.status, paused.pause_reason) == ("paused", "stalled")

    assert await store.resume_novel(pool, novel_id) is True
    resumed = await store.get_novel(pool, novel_id)
    assert (resumed.status, resumed.pause_reason) == ("active", None)
    assert (resumed.stall_count, resumed.stall_signature) == (0, None)
    assert resumed.duration_window_start > before.duration_window_start
    assert resumed.consecutive_failures == 1  # resume resets the window and stall counter only
    assert await store.resume_novel(pool, novel_id) is False

    assert await store.finish_novel(pool, novel_id) is True
    assert await store.finish_novel(pool, novel_id) is False
    finished = await store.get_novel(pool, novel_id)
    assert finished.status == "finished" and finished.finished_at is not None
    with pytest.raises(store.NovelNotActive, match="is finished; it cannot be paused"):
        await store.pause_novel(pool, novel_id, "user-request")
    with pytest.raises(store.NovelNotActive, match="is finished; it cannot be stopped"):  # `novel stop`
        await store.pause_novel(pool, novel_id, "stopped")
    with pytest.raises(store.NovelNotActive, match="is finished; it cannot be resumed"):
        await store.resume_novel(pool, novel_id)


async def test_finish_refuses_while_a_unit_is_claimed(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    with pytest.raises(store.UnitInFlight):
        await store.finish_novel(pool, novel_id)


async def test_account_turn_counts_failures_and_stalls_after_progress(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """DRV-6"""
    async def failed(key: str, signature: str) -> store.NovelRow:
        row, first = await store.account_turn(pool, novel_id, key, outcome="failed",
                                               failure_signature=signature)
        assert first
        return row

    a = await failed("claim-a", "u1:empty")
    b = await failed("claim-b", "u1:empty")
    c = await failed("claim-c", "u1:guard")
    assert [(r.turns, r.consecutive_failures, r.stall_count) for r in (a, b, c)] == [
        (1, 1, 1),
        (2, 2, 2),
        (3, 3, 1),
    ]
    assert c.stall_signature == "u1:guard"
    ok, _ = await store.account_turn(pool, novel_id, "claim-d", outcome="committed", writer_output_chars=1200)
    assert (ok.turns, ok.writer_runs, ok.writer_output_chars) == (4, 1, 1200)
    assert (ok.consecutive_failures, ok.stall_count, ok.stall_signature) == (0, 0, None)
