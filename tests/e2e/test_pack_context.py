"""The pack renderer through the actors: frozen context, receipts, projection, fail loud.

CTX-6/CTX-9: every commit receipt carries the hash of a persisted freeze, and that context can be
re-assembled from the store bit for bit. CTX-8: what the writer runner actually receives holds
no ids, hashes, manifests or verdicts. PACK-4: a broken pack starts no writer, fails the unit
naming the missing blocks, and the failure policy pauses the novel.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import RemoteError, request
from novelbus.bus.codec import decode
from novelbus.messages import events as ev
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import NovelFile
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.waiting import drive

HEX_RUN = re.compile(r"[0-9a-f]{32,}")
WRITER_MUST_NOT_SEE = ("runId", "claimId", "delegation", "dlg-", "manifest", "permission", "verdict",
                       "sha256", "candidate", "outlineRevision", "token")


def sample(**config: Any) -> NovelFile:
    data = json.loads(sample_novel_bytes())
    data["config"].update(config)
    return NovelFile.model_validate(data)


async def capture_runs(rt: Runtime) -> tuple[list[rm.RunWriter], Any]:
    """Copies of every RunWriter request (the writer runner serves them on a queue group)."""
    seen: list[rm.RunWriter] = []

    async def on_msg(msg: Any) -> None:
        seen.append(decode(msg.data, rm.RunWriter, msg.headers))

    sub = await rt.ctx.nc.subscribe(rt.ctx.subjects.runs, cb=on_msg)
    return seen, sub


@pytest.mark.parametrize(("shape", "profile"), [("W2", "bounded"), ("W1", "wide")])
async def test_every_receipt_carries_a_frozen_reproducible_context(
    stack: Runtime, shape: str, profile: str
) -> None:
    """CTX-6, CTX-9, CTX-8: the sample novel written by the actors (W2/trimmed/bounded and
    W1/full/wide): each commit's context hash has a freeze row for its unit, equals the hash
    of the context re-assembled from the store at the commit's asOf, and every pack the writer
    received is free of run/claim/delegation ids, hashes and manifests."""
    pool = stack.ctx.pool
    runs, sub = await capture_runs(stack)
    try:
        novel_id, events = await run_novel(stack, sample(writerShape=shape, continuityProfile=profile))
    finally:
        await sub.unsubscribe()
    commits = await store.list_commits(pool, novel_id)
    assert commits and all(c.context_hash for c in commits)
    freezes = await pool.fetch(
        "SELECT manifest_hash, unit_id, context_hash, manifest FROM context_freeze WHERE novel_id = $1",
        novel_id)
    by_context = {(f["unit_id"], f["context_hash"]): f for f in freezes}
    for c in commits:
        row = by_context[(c.unit_id, c.context_hash)]
        manifest = row["manifest"]
        assert manifest["request"] == {"novelId": novel_id, "unitId": c.unit_id, "asOf": c.seq - 1,
                                       "scenario": "generation", "purpose": "production",
                                       "profile": profile}
        assert manifest["readback"] == {"isolation": "repeatable read", "readOnly": True}
        again = await store.load_context(pool, novel_id=novel_id, unit_id=c.unit_id,
                                         scenario="generation", purpose="production", profile=profile)
        assert again.context_sha256 == c.context_hash
        assert again.manifest_sha256 == row["manifest_hash"]
    committed = [e for e in events if isinstance(e, ev.UnitCommitted)]
    assert {e.context_sha256 for e in committed} == {c.context_hash for c in commits}

    # The manifests hold ids and counts only, never prose.
    snapshot = await store.load_snapshot(pool, novel_id)
    blob = json.dumps([f["manifest"] for f in freezes], ensure_ascii=False)
    assert all(p not in blob for c in snapshot.commits for p in c.paragraphs)

    # CTX-8: what the writer got.
    assert len(runs) >= len(commits)
    secrets_ = {r.run_id for r in runs} | {r.delegation_id for r in runs}
    secrets_ |= {c.claim_id for c in commits} | {c.body_hash for c in commits}
    secrets_ |= {c.context_hash or "" for c in commits} | {f["manifest_hash"] for f in freezes}
    secrets_ |= {r["token_hash"] for r in await pool.fetch(
        "SELECT token_hash FROM commits WHERE novel_id = $1", novel_id)}
    secrets_.add((await store.get_novel(pool, novel_id)).outline_revision or "")
    for r in runs:
        assert r.context_sha256 and r.context_sha256 not in r.pack_text
        assert not any(s and s in r.pack_text for s in secrets_)
        assert not HEX_RUN.search(r.pack_text)
        for word in WRITER_MUST_NOT_SEE:
            assert word not in r.pack_text, word
    # the wide profile's earlier chapters reach the writer from chapter 2 on; bounded never
    with_earlier = [r for r in runs if "[[earlier-chapters]]" in r.pack_text]
    assert bool(with_earlier) == (profile == "wide")


def seven_characters(shape: str) -> NovelFile:
    """Scene 1's only participant is the 7th declared character: outside the characters block's
    six (PACK-3) and without any canon fact, so the full pack cannot cover her (PACK-4)."""
    chars = [{"characterId": f"c{i}", "name": f"Person {i}"} for i in range(7)]
    return NovelFile.model_validate({
        "title": "Seven",
        "config": {"writerShape": shape,
                   "budgets": {"consecutiveFailureLimit": 2, "stallThresholdTurns": 6,
                               "externalRetry": {"backoffMs": 0}}},
        "outline": {
            "story": {"premise": "Seven people, one lighthouse."},
            "chapters": [{"chapterId": "k1", "order": 1, "title": "Arrivals"}],
            "scenes": [
                {"sceneId": "s1", "chapterId": "k1", "order": 1, "goal": "The seventh arrives.",
                 "participants": ["c6"]},
                {"sceneId": "s2", "chapterId": "k1", "order": 2, "goal": "Six meet.",
                 "participants": [f"c{i}" for i in range(6)]},
            ],
            "characters": chars,
        },
    })


async def assert_no_writer_and_paused(rt: Runtime, novel_id: str, events: list[Any],
                                      missing: list[str]) -> None:
    pool = rt.ctx.pool
    failed = [e for e in events if isinstance(e, ev.UnitFailed)]
    assert len(failed) == 2  # consecutiveFailureLimit
    assert all(e.reason == "pack-error" and e.missing_blocks == missing for e in failed)
    assert not [e for e in events if isinstance(e, (ev.WriterDispatched, ev.PackRendered))]
    assert await pool.fetchval("SELECT count(*) FROM writer_runs WHERE novel_id = $1", novel_id) == 0
    assert await pool.fetchval("SELECT count(*) FROM context_freeze WHERE novel_id = $1", novel_id) == 0
    ledger = await pool.fetch("SELECT type FROM events WHERE novel_id = $1", novel_id)
    assert "writer.dispatched" not in {r["type"] for r in ledger}
    paused = [e for e in events if isinstance(e, ev.NovelPaused)]
    assert paused and paused[-1].reason == "recovery-required"
    novel = await store.get_novel(pool, novel_id)
    assert (novel.status, novel.pause_reason) == ("paused", "recovery-required")


async def test_uncovered_participant_starts_no_writer_and_pauses_the_novel(stack: Runtime) -> None:
    """PACK-4 through the actors (W1 = full pack): unit.failed names characters and canon, no
    writer.dispatched event or writer_runs row, and the novel pauses after
    consecutiveFailureLimit failed units."""
    novel_id = await store.create_novel(stack.ctx.pool, seven_characters("W1"))
    events = (await drive(stack, novel_id)).events
    await assert_no_writer_and_paused(stack, novel_id, events, ["characters", "canon"])


async def test_empty_prose_tail_starts_no_writer_and_pauses_the_novel(stack: Runtime) -> None:
    """PACK-4 through the actors (W2 = trimmed pack): the chapter has a commit whose prose is
    blank (planted in the database; the store's guard would refuse it), so the continuation's
    pack has no prose tail: unit.failed names prose-tail, no writer starts, the novel pauses."""
    pool = stack.ctx.pool
    nf = sample(budgets={"consecutiveFailureLimit": 2, "stallThresholdTurns": 6,
                         "externalRetry": {"backoffMs": 0}})
    novel_id = await store.create_novel(pool, nf)
    unit_id = await store.prepare_unit(pool, novel_id, "ch1", "cold-lamp", fragment=1,
                                       continuation_anchor=None)
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-test", mode="subagent")
    body = CommitBody(paragraphs=["Wren found the lamp room cold and the logbook open."],
                      scene_completion=SceneCompletion(completed=False, basis="only the start",
                                                       next_anchor="Wren turns to the log."))
    await store.commit_body(pool, novel_id, unit_id, claim.token, body, run_id="run-test",
                            context_hash=None)
    await pool.execute("UPDATE commits SET body = jsonb_set(body, '{paragraphs}', $2::jsonb)"
                       " WHERE novel_id = $1", novel_id, ["   "])
    events = (await drive(stack, novel_id)).events
    await assert_no_writer_and_paused(stack, novel_id, events, ["prose-tail"])


async def test_render_pack_command_rejects_a_future_as_of_and_serves_both_profiles(
    stack: Runtime,
) -> None:
    """CTX-1"""
    ctx = stack.ctx
    pool = ctx.pool
    novel_id = await store.create_novel(pool, sample())
    unit_id = await store.prepare_unit(pool, novel_id, "ch1", "cold-lamp", fragment=1,
                                       continuation_anchor=None)
    with pytest.raises(RemoteError) as err:
        await request(ctx.nc, ctx.subjects.packs,
                      pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape="full", as_of_seq=5),
                      pm.PackReady)
    assert err.value.code == "context-input" and "after the novel's latest commit 0" in err.value.detail
    replies = {}
    for profile in ("bounded", "wide"):
        reply = await request(ctx.nc, ctx.subjects.packs,
                              pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape="full",
                                            profile=profile),  # type: ignore[arg-type]
                              pm.PackReady)
        assert reply.profile == profile and reply.as_of_seq == 0
        assert reply.context_sha256 and reply.manifest_sha256
        row = await store.get_context_freeze(pool, reply.manifest_sha256)
        assert row is not None and row["context_hash"] == reply.context_sha256
        replies[profile] = reply
    # no prose yet: both profiles give the same pack, but each is its own frozen context
    assert replies["bounded"].text == replies["wide"].text
    assert replies["bounded"].manifest_sha256 != replies["wide"].manifest_sha256
    # re-rendering the same context writes no second freeze row (CTX-6)
    await request(ctx.nc, ctx.subjects.packs,
                  pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape="trimmed"), pm.PackReady)
    assert await pool.fetchval("SELECT count(*) FROM context_freeze WHERE novel_id = $1", novel_id) == 2
