"""PERF-2 with STORE-2, CLM-2, REL-2, REL-7: the claim manager's `unit.committed` ledger
row is written by the commit's own statement (`store.commit_body_with_event`, `nb_commit_body_event`) and
then published under its seq; a claim manager killed between the statement and the publish leaves
the row ledger-only, and the path that applies publishes it, once, in per-novel order: the flow
that finds its commit landed (`UnitFlow.landed`), the restarted claim manager (`recover`)."""

from __future__ import annotations

from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec
import pytest

from novelbus import store
from novelbus.actors.claims import ClaimManager
from novelbus.actors.context import ActorContext, once_key_of_commit
from novelbus.actors.runtime import Runtime
from novelbus.actors.unit_flow import UnitFlow
from novelbus.bus.client import request
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.test_claim_and_verify import BODY
from tests.e2e.test_republish import _in_stream, _once_only_in_stream


def _entry(novel_id: str, unit_id: str) -> tuple[str, dict[str, Any]]:
    return ActorContext.ledger_entry(ev.UnitCommitted(
        novel_id=novel_id, unit_id=unit_id, commit_id="", effective_characters=0, total_characters=0,
        body_sha256="", context_sha256=None))


async def _claimed(ctx: ActorContext, index: int = 0, novel_id: str | None = None) -> tuple[str, str, Any]:
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    if novel_id is None:
        novel_id = await store.create_novel(ctx.pool, nf)
    scene = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)[index]
    unit_id = await store.prepare_unit(ctx.pool, novel_id, scene.chapterId, scene.sceneId, fragment=1,
                                       continuation_anchor=None)
    claim = await store.claim_unit(ctx.pool, novel_id, unit_id, f"intent-{index}", mode="subagent",
                                   claimed_by="claims-0")
    return novel_id, unit_id, claim


async def _rows(ctx: ActorContext, novel_id: str) -> list[store.EventRow]:
    return [r for r in await store.list_events(ctx.pool, novel_id) if r.type == "unit.committed"]


async def _commit_statement(ctx: ActorContext, novel_id: str, unit_id: str, token: str) -> tuple[Any, int | None]:
    """Exactly the claim manager's commit statement, without its publish (a kill right after it)."""
    return await store.commit_body_with_event(ctx.pool, novel_id, unit_id, token, BODY, run_id="run-1",
                                              context_hash=None, event=_entry(novel_id, unit_id),
                                              once_key=once_key_of_commit(novel_id, unit_id))


async def test_the_commit_writes_its_unit_committed_row_once_in_one_statement(stack: Runtime) -> None:
    """PERF-2, STORE-2: One round trip writes the commit and exactly one `unit.committed` row (once-key set, payload
    = the receipt's figures); a replay (REL-2) writes no second row and returns no seq."""
    ctx = stack.ctx
    novel_id, unit_id, claim = await _claimed(ctx)
    receipt, seq = await _commit_statement(ctx, novel_id, unit_id, claim.token)
    assert not receipt.duplicate and seq is not None
    (row,) = await _rows(ctx, novel_id)
    assert row.seq == seq
    assert msgspec.convert(row.payload, ev.UnitCommitted) == ev.UnitCommitted(
        novel_id=novel_id, unit_id=unit_id, commit_id=receipt.commit_id,
        effective_characters=receipt.effective_characters, total_characters=receipt.total_characters,
        body_sha256=receipt.body_hash, context_sha256=None)
    assert await store.event_by_once_key(ctx.pool, once_key_of_commit(novel_id, unit_id)) == row
    again, seq2 = await _commit_statement(ctx, novel_id, unit_id, claim.token)
    assert again.duplicate and again.commit_id == receipt.commit_id and seq2 is None
    assert len(await _rows(ctx, novel_id)) == 1


async def test_a_failure_after_the_statement_leaves_both_or_neither(stack: Runtime) -> None:
    """PERF-2, STORE-2: Same transaction: the event row failing inside the statement (a trigger refusing it) leaves
    no commit and the unit claimed; a transaction rolled back right after the statement leaves
    neither; committed, both are there."""
    ctx = stack.ctx
    novel_id, unit_id, claim = await _claimed(ctx)
    await ctx.pool.execute(
        "CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " RAISE EXCEPTION 'injected'; END $$;"
        " CREATE TRIGGER refuse_event BEFORE INSERT ON events FOR EACH ROW"
        " WHEN (NEW.type = 'unit.committed') EXECUTE FUNCTION refuse_event()")
    with pytest.raises(asyncpg.RaiseError, match="injected"):
        await _commit_statement(ctx, novel_id, unit_id, claim.token)
    assert await store.get_commit_for_unit(ctx.pool, novel_id, unit_id) is None
    assert (await store.get_unit(ctx.pool, novel_id, unit_id)).state == "claimed"
    await ctx.pool.execute("DROP TRIGGER refuse_event ON events")

    class Injected(Exception):
        pass

    async with ctx.pool.acquire() as conn:
        with pytest.raises(Injected):
            async with conn.transaction():
                _, seq = await store.commit_body_with_event(
                    conn, novel_id, unit_id, claim.token, BODY, run_id="run-1", context_hash=None,
                    event=_entry(novel_id, unit_id), once_key=once_key_of_commit(novel_id, unit_id))
                assert seq is not None
                raise Injected  # the kill right after the statement, before its transaction ends
    assert await store.get_commit_for_unit(ctx.pool, novel_id, unit_id) is None
    assert await _rows(ctx, novel_id) == []
    _, seq = await _commit_statement(ctx, novel_id, unit_id, claim.token)
    assert await store.get_commit_for_unit(ctx.pool, novel_id, unit_id) is not None
    assert [r.seq for r in await _rows(ctx, novel_id)] == [seq]


