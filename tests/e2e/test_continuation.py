"""PERF-2 (latency): waits taken off a unit's path, each with its guarantee kept.

- The driver starts a novel's next unit in-process once its next-unit work notice is stored (for
  another process or a restart, REL-1); the notice's copy coming back is only acked (REL-2:
  nothing done twice); a continuation that fails leaves the work to the copy, with every retry
  rule (DRV-1).
- `emit` still returns only once its ledger row is written (a deferred row was tried and dropped:
  the CLI and the panel answer right after `emit`); a row that cannot be written fails the emit
  and a command service's reply (BUS-3)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import RemoteError, request
from novelbus.bus.service import CommandService
from novelbus.messages import events as ev
from novelbus.messages.work import WorkNotice
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.waiting import work_drained


async def _checked(stack: Runtime, novel_id: str) -> None:
    """Every unit one commit, one accounted turn each, every notice acked."""
    pool = stack.ctx.pool
    await work_drained(stack)
    units = (await store.load_snapshot(pool, novel_id)).units
    commits = Counter(c.unit_id for c in await store.list_commits(pool, novel_id))
    assert units and all(commits[u.unit_id] == 1 for u in units), commits
    prepared = [e for e in await store.list_events(pool, novel_id) if e.type == "unit.prepared"]
    assert len(prepared) == len(units)  # no unit prepared twice by a continuation and its copy


async def test_next_unit_runs_in_process_and_its_notice_copy_is_only_acked(stack: Runtime) -> None:
    """DRV-1, REL-2"""
    driver: Any = stack.actor("driver")
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    units = len((await store.load_snapshot(stack.ctx.pool, novel_id)).units)
    assert driver.state.continuations >= units - 1  # every unit after the first started in-process
    await _checked(stack, novel_id)
    # the copies came back to this driver and were acked (none waits in the registry)
    assert not driver.state.continued


async def test_a_failed_continuation_leaves_the_unit_to_its_notice(
        stack: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    """DRV-1"""
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


async def test_an_event_whose_ledger_row_fails_fails_the_emit_and_the_reply(
        stack: Runtime, new_database: Any) -> None:
    """BUS-3: `emit` returns only once the ledger row is written (the CLI and the panel answer
    right after it); a row that cannot be written fails the emit, and a command service answers
    with an error reply — never its reply before its events."""
    ctx = stack.ctx
    broken = await store.connect(await new_database(), max_size=1)
    await broken.close()  # a real pool that cannot write any more
    away = ActorContext(nc=ctx.nc, js=ctx.js, pool=broken, subjects=ctx.subjects)
    event = ev.ClaimReleased(novel_id="n-x", unit_id="u-x", reason="test")
    with pytest.raises(asyncpg.InterfaceError):
        await away.emit(event)
    assert (await asyncio.create_task(_emitted(ctx, "n-y"))) == ["claim.released"]  # written on return

    async def handler(notice: WorkNotice) -> WorkNotice:
        await away.emit(event)
        return notice

    subject = f"{ctx.subjects.namespace}test.emit-fails"
    service = CommandService(ctx.nc, subject, {WorkNotice: handler}, queue="test")
    await service.start()
    try:
        with pytest.raises(RemoteError):
            await request(ctx.nc, subject, WorkNotice(novel_id="n-x", notice_id="x", reason="t"), WorkNotice,
                          timeout=10)
    finally:
        await service.stop()
    assert not [e for e in await store.list_events(ctx.pool, "n-x")]  # nothing half-written here either


async def _emitted(ctx: ActorContext, novel_id: str) -> list[str]:
    await ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id="u-y", reason="test"))
    return [e.type for e in await store.list_events(ctx.pool, novel_id)]  # no settle in between
