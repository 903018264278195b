"""BUS-2, REL-2: duplicated and redelivered work changes nothing twice; poison notices land on the
dead-letter subject with their error after the redelivery bound."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from nats.js.api import DeliverPolicy

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.actors.unit_flow import UnitOutcome
from novelbus.bus.codec import decode, encode
from novelbus.bus.notices import publish_notice
from novelbus.bus.streams import WORK_MAX_DELIVER
from novelbus.messages import claims as cm
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.waiting import elapse, work_drained


async def ledger(rt: Runtime, novel_id: str) -> dict[str, Any]:
    pool = rt.ctx.pool
    novel = await store.get_novel(pool, novel_id)
    events = Counter(e.type for e in await store.list_events(pool, novel_id, limit=100_000))
    return {"turns": novel.turns, "writerRuns": novel.writer_runs, "output": novel.writer_output_chars,
            "commits": await store.count_commits_per_unit(pool, novel_id),
            "samples": len(await store.recent_usage(pool, novel_id)),
            "totals": await store.usage_totals(pool, novel_id),
            "events": {t: events[t] for t in ("unit.committed", "chapter.completed", "novel.finished",
                                              "unit.claimed", "usage.sampled", "unit.failed")}}


async def test_duplicate_publish_with_message_id_is_stored_once(stack: Runtime) -> None:
    """BUS-2: the Nats-Msg-Id de-duplication window drops a repeated publish of one notice."""
    ctx = stack.ctx
    data, headers = encode(WorkNotice(novel_id="n-dup", notice_id="after-u1-claim-1", reason="next-unit"))
    headers["Nats-Msg-Id"] = "n-dup:after-u1-claim-1"
    acks = [await ctx.js.publish(ctx.subjects.work("n-dup"), data, headers=headers) for _ in range(3)]
    assert [bool(a.duplicate) for a in acks] == [False, True, True]
    assert len({a.seq for a in acks}) == 1


async def test_duplicate_notices_during_and_after_a_run_change_nothing_twice(stack: Runtime) -> None:
    """REL-2: extra notices published during the run (a scheduler repeating itself) and after the
    novel finished (late redeliveries) leave exactly one commit per unit, one accounted turn and
    one usage sample per unit, and one event of each kind."""
    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes())
    spam_done = asyncio.Event()

    async def spam() -> None:
        for _ in range(40):
            for novel in await store.list_novels(ctx.pool):
                await publish_notice(ctx, novel.novel_id, reason="scheduler-repeat")
            await elapse(0.05)  # the pace of the repeats
        spam_done.set()

    spammer = asyncio.create_task(spam())
    try:
        novel_id, _ = await run_novel(stack, nf)
    finally:
        await spammer
    await work_drained(stack)
    before = await ledger(stack, novel_id)
    snap = await store.load_snapshot(ctx.pool, novel_id)
    assert snap.outline is not None
    n = len(snap.commits)
    assert n == len(snap.outline.scenes) and set(before["commits"].values()) == {1}
    assert before["turns"] == before["writerRuns"] == before["samples"] == n
    assert before["events"]["unit.committed"] == before["events"]["usage.sampled"] == n
    assert before["events"]["chapter.completed"] == len(snap.outline.chapters)
    assert before["events"]["novel.finished"] == 1 and before["events"]["unit.failed"] == 0

    for _ in range(10):  # late notices, as a redelivery after a crash would bring
        await publish_notice(ctx, novel_id, reason="late")
    await work_drained(stack)
    assert await ledger(stack, novel_id) == before


async def test_accounting_the_same_claim_again_counts_nothing(stack: Runtime) -> None:
    """REL-2: the driver's turn accounting repeated for a claim it already accounted (a retried
    flow) records no second turn, no second usage sample, no second chapter event."""
    ctx = stack.ctx
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    await work_drained(stack)
    before = await ledger(stack, novel_id)
    last = (await store.list_commits(ctx.pool, novel_id))[-1]
    snap = await store.load_snapshot(ctx.pool, novel_id)
    claim = cm.ClaimGranted(claim_id=last.claim_id, unit_id=last.unit_id, attempt=1, delegation_id="dlg-x-0",
                           instance="claims-0")
    driver: Any = stack.actor("driver")
    for ok in (True, False):
        await driver.account(novel_id, last.unit_id, claim, UnitOutcome(ok, "committed" if ok else "boom", 1), snap)
    await work_drained(stack)
    assert await ledger(stack, novel_id) == before


async def test_poison_notices_are_dead_lettered_with_their_error(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """BUS-2: a notice that fails every time is redelivered up to the bound, then lands on
    `novelbus.dlq.work` with its error code and delivery count; a malformed one goes there at once.
    The driver keeps serving: a real novel still finishes afterwards."""
    dsn = await new_database()
    subjects = Subjects(namespace)
    async with running(nats_url, dsn, subjects=subjects,
                       actor_kwargs={"driver": {"redelivery_backoff_s": 0.02}}) as rt:
        ctx = rt.ctx
        dlq = await ctx.js.subscribe(subjects.dead_letter("work"), stream=subjects.dlq_stream,
                                     ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        await publish_notice(ctx, "n-ghost", reason="misaddressed")
        await ctx.js.publish(subjects.work("n-garbled"), b"{not json")
        letters = [await dlq.next_msg(timeout=30), await dlq.next_msg(timeout=30)]
        by_error = {m.headers["Novelbus-Error"]: m for m in letters if m.headers}
        assert set(by_error) == {"novel-not-found", "bad-message"}
        ghost = by_error["novel-not-found"]
        assert decode(ghost.data, WorkNotice).novel_id == "n-ghost"
        assert ghost.headers is not None and ghost.headers["Novelbus-Deliveries"] == str(WORK_MAX_DELIVER)
        assert "n-ghost" in ghost.headers["Novelbus-Error-Detail"]
        assert ghost.headers["Novelbus-Subject"] == subjects.work("n-ghost")
        garbled = by_error["bad-message"]
        assert garbled.data == b"{not json" and garbled.headers is not None
        assert garbled.headers["Novelbus-Deliveries"] == "1"
        await dlq.unsubscribe()
        info = await ctx.js.stream_info(subjects.dlq_stream)
        assert info.state.messages == 2  # dead-lettered once each, not once per delivery

        novel_id, _ = await run_novel(rt, parse_novel_file(sample_novel_bytes()))
        assert (await store.get_novel(ctx.pool, novel_id)).status == "finished"
