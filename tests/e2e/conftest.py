"""An in-process stack (all six actors) on the session's NATS, a fresh database and a private namespace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile


@pytest.fixture
async def stack(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        yield rt


async def run_novel(rt: Runtime, nf: NovelFile, *, timeout: float = 120.0) -> tuple[str, list[Any]]:
    """Create a novel, start it, and collect its events until it finishes or pauses."""
    ctx = rt.ctx
    novel_id = await store.create_novel(ctx.pool, nf)
    events: list[Any] = []
    done = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        e = decode(msg.data, ev.NovelEvent)
        events.append(e)
        if isinstance(e, (ev.NovelFinished, ev.NovelPaused)) and not done.done():
            done.set_result(e)

    sub = await ctx.nc.subscribe(ctx.subjects.events_of(novel_id), cb=on_event)
    try:
        await publish_notice(ctx, novel_id, reason="test")
        final = await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    assert isinstance(final, ev.NovelFinished), f"novel did not finish: {final}"
    await settled_usage(rt)
    return novel_id, events


async def settled_usage(rt: Runtime) -> None:
    """Usage samples travel off the unit's path (REL-7): wait for those still in flight."""
    for actor in rt.actors:
        accounting = getattr(actor, "accounting", None)
        if accounting is not None:
            await accounting.idle()
