"""PERF-2 paths that must keep BUS-3's guarantees: events of concurrent flows share one ledger
INSERT, and an event is stored in its stream before the emitting task's next command leaves."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus import outbox, tally
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes


async def test_concurrent_events_share_ledger_inserts_and_all_reach_the_stream(stack: Runtime) -> None:
    """PERF-2"""
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


@pytest.mark.parametrize("mode", ["subagent", "inline"])
async def test_a_runs_events_keep_their_order_when_written_with_the_run(
        mode: str, nats_url: str, new_database: object, namespace: str) -> None:
    """BUS-3 per-novel order with the one-statement writes (PERF-2): writer.dispatched (written
    with the run's row), the tool.started events (queued, batched; the inline loop announces its
    calls at the end of the run) and writer.finished (written with the run's close) follow each
    other in that order in the ledger and in the stream."""
    from tests.writers.harness import drive, sample_with, writer_stack

    novel = sample_with("W2")
    novel = novel.model_copy(update={"config": novel.config.model_copy(update={"writerMode": mode})})
    async with writer_stack(nats_url, new_database, namespace) as rt:
        d = await drive(rt, novel, timeout=120)
        assert isinstance(d.final, ev.NovelFinished), d.final
        ctx = rt.ctx
        ledger = await store.list_events(ctx.pool, d.novel_id, limit=10_000)
        sub = await ctx.js.pull_subscribe(ctx.subjects.events_of(d.novel_id), durable=None,
                                          stream=ctx.subjects.events_stream,
                                          config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
        stream: list[str] = []
        while len(stream) < len(ledger):
            for msg in await sub.fetch(batch=500, timeout=5):
                stream.append(msg.headers["Nats-Msg-Id"] if msg.headers else "")
                await msg.ack()
    kinds = ("writer.dispatched", "tool.started", "writer.finished")
    runs = {e.payload["runId"] for e in ledger if e.type == "writer.dispatched"}
    assert runs
    position = {msg_id: i for i, msg_id in enumerate(stream)}
    for run_id in runs:
        mine = [e for e in ledger if e.type in kinds and e.payload.get("runId") == run_id]
        types = [e.type for e in mine]
        assert types[0] == "writer.dispatched" and types[-1] == "writer.finished" and "tool.started" in types
        assert set(types[1:-1]) == {"tool.started"}, types  # ledger order = emission order
        in_stream = [position[f"{ctx.subjects.namespace}ev-{e.seq}"] for e in mine]
        assert in_stream == sorted(in_stream)  # and the stream's order is the ledger's
