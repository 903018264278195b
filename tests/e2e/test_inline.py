"""Inline mode end to end (DRV-2, DRV-3, AB-2, RUN-5): one persistent author session per novel,
driven by the real actors over real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.compaction import SUMMARY_HEADER
from novelbus.writers.inline import BRIEF_HEADER, session_id
from tests.e2e.conftest import run_novel
from tests.waiting import arrives, no_unit_in_flight, wait_until


def in_mode(nf: NovelFile, mode: str) -> NovelFile:
    config = nf.config.model_copy(update={"writerMode": mode})
    return nf.model_copy(update={"novelId": None, "config": config})


def briefs(history: list[Any]) -> int:
    return sum(
        1
        for m in history
        if m.get("role") == "user" and str(m.get("content") or "").startswith(BRIEF_HEADER)
    )


async def test_inline_writes_the_sample_novel_with_one_commit_per_unit(
    stack: Runtime,
) -> None:
    """DRV-2, USE-1, USE-3: the inline session completes the sample novel through the claim
    manager (one commit per unit, writerRuns per commit); its session is stored with one brief
    per unit; the usage is sampled in mode `inline` and the input grows unit by unit; the prose
    is exactly what subagent (W2) mode writes for the same novel (same writer behaviour)."""
    nf = parse_novel_file(sample_novel_bytes())
    pool = stack.ctx.pool
    inline_id, events = await run_novel(stack, in_mode(nf, "inline"))

    novel = await store.get_novel(pool, inline_id)
    snap = await store.load_snapshot(pool, inline_id)
    assert novel.status == "finished"
    live = [u for u in snap.units if u.state != "superseded"]
    counts = await store.count_commits_per_unit(pool, inline_id)
    assert live and all(counts.get(u.unit_id) == 1 for u in live)
    assert novel.writer_runs == len(snap.commits)

    session = await store.load_session(pool, session_id(inline_id))
    assert session is not None and session.novel_id == inline_id
    assert briefs(session.history) == len(snap.commits)

    samples = await store.recent_usage(pool, inline_id)
    assert [s["mode"] for s in samples] == ["inline"] * len(snap.commits)
    firsts = [s["perCall"][0]["inputChars"] for s in samples]
    assert all(b > a for a, b in zip(firsts, firsts[1:], strict=False))
    totals = await store.usage_totals(pool, inline_id)
    assert set(totals) == {"inline"} and totals["inline"]["samples"] == len(snap.commits)
    assert ev.ToolStarted in {type(e) for e in events}  # it researched with the read tools

    subagent_id, _ = await run_novel(stack, in_mode(nf, "subagent"))
    other = await store.load_snapshot(pool, subagent_id)
    assert [c.paragraphs for c in snap.commits] == [c.paragraphs for c in other.commits]
    assert await store.load_session(pool, session_id(subagent_id)) is None


async def test_inline_compacts_at_the_configured_threshold(
    nats_url: str, new_database: Any, namespace: str
) -> None:
    """AB-2: with a small threshold the session compacts; the stored history then starts with
    the summary, and the compaction calls are counted in the usage totals."""
    dsn = await new_database()
    kwargs = {"writer": {"inline_compact_tokens": 6_000}}
    async with running(nats_url, dsn, subjects=Subjects(namespace), actor_kwargs=kwargs) as rt:
        nf = parse_novel_file(sample_novel_bytes())
        novel_id, _ = await run_novel(rt, in_mode(nf, "inline"))
        pool = rt.ctx.pool
        totals = (await store.usage_totals(pool, novel_id))["inline"]
        assert totals["compactions"] >= 1
        samples = await store.recent_usage(pool, novel_id)
        compacting = [s for s in samples if s["compactions"]]
        assert compacting
        for s in compacting:
            flagged = [c for c in s["perCall"] if c.get("compaction")]
            assert len(flagged) == s["compactions"]
            assert flagged[0]["estInputTokens"] > 3_000  # it re-read a whole history
        session = await store.load_session(pool, session_id(novel_id))
        assert session is not None
        history = session.history
        assert briefs(history) < len(samples)  # earlier briefs were replaced by a summary
        summaries = [m for m in history if str(m.get("content") or "").startswith(SUMMARY_HEADER)]
        assert len(summaries) == 1 and history[1] == summaries[0]
        assert (await store.get_novel(pool, novel_id)).status == "finished"


async def _until(rt: Runtime, novel_id: str, predicate: Any, timeout: float = 60.0) -> asyncio.Task[Any]:
    """Subscribed to the novel's events: a task giving the first one `predicate` accepts."""
    ctx = rt.ctx
    done = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        e = decode(msg.data, ev.NovelEvent)
        if predicate(e) and not done.done():
            done.set_result(e)

    sub = await ctx.nc.subscribe(ctx.subjects.events_of(novel_id), cb=on_event)

    async def first() -> Any:
        try:
            return await arrives(done, timeout, f"the awaited event of {novel_id}")
        finally:
            await sub.unsubscribe()

    return asyncio.create_task(first())


async def _usage_samples(pool: Any, novel_id: str, expected: int, timeout: float = 30.0) -> list[Any]:
    """The novel's usage samples once `expected` have been recorded."""
    async def recorded() -> list[Any] | None:
        samples = await store.recent_usage(pool, novel_id)
        return samples if len(samples) >= expected else None

    return await wait_until(recorded, timeout, f"{expected} usage samples of {novel_id}")


async def test_inline_session_survives_a_restart_of_every_actor(
    nats_url: str, new_database: Any, namespace: str
) -> None:
    """RUN-5: the session lives in the store, not in an actor: after all actors restart, the
    next unit's first call re-sends the whole history written before the restart."""
    dsn = await new_database()
    data = generate_novel_file(2, 3, seed=5, unit_chars=400)
    data["config"]["writerMode"] = "inline"
    nf = parse_novel_file(json.dumps(data))
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, nf)
        committed = 0

        def third_commit(e: Any) -> bool:
            nonlocal committed
            committed += isinstance(e, ev.UnitCommitted)
            return committed >= 3

        waiter = await _until(rt, novel_id, third_commit)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await waiter
        await store.pause_novel(pool, novel_id, "user-request")
        await no_unit_in_flight(rt, novel_id)  # the in-flight unit, if any, finishes its turn
        before = await store.load_session(pool, session_id(novel_id))
        assert before is not None
        written = briefs(before.history)
        assert written >= 3

    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        pool = rt.ctx.pool
        await store.resume_novel(pool, novel_id)
        waiter = await _until(rt, novel_id, lambda e: isinstance(e, (ev.NovelFinished, ev.NovelPaused)))
        await publish_notice(rt.ctx, novel_id, reason="resume")
        final = await waiter
        assert isinstance(final, ev.NovelFinished), final
        # REL-7: usage is sampled off the unit's path; the last sample may land after the finish.
        samples = await _usage_samples(pool, novel_id, 6)
        assert len(samples) == 6
        first_after = samples[written]["perCall"][0]
        last_before = samples[written - 1]["perCall"][0]
        assert first_after["historyChars"] > last_before["historyChars"] > 0
        after = await store.load_session(pool, session_id(novel_id))
        assert after is not None and briefs(after.history) == 6
        assert after.history[: len(before.history)] == before.history
