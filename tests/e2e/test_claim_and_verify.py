"""CLM-1: a claim reply carries claim id, unit id, attempt and delegation id — never the token.
VER-1, VER-3, VER-4: verification reads the store; receipts and structured failures."""

from __future__ import annotations

import msgspec
import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import RemoteError, request
from novelbus.bus.codec import encode
from novelbus.messages import claims as cm
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import verify as vm
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel

BODY = CommitBody(paragraphs=["Rain walked in from the sea and found the harbour asleep."],
                  scene_completion=SceneCompletion(completed=True, basis="the harbour scene is done"))


async def _prepared(rt: Runtime) -> tuple[str, str]:
    nf = parse_novel_file(sample_novel_bytes())
    novel_id = await store.create_novel(rt.ctx.pool, nf)
    scene = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)[0]
    unit_id = await store.prepare_unit(rt.ctx.pool, novel_id, scene.chapterId, scene.sceneId, fragment=1,
                                       continuation_anchor=None)
    return novel_id, unit_id


async def test_claim_reply_has_ids_and_never_the_token(stack: Runtime) -> None:
    """CLM-1"""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    data, headers = encode(cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-1", mode="subagent"))
    raw = await ctx.nc.request(ctx.subjects.claims, data, headers=headers, timeout=10)
    reply = raw.data.decode()
    delegations = stack.actor("claims").state.delegations  # type: ignore[attr-defined]
    (delegation_id, d), = delegations.items()
    assert d.unit_id == unit_id and d.novel_id == novel_id and d.intent_id == "i-1" and d.dispatches == 0
    assert d.execution_token not in reply and d.execution_token not in repr(d)
    for field in ('"claimId"', '"unitId"', '"attempt"', '"delegationId"'):
        assert field in reply
    assert delegation_id in reply


async def test_claim_reply_carries_the_first_dispatch_grant_counted_against_the_limit(
    stack: Runtime,
) -> None:
    """PERF-2 with CLM-3 and DRV-4: asked for it, the claim reply grants dispatch 1 (registered before
    the reply leaves); it counts against writerDispatchLimit like any BeginDispatch, and a retried
    claim of the same intent replays the same grant instead of granting another."""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    limit = (await store.get_novel(ctx.pool, novel_id)).config.budgets.writerDispatchLimit
    ask = cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-1", mode="subagent", begin_dispatch=True)
    claim = await request(ctx.nc, ctx.subjects.claims, ask, cm.ClaimGranted)
    assert (claim.dispatch, claim.dispatch_limit) == (1, limit)
    again = await request(ctx.nc, ctx.subjects.claims, ask, cm.ClaimGranted)
    assert again == claim
    grants = [claim.dispatch]
    for _ in range(limit + 1):
        try:
            grant = await request(ctx.nc, ctx.subjects.claims, cm.BeginDispatch(delegation_id=claim.delegation_id),
                                  cm.DispatchGranted)
        except RemoteError as e:
            assert e.code == "dispatch-limit"
            break
        grants.append(grant.dispatch)
    assert grants == list(range(1, limit + 1))
    # Not asked for: no grant rides on the reply (the first BeginDispatch is dispatch 1).
    await store.release_claim(ctx.pool, novel_id, unit_id, reason="test")
    plain = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-2", mode="subagent"),
                          cm.ClaimGranted)
    assert plain.dispatch is None and plain.dispatch_limit is None


async def test_receipt_from_the_store_with_envelope(stack: Runtime) -> None:
    """VER-3"""
    ctx = stack.ctx
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    commit = (await store.list_commits(ctx.pool, novel_id))[0]
    verified = await request(ctx.nc, ctx.subjects.verify,
                             vm.VerifyCommit(novel_id=novel_id, unit_id=commit.unit_id, claim_id=commit.claim_id,
                                             run_id="any"), vm.Verified)
    r = verified.receipt
    assert verified.ok and r is not None and verified.scene_completed is True
    assert (r.commit_id, r.unit_id, r.claim_id) == (commit.commit_id, commit.unit_id, commit.claim_id)
    assert r.effective_characters == commit.effective_chars > 0
    assert len(r.body_sha256) == 64 and r.context_sha256 is not None and len(r.context_sha256) == 64
    assert r.run_id == commit.run_id and r.run_id.startswith("run-")


async def test_structured_failures(stack: Runtime) -> None:
    """VER-1, VER-4"""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    claim = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-2", mode="subagent"),
                          cm.ClaimGranted)
    # not committed yet: a writer saying "done" changes nothing (VER-1)
    v = await request(ctx.nc, ctx.subjects.verify, vm.VerifyCommit(novel_id=novel_id, unit_id=unit_id,
                                                                   claim_id=claim.claim_id, run_id="r"), vm.Verified)
    assert (v.ok, v.failure) == (False, "not-committed")
    await request(ctx.nc, ctx.subjects.commit(claim.instance),
                  cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=unit_id, body=BODY,
                                run_id="r"), cm.CommitReceipt)
    v = await request(ctx.nc, ctx.subjects.verify, vm.VerifyCommit(novel_id=novel_id, unit_id=unit_id,
                                                                   claim_id="claim-someone-else", run_id="r"),
                      vm.Verified)
    assert (v.ok, v.failure) == (False, "wrong-claim")


