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


async def test_a_unit_committed_left_in_the_ledger_only_is_republished_once(stack: Runtime) -> None:
    """REL-7"""
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


# --- the wiring, by effect: who calls the republish path -------------------------------------

async def _committed_unit(ctx: Any, novel_id: str, chapter_id: str, scene_id: str, *, holder: str = "driver-9",
                          n: int = 1) -> tuple[str, Any]:
    """A unit committed in the store (what a writer's commit leaves), and its claim."""
    from tests.e2e.test_recovery_claims import BODY
    unit_id = await store.prepare_unit(ctx.pool, novel_id, chapter_id, scene_id, fragment=1, continuation_anchor=None)
    assert await store.hold_lease(ctx.pool, novel_id, unit_id, f"intent-{n}", holder, 30)
    claim = await store.claim_unit(ctx.pool, novel_id, unit_id, f"intent-{n}", mode="subagent")
    await store.commit_body(ctx.pool, novel_id, unit_id, claim.token, BODY, run_id=f"run-{n}", context_hash=None)
    return unit_id, claim


async def _ledger_only(ctx: Any, event: ev.Event) -> None:
    """The once-only event's ledger row without its publish: its emitter died in between."""
    from novelbus.actors.context import once_key
    key = once_key(event)
    assert key is not None
    await store.append_event_once(ctx.pool, event.novel_id, type_tag(event), msgspec.to_builtins(event), key)


async def _unit_committed_ledger_only(ctx: Any, novel_id: str, unit_id: str) -> None:
    commit = await store.get_commit_for_unit(ctx.pool, novel_id, unit_id)
    assert commit is not None
    await _ledger_only(ctx, ev.UnitCommitted(
        novel_id=novel_id, unit_id=unit_id, commit_id=commit.commit_id, effective_characters=10,
        total_characters=10, body_sha256="0" * 64, context_sha256=None))


async def _no_notice(*args: Any, **kwargs: Any) -> str:
    return ""


def _first_scene(nf: Any, index: int = 0) -> tuple[str, str]:
    chapter = nf.outline.ordered_chapters()[0].chapterId
    scene = nf.outline.scenes_of(chapter)[index]
    return chapter, scene.sceneId


async def test_the_sweep_publishes_a_ledger_only_unit_committed_of_a_dead_flow(stack: Runtime) -> None:
    """REL-7 wiring: the sweep that accounts a commit whose flow is gone (here: the driver instance
    restarted) makes its ledger-only `unit.committed` visible in the stream, once, with no other
    action; a second sweep (redelivery) adds nothing."""
    from novelbus.actors.accounting import Accounting
    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(ctx.pool, nf)
    unit_id, _ = await _committed_unit(ctx, novel_id, *_first_scene(nf))
    await _unit_committed_ledger_only(ctx, novel_id, unit_id)
    assert await _in_stream(stack, novel_id, "unit.committed") == 0
    acc = Accounting(ctx, "driver-9", _no_notice, lease_s=30)  # (no notice: the stack's driver stays idle)
    report = await acc.reconcile(restarted=True)
    assert report.turns == [(novel_id, unit_id)]
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    await acc.reconcile(restarted=True)
    await acc.reconcile()
    assert await _in_stream(stack, novel_id, "unit.committed") == 1


async def test_an_interrupted_flow_publishes_its_ledger_only_unit_committed(stack: Runtime) -> None:
    """REL-7 wiring: `UnitFlow.settle` of a flow whose commit landed but whose reply never came (the
    claim manager died after its ledger row) makes `unit.committed` visible in the stream, once."""
    from novelbus.actors.unit_flow import UnitFlow
    from novelbus.messages import claims as cm
    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(ctx.pool, nf)
    unit_id, claim = await _committed_unit(ctx, novel_id, *_first_scene(nf))
    await _unit_committed_ledger_only(ctx, novel_id, unit_id)
    assert await _in_stream(stack, novel_id, "unit.committed") == 0
    granted = cm.ClaimGranted(claim_id=claim.claim_id, unit_id=unit_id, attempt=1, delegation_id="d-1",
                              instance="claims-0")
    flow = UnitFlow(ctx, writer_timeout_s=10)
    outcome = await flow.settle(novel_id, unit_id, granted, "flow-interrupted")
    assert outcome is not None and outcome.ok
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    await flow.settle(novel_id, unit_id, granted, "flow-interrupted")  # settled again: still once
    assert await _in_stream(stack, novel_id, "unit.committed") == 1


async def _once_only_in_stream(rt: Runtime, novel_id: str) -> list[str]:
    """The once-only events of the novel in stream order: `type:subject`."""
    from novelbus.bench.chaos import stream_events
    out = []
    for kind, payload in await stream_events(rt.ctx, rt.ctx.subjects, novel_id):
        if kind == "unit.committed":
            out.append(f"{kind}:{payload['unitId']}")
        elif kind == "chapter.completed":
            out.append(f"{kind}:{payload['chapterId']}")
        elif kind == "novel.finished":
            out.append(kind)
    return out


async def test_chapter_completed_and_novel_finished_left_ledger_only_are_published_once_in_order(
        stack: Runtime) -> None:
    """REL-7: the driver died between writing `chapter.completed` / `novel.finished` and publishing
    them. Its restart's reconciliation publishes both from their rows: each once in the stream,
    after the chapter's commits and chapter before finish (per-novel order); reconciling again
    (a redelivered restart, the periodic sweep) adds nothing."""
    from novelbus.actors.accounting import Accounting
    from novelbus.bench.chaos import chaos_novel
    ctx = stack.ctx
    nf = chaos_novel(2, seed=5).model_copy(update={"novelId": None})  # one chapter of two scenes
    novel_id = await store.create_novel(ctx.pool, nf)
    chapter_id = nf.outline.ordered_chapters()[0].chapterId
    units = []
    for n in (1, 2):
        unit_id, claim = await _committed_unit(ctx, novel_id, *_first_scene(nf, n - 1), n=n)
        await store.account_turn(ctx.pool, novel_id, claim.claim_id, outcome="committed", unit_id=unit_id)
        commit = await store.get_commit_for_unit(ctx.pool, novel_id, unit_id)
        assert commit is not None
        await ctx.emit(ev.UnitCommitted(novel_id=novel_id, unit_id=unit_id, commit_id=commit.commit_id,
                                        effective_characters=10, total_characters=10, body_sha256="0" * 64,
                                        context_sha256=None))  # published as usual
        units.append(unit_id)
    await _ledger_only(ctx, ev.ChapterCompleted(novel_id=novel_id, chapter_id=chapter_id))
    await ctx.pool.execute("UPDATE novels SET status = 'finished', finished_at = now() WHERE novel_id = $1",
                           novel_id)
    await _ledger_only(ctx, ev.NovelFinished(novel_id=novel_id, units=2, commits=2, characters=20))
    expected = [f"unit.committed:{u}" for u in units]
    assert await _once_only_in_stream(stack, novel_id) == expected  # the two events: table only

    acc = Accounting(ctx, "driver-9", _no_notice, lease_s=30)
    await acc.reconcile(restarted=True)
    expected += [f"chapter.completed:{chapter_id}", "novel.finished"]
    assert await _once_only_in_stream(stack, novel_id) == expected
    await acc.reconcile(restarted=True)
    await acc.reconcile()
    assert await _once_only_in_stream(stack, novel_id) == expected
    rows = await store.list_events(ctx.pool, novel_id)
    assert sum(r.type == "chapter.completed" for r in rows) == 1 and sum(r.type == "novel.finished" for r in rows) == 1
