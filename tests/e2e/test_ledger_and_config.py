"""PLAN-4 and PLAN-5 over the bus: the requirements ledger (directives hold claims, a blocked one
pauses `requirement-conflict` until a cited clarification resolves it) and the configuration of a
running novel (validated like create; a budget pause lifted when the budget allows again;
preflight warnings)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import RemoteError
from novelbus.bus.notices import publish_notice
from novelbus.bus.steering import SteeringClient
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from novelbus.novel.requirements import RequirementUpdate, ResolvedBy
from tests.e2e.test_steering import watch

SECRET = "Let the harbourmaster confess in the final storm"


@pytest.fixture
async def rt(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as runtime:
        yield runtime


def novel_file(chapters: int = 1, scenes: int = 3, **config: Any) -> NovelFile:
    data = generate_novel_file(chapters, scenes, unit_chars=500)
    data["config"].update(config)
    return NovelFile.model_validate(data)


async def test_directive_idempotent_and_claims_refused_while_open(rt: Runtime) -> None:
    """PLAN-4: receiving is idempotent on the message id (one row, one event); the same id with
    another text is refused; while a requirement is pending a claim is refused, and a claim
    carrying a stale watermark is refused too (SPEC §16 Claim)."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file())
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    first = await steer.direct(novel_id, SECRET, "msg-7")
    again = await steer.direct(novel_id, SECRET, "msg-7")
    assert (first.requirement_id, first.sequence, first.duplicate) == ("req-1", 1, False)
    assert (again.requirement_id, again.duplicate) == ("req-1", True)
    with pytest.raises(RemoteError) as clash:
        await steer.direct(novel_id, "something else", "msg-7")
    assert clash.value.code == "message-id-conflict" and "something" not in clash.value.detail
    ledger = await steer.requirements(novel_id)
    assert [(r.requirement_id, r.status, r.text) for r in ledger.requirements] == [("req-1", "pending", SECRET)]

    # the claim guard, on a novel no driver looks at (the directive goes to the store directly)
    quiet = await store.create_novel(pool, novel_file())
    await store.receive_requirement(pool, quiet, "Keep it quiet.", "msg-q")
    unit = await store.prepare_unit(pool, quiet, "ch001", "ch001s01", fragment=1, continuation_anchor=None)
    with pytest.raises(store.RequirementsOpen):
        await store.claim_unit(pool, quiet, unit, "intent-1", mode="subagent")
    state = await steer.outline(quiet)
    assert state.awaiting == "requirement-pending"
    await store.pause_novel(pool, quiet, "user-request")  # keep the driver away from it
    await steer.revise(quiet, {}, expected_revision=state.revision, reason="apply",
                       requirements=[RequirementUpdate(requirement_id="req-1", status="applied")])
    await store.resume_novel(pool, quiet)
    with pytest.raises(store.WatermarkConflict):
        await store.claim_unit(pool, quiet, unit, "intent-2", mode="subagent", expected_watermark=0)
    claim = await store.claim_unit(pool, quiet, unit, "intent-3", mode="subagent", expected_watermark=1)
    assert claim.unit_id == unit
    state = await steer.outline(novel_id)
    await steer.revise(novel_id, {}, expected_revision=state.revision, reason="apply",
                       requirements=[RequirementUpdate(requirement_id="req-1", status="applied")])
    await events.wait_for(lambda e: isinstance(e, ev.RequirementApplied))
    assert len(events.of(ev.RequirementReceived)) == 1
    received = events.of(ev.RequirementReceived)[0]
    assert received.chars == len(SECRET) and len(received.sha256) == 64
    payloads = json.dumps([e.payload for e in await store.list_events(pool, novel_id)])
    assert "harbourmaster" not in payloads  # never the directive text in an event