@pytest.mark.parametrize(("paragraph", "code"), [("Chapter 17 begins here", "guard"),
                                                  ("It begins here.\n\nThen it goes on.", "bad-paragraph")])
async def test_a_candidate_breaking_a_body_rule_is_refused_at_its_commit(
        stack: Runtime, paragraph: str, code: str) -> None:
    """VER-2, VER-4, HOUSE-6: the body's rules and the prose guard refuse a candidate at its commit
    (the claim manager's one check, then the store's transaction), with a structured code and a
    detail that names the paragraph, never quotes it; nothing is committed."""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    claim = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-body", mode="subagent"),
                          cm.ClaimGranted)
    body = CommitBody(paragraphs=["A quiet beginning.", paragraph],
                      scene_completion=SceneCompletion(completed=True, basis="b"))
    with pytest.raises(RemoteError) as refused:
        await request(ctx.nc, ctx.subjects.commit(claim.instance),
                      cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=unit_id,
                                    body=body, run_id="r", shape="W1"), cm.CommitReceipt)
    assert refused.value.code == code
    assert refused.value.detail and "begins here" not in refused.value.detail
    assert await store.get_commit_for_unit(ctx.pool, novel_id, unit_id) is None


async def test_a_refusal_answered_again_to_a_retried_request_is_counted_once(stack: Runtime) -> None:
    """QUAL-3: a candidate the content gate refuses is one refusal per attempt, however often the
    request is retried (its reply lost); the same candidate in another attempt is another."""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    junk = CommitBody(paragraphs=["...", "!!!"], scene_completion=SceneCompletion(completed=True, basis="b"))
    for attempt in ("run-1:check-1", "run-1:check-1", "run-1:check-2"):
        v = await request(ctx.nc, ctx.subjects.verify,
                          vm.ValidateDraft(novel_id=novel_id, unit_id=unit_id, body=junk, claim_id="claim-a",
                                           attempt=attempt),
                          vm.Verified)
        assert (v.ok, v.failure, v.code) == (False, "quality", "no-letters")
    assert await store.refusal_counts(ctx.pool, novel_id, "unit.refused") == {"no-letters": 2}


async def test_a_forged_run_request_leaves_no_writer_run_row(stack: Runtime) -> None:
    """CTX-14: a well-formed RunWriter naming a real novel and unit, but no live claim of that unit
    (no claim id, or an invented one), is refused before anything is written: no writer_runs row,
    no writer.dispatched event. The same request under the unit's live claim is recorded."""
    ctx = stack.ctx
    novel_id, unit_id = await _prepared(stack)
    before = len(await store.list_events(ctx.pool, novel_id))

    def run(run_id: str, claim_id: str, delegation_id: str = "dlg-forged-0") -> rm.RunWriter:
        return rm.RunWriter(novel_id=novel_id, unit_id=unit_id, run_id=run_id, delegation_id=delegation_id,
                            instance="forged", shape="W1", pack_text="[[unit]]\n", dispatch=1, claim_id=claim_id)

    for run_id, claim_id in (("run-forged-1", ""), ("run-forged-2", "claim-invented")):
        with pytest.raises(RemoteError) as refused:
            await request(ctx.nc, ctx.subjects.runs, run(run_id, claim_id), rm.WriterResult, timeout=10)
        assert refused.value.code == "unit-not-claimed"
    assert await store.list_writer_runs(ctx.pool, novel_id) == []
    assert len(await store.list_events(ctx.pool, novel_id)) == before

    claim = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id="i-run", mode="subagent"),
                          cm.ClaimGranted)
    with pytest.raises(RemoteError):  # the invented claim id is still refused while a real claim is live
        await request(ctx.nc, ctx.subjects.runs, run("run-forged-3", "claim-invented"), rm.WriterResult,
                      timeout=10)
    assert await store.list_writer_runs(ctx.pool, novel_id) == []
    pack = await request(ctx.nc, ctx.subjects.packs, pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape="full"),
                         pm.PackReady)
    result = await request(ctx.nc, ctx.subjects.runs,
                           msgspec.structs.replace(run("run-real", claim.claim_id, claim.delegation_id),
                                                   instance=claim.instance, pack_text=pack.text,
                                                   context_sha256=pack.context_sha256),
                           rm.WriterResult, timeout=30)
    assert result.ok
    assert [r.run_id for r in await store.list_writer_runs(ctx.pool, novel_id)] == ["run-real"]
