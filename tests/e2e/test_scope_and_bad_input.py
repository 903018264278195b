"""CLM-2, REL-5: commits outside the delegation are refused and recorded.
BUS-4, REL-3: malformed messages on every command subject get error replies; actors keep serving."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import RemoteError, request
from novelbus.bus.codec import decode_reply, encode
from novelbus.messages import claims as cm
from novelbus.messages import packs as pm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.messages.errors import ErrorReply
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes


async def _claimed_novel(rt: Runtime) -> tuple[str, str, str, cm.ClaimGranted]:
    """A novel with its first two scenes prepared and the first one claimed (no driver involved)."""
    ctx = rt.ctx
    nf = parse_novel_file(sample_novel_bytes())
    novel_id = await store.create_novel(ctx.pool, nf)
    outline = nf.outline
    first, second = outline.scenes_of(outline.ordered_chapters()[0].chapterId)[:2]
    u1 = await store.prepare_unit(ctx.pool, novel_id, first.chapterId, first.sceneId, fragment=1,
                                  continuation_anchor=None)
    u2 = await store.prepare_unit(ctx.pool, novel_id, second.chapterId, second.sceneId, fragment=1,
                                  continuation_anchor=None)
    claim = await request(ctx.nc, ctx.subjects.claims,
                          cm.ClaimUnit(novel_id=novel_id, unit_id=u1, intent_id="intent-test", mode="subagent"),
                          cm.ClaimGranted)
    return novel_id, u1, u2, claim


BODY = CommitBody(paragraphs=["The lamps along the quay went out one by one."],
                  scene_completion=SceneCompletion(completed=True, basis="the meeting happened"))


async def test_commit_for_another_unit_is_refused_and_recorded(stack: Runtime) -> None:
    """CLM-2"""
    ctx = stack.ctx
    novel_id, u1, u2, claim = await _claimed_novel(stack)
    with pytest.raises(RemoteError) as info:
        await request(ctx.nc, ctx.subjects.commit(claim.instance),
                      cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=u2, body=BODY,
                                    run_id="run-x"), cm.CommitReceipt)
    assert info.value.code == "scope-violation"
    assert (await store.get_commit_for_unit(ctx.pool, novel_id, u2)) is None
    assert (await store.get_unit(ctx.pool, novel_id, u2)).state == "prepared"
    events = [e.type for e in await store.list_events(ctx.pool, novel_id)]
    assert "scope.violation" in events

    # the delegation still serves its own unit afterwards
    receipt = await request(ctx.nc, ctx.subjects.commit(claim.instance),
                            cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=u1,
                                          body=BODY, run_id="run-x"), cm.CommitReceipt)
    assert receipt.unit_id == u1 and not receipt.duplicate


async def test_unknown_delegation_is_refused_and_recorded(stack: Runtime) -> None:
    """CLM-2"""
    ctx = stack.ctx
    novel_id, u1, _, claim = await _claimed_novel(stack)
    with pytest.raises(RemoteError) as info:
        await request(ctx.nc, ctx.subjects.commit(claim.instance),
                      cm.CommitUnit(delegation_id="dlg-claims-0-forged", novel_id=novel_id, unit_id=u1, body=BODY,
                                    run_id="run-x"), cm.CommitReceipt)
    assert info.value.code == "delegation-not-found"
    assert (await store.get_commit_for_unit(ctx.pool, novel_id, u1)) is None
    assert "delegation.refused" in [e.type for e in await store.list_events(ctx.pool, novel_id)]


def _valid_probe(subjects: Any, claim: cm.ClaimGranted, novel_id: str) -> dict[str, tuple[str, msgspec.Struct]]:
    """One well-formed request per command subject, each with a known answer."""
    return {
        "claims": (subjects.claims, cm.BeginDispatch(delegation_id=claim.delegation_id)),
        "commit": (subjects.commit(claim.instance),
                   cm.CommitUnit(delegation_id="dlg-unknown", novel_id=novel_id, unit_id="nope", body=BODY,
                                 run_id="r")),
        "packs": (subjects.packs, pm.RenderPack(novel_id=novel_id, unit_id=claim.unit_id, shape="trimmed")),
        "verify": (subjects.verify, vm.VerifyCommit(novel_id=novel_id, unit_id=claim.unit_id,
                                                    claim_id=claim.claim_id, run_id="r")),
        "usage": (subjects.usage, um.RecordTurn(novel_id=novel_id, unit_id=claim.unit_id, mode="subagent", turn=0,
                                                provider="test", calls=[], tool_bytes={}, writer_output_chars=0,
                                                committed=False)),
    }


OWN_TAG = {"claims": "claims.claim", "commit": "claims.commit", "packs": "packs.render", "runs": "runs.run",
           "verify": "verify.commit", "usage": "usage.turn"}

BAD_PAYLOADS = [
    (b"\xff\xfe not json", "bad-message"),
    (b'{"type": "no.such.type"}', "unknown-type"),
    (b'{"type": "%(tag)s", "novelId": 7}', "bad-message"),  # the subject's own type, wrong field types
    (b"[]", "bad-message"),
    (b"x" * 600_000, "too-large"),
]


async def test_malformed_messages_get_error_replies_and_actors_keep_serving(stack: Runtime) -> None:
    """BUS-4"""
    ctx = stack.ctx
    novel_id, _, _, claim = await _claimed_novel(stack)
    probes = _valid_probe(ctx.subjects, claim, novel_id)
    subjects = dict(probes)
    subjects["runs"] = (ctx.subjects.runs, None)  # type: ignore[assignment]
    for name, (subject, _) in subjects.items():
        for payload, code in BAD_PAYLOADS:
            if len(payload) > 500_000 and name != "claims":
                continue  # one oversized message is enough; NATS max_payload is the real cap
            payload = payload.replace(b"%(tag)s", OWN_TAG[name].encode())
            reply = await ctx.nc.request(subject, payload, timeout=10)
            answer = decode_reply(reply.data, ErrorReply)
            assert isinstance(answer, ErrorReply), name
            assert answer.code == code, (name, payload[:40], answer)
    # every actor still answers a valid request afterwards
    for name, (subject, msg) in probes.items():
        data, headers = encode(msg)
        reply = await ctx.nc.request(subject, data, headers=headers, timeout=10)
        answer = msgspec.json.decode(reply.data)
        assert answer.get("type") != "error" or answer["code"] in ("delegation-not-found",), (name, answer)
    stats = stack.actor("claims").services[0].stats  # type: ignore[attr-defined]
    assert stats["bad-message"] >= 3 and stats["unknown-type"] >= 1