async def test_blocked_pauses_and_a_cited_clarification_resumes(rt: Runtime) -> None:
    """PLAN-4: a directive marked blocked pauses the novel `requirement-conflict`; resolving it
    needs `resolvedBy` citing a message in the ledger; the old conflict is kept; the novel goes on."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(scenes=2))
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    await steer.direct(novel_id, "Kill the narrator in chapter one.", "msg-1")
    await publish_notice(rt.ctx, novel_id, reason="test")
    asked = await events.wait_for(lambda e: isinstance(e, ev.OutlineRequested))
    assert asked.why == "requirement-pending" and asked.pending_requirements == 1
    state = await steer.outline(novel_id)
    blocked = await steer.revise(novel_id, {}, expected_revision=state.revision, reason="conflict", requirements=[
        RequirementUpdate(requirement_id="req-1", status="blocked", blocked_reason="the narrator tells the ending")])
    assert blocked.blocked == ["req-1"] and not blocked.resumed
    await publish_notice(rt.ctx, novel_id, reason="test")
    await events.wait_for(lambda e: isinstance(e, ev.NovelPaused) and e.reason == "requirement-conflict")
    # no resolution without a citation, nor with one that is not in the ledger
    for resolved_by in (None, ResolvedBy(kind="clarification", message_id="msg-404")):
        with pytest.raises(RemoteError) as refused:
            await steer.revise(novel_id, {}, expected_revision=blocked.revision, reason="try", requirements=[
                RequirementUpdate(requirement_id="req-1", status="applied", resolved_by=resolved_by)])
        assert refused.value.code == "blocked-resolution-citation"
    clarified = await steer.direct(novel_id, "Only wound the narrator, then.", "msg-2")
    assert clarified.requirement_id == "req-2"
    done = await steer.revise(novel_id, {}, expected_revision=blocked.revision, reason="clarified", requirements=[
        RequirementUpdate(requirement_id="req-1", status="applied",
                          resolved_by=ResolvedBy(kind="clarification", message_id="msg-2")),
        RequirementUpdate(requirement_id="req-2", status="applied")])
    assert done.applied == ["req-1", "req-2"] and done.requirement_watermark == 2 and done.resumed
    ledger = await steer.requirements(novel_id)
    r1 = ledger.requirements[0]
    assert r1.status == "applied" and r1.applied_revision == done.revision and r1.blocked_reason is None
    assert r1.resolved_conflict is not None
    assert r1.resolved_conflict.reason == "the narrator tells the ending"
    assert r1.resolved_conflict.resolved_by == ResolvedBy(kind="clarification", message_id="msg-2")
    await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=90)
    applied = events.of(ev.RequirementApplied)
    assert [(a.requirement_id, a.resolved_by, a.resolved_message_id) for a in applied] == [
        ("req-1", "clarification", "msg-2"), ("req-2", None, None)]
    assert len(events.of(ev.RequirementBlocked)) == 1


async def test_budget_pause_goes_on_after_config(rt: Runtime) -> None:
    """PLAN-5: invalid values are refused naming the field (nothing changed, never clamped); a
    novel paused for `budget` goes on by itself once `budgets.maxTurns` allows it again;
    `novel.config-changed` names the fields."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(scenes=4, budgets={"maxTurns": 2}))
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    await publish_notice(rt.ctx, novel_id, reason="test")
    paused = await events.wait_for(lambda e: isinstance(e, ev.NovelPaused))
    assert paused.reason == "budget"
    for changes, field in (({"budgets.maxTurns": 0}, "budgets.maxTurns"),
                           ({"budgets.maxTurns": "lots"}, "budgets.maxTurns"),
                           ({"budgets.maxTurnz": 5}, "budgets.maxTurnz"),
                           ({"length.toleranceRatio": 1.5}, "length.toleranceRatio")):
        with pytest.raises(RemoteError) as bad:
            await steer.config(novel_id, changes)
        assert bad.value.code == "config-invalid" and field in bad.value.detail, bad.value.detail
    assert (await store.get_novel(pool, novel_id)).config.budgets.maxTurns == 2  # nothing changed
    reply = await steer.config(novel_id, {"budgets.maxTurns": 400})
    assert reply.changed == ["budgets.maxTurns"] and reply.resumed
    assert reply.config["budgets"]["maxTurns"] == 400
    await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=90)
    changed = events.of(ev.ConfigChanged)
    assert [c.fields for c in changed] == [["budgets.maxTurns"]]
    same = await steer.config(novel_id, {})
    assert same.changed == [] and same.config["budgets"]["maxTurns"] == 400


async def test_preflight_warns_when_the_outline_cannot_fit(rt: Runtime) -> None:
    """PLAN-5: more scenes than maxTurns, or a length target under ~300 effective characters per
    unit, get a warning with the figure at revise and config time."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(scenes=3))
    await store.pause_novel(pool, novel_id, "user-request")
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    reply = await steer.config(novel_id, {"budgets.maxTurns": 2, "length.targetCharacters": 600})
    assert any("3 scenes" in w and "maxTurns 2" in w for w in reply.warnings), reply.warnings
    assert any("about 200 effective characters per unit" in w for w in reply.warnings), reply.warnings
    fine = await steer.config(novel_id, {"budgets.maxTurns": 50, "length.targetCharacters": 3000})
    assert fine.warnings == []
    state = await steer.outline(novel_id)
    assert state.outline is not None
    more = [dict(s, sceneId=f"x{i}", order=10 + i) for i, s in enumerate(state.outline["scenes"] * 20)]
    revised = await steer.revise(novel_id, {"scenes": state.outline["scenes"] + more},
                                 expected_revision=state.revision, reason="many scenes")
    assert any("63 scenes" in w and "maxTurns 50" in w for w in revised.warnings), revised.warnings
