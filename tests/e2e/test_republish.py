"""REL-7: a once-only event whose emitter died between its ledger row and its publish is made good.

`bench chaos` found it: a claim manager SIGKILLed right after writing `unit.committed` to the
ledger left the event in the table but not in the stream; reconciliation only wrote events missing
from the ledger. An interrupted flow that finds its unit committed (`UnitFlow.settle`) and the
sweep that accounts a commit whose flow is gone now emit it again from its row (`republish_once`),
stored once either way (the stream de-duplicates the message id)."""

from __future__ import annotations

from typing import Any

import msgspec
import nats

from novelbus import store
from novelbus.actors.context import once_key_of_commit
from novelbus.actors.runtime import Runtime
from novelbus.bus.codec import type_tag
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes


async def _in_stream(rt: Runtime, novel_id: str, tag: str) -> int:
    sub = await rt.ctx.js.subscribe(rt.ctx.subjects.event(novel_id, tag), stream=rt.ctx.subjects.events_stream,
                                    ordered_consumer=True)
    n = 0
    try:
        while True:
            try:
                await sub.next_msg(timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                return n
            n += 1
    finally:
        await sub.unsubscribe()


async def test_rel7_a_unit_committed_left_in_the_ledger_only_is_republished_once(stack: Runtime) -> None:
    ctx = stack.ctx
    novel_id = await store.create_novel(ctx.pool, parse_novel_file(sample_novel_bytes()))
    unit_id = "u-1"
    key = once_key_of_commit(novel_id, unit_id)
    assert await ctx.republish_once(key, ev.UnitCommitted) is False  # no row: nothing to do

    # What a claim manager killed between its ledger row and its publish leaves behind.
    event = ev.UnitCommitted(novel_id=novel_id, unit_id=unit_id, commit_id="c-1", effective_characters=10,
                             total_characters=10, body_sha256="0" * 64, context_sha256=None)
    payload: Any = msgspec.to_builtins(event)
    await store.append_event_once(ctx.pool, novel_id, type_tag(event), payload, key)
    assert await _in_stream(stack, novel_id, "unit.committed") == 0

    assert await ctx.republish_once(key, ev.UnitCommitted) is True
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    assert await ctx.republish_once(key, ev.UnitCommitted) is True  # again: still stored once
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    rows = [r for r in await store.list_events(ctx.pool, novel_id) if r.type == "unit.committed"]
    assert len(rows) == 1 and msgspec.convert(rows[0].payload, ev.UnitCommitted) == event
