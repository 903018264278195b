"""Issue 14 (PERF-2 latency): the driver starts a novel's next unit in-process right after
accounting the previous one, while the next-unit work notice is still stored on the work stream
for another process or a restart (REL-1). Its copy coming back is only acked (REL-2: nothing done
twice); a continuation that fails leaves the work to the copy, with every retry rule (DRV-1).
And `outbox.publish_after`: a notice is stored only after the events before it (BUS-3), and a
notice that cannot be stored makes the publisher's next settle fail (never silently acked)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NoStreamResponseError

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.actors.unit_flow import is_infrastructure_error
from novelbus.bus import outbox
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.e2e.test_recovery_redelivery import drained


async def _checked(stack: Runtime, novel_id: str) -> None:
    """Every unit one commit, one accounted turn each, every notice acked."""
    pool = stack.ctx.pool
    await drained(stack)
    units = (await store.load_snapshot(pool, novel_id)).units
    commits = Counter(c.unit_id for c in await store.list_commits(pool, novel_id))
    assert units and all(commits[u.unit_id] == 1 for u in units), commits
    prepared = [e for e in await store.list_events(pool, novel_id) if e.type == "unit.prepared"]
    assert len(prepared) == len(units)  # no unit prepared twice by a continuation and its copy


async def test_drv1_rel2_next_unit_runs_in_process_and_its_notice_copy_is_only_acked(stack: Runtime) -> None:
    driver: Any = stack.actor("driver")
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    units = len((await store.load_snapshot(stack.ctx.pool, novel_id)).units)
    assert driver.state.continuations >= units - 1  # every unit after the first started in-process
    await _checked(stack, novel_id)
    # the copies came back to this driver and were acked (none waits in the registry)
    assert not driver.state.continued


async def test_drv1_a_failed_continuation_leaves_the_unit_to_its_notice(
        stack: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    driver: Any = stack.actor("driver")
    original = driver.advance
    failed: list[str] = []

    async def advance(notice: Any, known: Any = None) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_name().startswith("continue-") and len(failed) < 3:
            failed.append(notice.notice_id)
            raise RuntimeError("continuation fails here")  # before it does anything
        await original(notice, known)

    driver.advance = advance
    with caplog.at_level(logging.INFO, logger="novelbus.actors.driver"):
        novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    assert len(failed) == 3
    assert sum("left to its work notice" in r.getMessage() for r in caplog.records) == 3
    await _checked(stack, novel_id)
    assert not driver.state.continued


async def test_bus3_publish_after_stores_a_notice_after_the_events_before_it(stack: Runtime) -> None:
    ctx = stack.ctx
    novel_id = await store.create_novel(ctx.pool, parse_novel_file(sample_novel_bytes()))
    await store.pause_novel(ctx.pool, novel_id, "test")  # the driver leaves its notices alone

    async def late_event() -> None:  # an event whose ack comes late (a re-publish, say)
        await asyncio.sleep(0.3)
        await ctx.js.publish(ctx.subjects.event(novel_id, "claim.released"), b"{}", headers={"Nats-Msg-Id": "late"})

    async def flow() -> str:
        for k in range(3):
            await ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=f"u-{k}", reason="test"))
        outbox.adopt([asyncio.create_task(late_event())])  # this flow's, as another task's events are
        notice_id = await publish_notice(ctx, novel_id, reason="test", wait=False)
        await outbox.settle()
        return notice_id

    notice_id = await asyncio.create_task(flow())
    stored = []
    for stream, subject in ((ctx.subjects.events_stream, ctx.subjects.event(novel_id, "claim.released")),
                            (ctx.subjects.work_stream, ctx.subjects.work(novel_id))):
        sub = await ctx.js.pull_subscribe(subject, durable=None, stream=stream,
                                          config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
        for msg in await sub.fetch(batch=10, timeout=5):
            assert msg.metadata is not None
            stored.append((msg.metadata.timestamp, msg.headers.get("Nats-Msg-Id", "") if msg.headers else ""))
        await sub.unsubscribe()
    stored.sort()
    assert len(stored) == 5 and stored[-1][1] == f"{novel_id}:{notice_id}", stored  # the notice last
    assert stored[-2][1] == "late"


async def test_rel1_a_notice_that_cannot_be_stored_fails_the_settle(stack: Runtime) -> None:
    ctx = stack.ctx
    class Target:
        js = ctx.js

        class subjects:  # noqa: N801 - the NoticeTarget shape: a work subject nobody stores
            @staticmethod
            def work(novel_id: str) -> str:
                return "nostream.x"

    async def flow() -> None:
        await publish_notice(Target(), "n-x", reason="test", wait=False)  # type: ignore[arg-type]
        await outbox.settle()

    with pytest.raises(NoStreamResponseError) as raised:
        await asyncio.create_task(flow())
    assert is_infrastructure_error(raised.value)  # the notice being handled is retried, not acked
