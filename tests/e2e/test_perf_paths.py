"""PERF-2 paths that must keep BUS-3's guarantees: events of concurrent flows share one ledger
INSERT, and an event is stored in its stream before the emitting task's next command leaves."""

from __future__ import annotations

import asyncio

from nats.js.api import ConsumerConfig, DeliverPolicy

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus import outbox, tally
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes


async def test_perf2_concurrent_events_share_ledger_inserts_and_all_reach_the_stream(stack: Runtime) -> None:
    ctx = stack.ctx
    novel_id = await store.create_novel(ctx.pool, parse_novel_file(sample_novel_bytes()))
    before = tally.snapshot()

    async def flow(i: int) -> None:  # one flow's events one after another, many flows at once
        for k in range(3):
            await ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=f"c{i}-{k}", reason="test"))
        await outbox.settle()

    await asyncio.gather(*(flow(i) for i in range(30)))
    counted = tally.per_unit(before, tally.snapshot(), 1)
    assert counted["publishes"]["total"] == 90
    assert counted["transactions"]["total"] < 90  # batched: fewer INSERTs than events
    rows = [e for e in await store.list_events(ctx.pool, novel_id) if e.type == "claim.released"]
    assert len(rows) == 90 and len({e.seq for e in rows}) == 90
    for i in range(30):  # per flow, ledger order is emission order (BUS-3)
        mine = [e.payload["unitId"] for e in rows if e.payload["unitId"].startswith(f"c{i}-")]
        assert mine == [f"c{i}-0", f"c{i}-1", f"c{i}-2"]
    # every ledger row is in the stream already (settled), each flow's in its order
    sub = await ctx.js.pull_subscribe(ctx.subjects.event(novel_id, "claim.released"), durable=None,
                                      stream=ctx.subjects.events_stream,
                                      config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    got: list[str] = []
    while len(got) < 90:
        for msg in await sub.fetch(batch=90, timeout=5):
            got.append(msg.headers["Nats-Msg-Id"] if msg.headers else "")
            await msg.ack()
    ids = {f"{ctx.subjects.namespace}ev-{e.seq}": e.payload["unitId"] for e in rows}
    assert sorted(got) == sorted(ids)
    for i in range(30):
        assert [ids[g] for g in got if ids[g].startswith(f"c{i}-")] == [f"c{i}-0", f"c{i}-1", f"c{i}-2"]