async def test_a_repeated_commit_unit_writes_no_second_row_and_publishes_once(stack: Runtime) -> None:
    """CLM-2, REL-2: Through the claim manager: CommitUnit, then the same CommitUnit again (a retry whose reply
    was lost): the second is a duplicate receipt, no second row, one `unit.committed` in the stream."""
    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(ctx.pool, nf)
    scene = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)[0]
    unit_id = await store.prepare_unit(ctx.pool, novel_id, scene.chapterId, scene.sceneId, fragment=1,
                                       continuation_anchor=None)
    claim = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-1", mode="subagent"),
                          cm.ClaimGranted)
    commit = cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=unit_id, body=BODY,
                           run_id="run-1", context_sha256=None)
    first = await request(ctx.nc, ctx.subjects.commit(claim.instance), commit, cm.CommitReceipt)
    second = await request(ctx.nc, ctx.subjects.commit(claim.instance), commit, cm.CommitReceipt)
    assert not first.duplicate and second.duplicate and second.commit_id == first.commit_id
    (row,) = await _rows(ctx, novel_id)
    assert row.payload["commitId"] == first.commit_id
    assert await _in_stream(stack, novel_id, "unit.committed") == 1


async def test_a_flow_alive_whose_commit_reply_failed_publishes_the_ledger_only_row_once(
        stack: Runtime) -> None:
    """REL-7: The claim manager died between the commit statement and the publish; the flow is alive and
    finds its commit landed although the writer / commit reply failed (`UnitFlow.landed`, the
    success paths of run_claim): the row reaches the stream, once, before the flow returns."""
    ctx = stack.ctx
    novel_id, unit_id, claim = await _claimed(ctx)
    await _commit_statement(ctx, novel_id, unit_id, claim.token)
    assert await _in_stream(stack, novel_id, "unit.committed") == 0
    granted = cm.ClaimGranted(claim_id=claim.claim_id, unit_id=unit_id, attempt=1, delegation_id="d-1",
                              instance="claims-0")
    flow = UnitFlow(ctx, writer_timeout_s=10)
    assert await flow.landed(novel_id, unit_id, granted)
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    assert await flow.landed(novel_id, unit_id, granted)  # again: still once
    assert await _in_stream(stack, novel_id, "unit.committed") == 1
    assert len(await _rows(ctx, novel_id)) == 1
    # Reconciliation finds no commit without its event (the row is there): nothing written twice.
    assert [m for m in await store.commits_without_event(ctx.pool, older_than_s=0) if m.novel_id == novel_id] == []


async def test_a_restarted_claim_manager_publishes_a_ledger_only_row_once_in_order(
        stack: Runtime) -> None:
    """REL-7, CLM-4: A claim manager killed between the statement and the publish of unit 1 (its flow may have
    verified the commit meanwhile and gone on): its next life publishes the row before it serves
    anything, so the stream holds unit 1's `unit.committed` once, before unit 2's; a second restart
    adds nothing."""
    ctx = stack.ctx
    novel_id, u1, claim = await _claimed(ctx)
    await _commit_statement(ctx, novel_id, u1, claim.token)
    assert await _once_only_in_stream(stack, novel_id) == []
    restarted = ClaimManager(ctx)  # the same instance id (claims-0), a new life
    await restarted.recover()
    assert await _once_only_in_stream(stack, novel_id) == [f"unit.committed:{u1}"]
    _, u2, claim2 = await _claimed(ctx, 1, novel_id)
    receipt, seq = await _commit_statement(ctx, novel_id, u2, claim2.token)
    assert seq is not None
    await ctx.publish_recorded(ev.UnitCommitted(
        novel_id=novel_id, unit_id=u2, commit_id=receipt.commit_id, effective_characters=receipt.effective_characters,
        total_characters=receipt.total_characters, body_sha256=receipt.body_hash, context_sha256=None), seq)
    await ClaimManager(ctx).recover()
    assert await _once_only_in_stream(stack, novel_id) == [f"unit.committed:{u1}", f"unit.committed:{u2}"]
    assert len(await _rows(ctx, novel_id)) == 2
