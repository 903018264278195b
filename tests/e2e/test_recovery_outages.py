"""REL-6: the database, or the NATS server, going away for a few seconds mid-run delays the work;
it neither loses nor duplicates it. Each test owns its servers (stopped and started again on the
same data directory and port), never the session's shared ones."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.bus.notices import publish_notice
from novelbus.infra import free_port
from novelbus.infra.nats import EmbeddedNats
from novelbus.infra.postgres import EmbeddedPostgres
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.test_budgets import HookedProvider
from tests.waiting import elapse, wait_until

OUTAGE_S = 3.0


@pytest.fixture
async def own_servers(tmp_home: Path, server_tracker: Any) -> AsyncIterator[tuple[EmbeddedNats, EmbeddedPostgres]]:
    nats = EmbeddedNats(tmp_home / "nats", port=free_port(), monitor_port=free_port())
    pg = EmbeddedPostgres(tmp_home / "pg", fast=True, port=free_port())
    await nats.start()
    await pg.start()
    for pid in (nats.pid, pg.pid):
        assert pid is not None
        server_tracker.add_pid(pid)
    try:
        yield nats, pg
    finally:
        await nats.stop()
        await pg.stop()


async def _fetch(dsn: str, query: str, novel_id: str) -> Any:
    """One row from a fresh connection (the pool's may be broken by the outage); None while down."""
    with contextlib.suppress(OSError, asyncpg.PostgresError):
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchrow(query, novel_id)
        finally:
            await conn.close()
    return None


async def wait_commits(pool_dsn: str, novel_id: str, n: int, timeout: float = 60.0) -> None:
    async def written() -> bool:
        row = await _fetch(pool_dsn, "SELECT count(*) AS n FROM commits WHERE novel_id = $1", novel_id)
        return row is not None and row["n"] >= n

    await wait_until(written, timeout, f"{n} commits of {novel_id}")


async def wait_finished(dsn: str, novel_id: str, timeout: float = 120.0) -> str:
    """The novel's status (and pause reason) once it is no longer active."""
    async def stopped() -> str | None:
        row = await _fetch(dsn, "SELECT status, pause_reason FROM novels WHERE novel_id = $1", novel_id)
        if row is None or row["status"] == "active":
            return None
        return f"{row['status']} {row['pause_reason'] or ''}".strip()

    return await wait_until(stopped, timeout, f"novel {novel_id} still active")


async def check_nothing_lost_or_doubled(rt: Any, novel_id: str) -> None:
    pool = rt.ctx.pool
    snap = await store.load_snapshot(pool, novel_id)
    assert snap.outline is not None
    counts = await store.count_commits_per_unit(pool, novel_id)
    live = [u for u in snap.units if u.state != "superseded"]
    assert len(snap.commits) == len(snap.outline.scenes) == len(live)  # nothing lost
    assert set(counts.values()) == {1} and all(u.state == "committed" for u in live)  # nothing doubled
    novel = await store.get_novel(pool, novel_id)
    assert novel.writer_runs == len(snap.commits)  # each unit accounted once
    usage = await store.usage_totals(pool, novel_id)
    assert usage["subagent"]["samples"] <= len(snap.commits)
    dlq = await rt.ctx.js.stream_info(rt.ctx.subjects.dlq_stream)
    assert dlq.state.messages == 0  # no notice dead-lettered


async def slow(_: list[Any]) -> None:
    await elapse(0.1)  # a slow writer leaves room for an outage in the middle of the run


async def test_database_away_for_seconds_delays_then_completes(
        own_servers: tuple[EmbeddedNats, EmbeddedPostgres], namespace: str) -> None:
    """REL-6"""
    nats, pg = own_servers
    async with running(nats.url, pg.dsn, subjects=Subjects(namespace),
                       actor_kwargs={"writer": {"provider": HookedProvider(before=slow)}}) as rt:
        nf = parse_novel_file(sample_novel_bytes())
        novel_id = await store.create_novel(rt.ctx.pool, nf)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await wait_commits(pg.dsn, novel_id, 2)
        await pg.stop()
        stopped = time.monotonic()
        await elapse(OUTAGE_S)
        await pg.start()
        assert await wait_finished(pg.dsn, novel_id) == "finished"
        assert time.monotonic() - stopped > OUTAGE_S  # delayed, not lost
        await check_nothing_lost_or_doubled(rt, novel_id)


async def test_nats_away_for_seconds_delays_then_completes(
        own_servers: tuple[EmbeddedNats, EmbeddedPostgres], namespace: str) -> None:
    """REL-6"""
    nats, pg = own_servers
    async with running(nats.url, pg.dsn, subjects=Subjects(namespace),
                       actor_kwargs={"writer": {"provider": HookedProvider(before=slow)}}) as rt:
        nf = parse_novel_file(sample_novel_bytes())
        novel_id = await store.create_novel(rt.ctx.pool, nf)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await wait_commits(pg.dsn, novel_id, 2)
        at_stop = len(await store.list_commits(rt.ctx.pool, novel_id))
        await nats.stop()
        await elapse(OUTAGE_S)
        during = len(await store.list_commits(rt.ctx.pool, novel_id))
        assert during <= at_stop + 1  # at most the unit already past its last request finished
        await nats.start()  # same port, same JetStream store: streams and the durable consumer survive
        assert await wait_finished(pg.dsn, novel_id) == "finished"
        await check_nothing_lost_or_doubled(rt, novel_id)
