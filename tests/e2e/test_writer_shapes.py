"""W1 and W2 writers through all six actors on real NATS + PostgreSQL (RUN-2, RUN-3, RUN-5, RUN-6, VER-2,
USE-3): each shape completes the sample novel; receipts carry the dependency summary; a re-dispatch
may continue a stored session."""

from __future__ import annotations

from typing import Any

import pytest

from novelbus import store
from novelbus.bus.client import request
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.writers.tools import COMMIT_TOOL, READ_TOOLS
from tests.writers.harness import PerRun, drive, sample_with, text_reply, tiny_novel, writer_stack


@pytest.mark.parametrize("shape", ["W1", "W2"])
async def test_each_shape_completes_the_sample_novel(shape: str, nats_url: str, new_database: Any,
                                                              namespace: str) -> None:
    """RUN-3, RUN-2 / VER-2 (W1: JSON draft, validated, committed by the orchestrator) and RUN-3 (W2: research,
    then the writer commits itself). RUN-6: W2 runs store their dependency manifest and announce every
    tool call as it starts (before the commit it leads to is published); W1 runs store none. USE-3."""
    async with writer_stack(nats_url, new_database, namespace) as rt:
        d = await drive(rt, sample_with(shape), timeout=120)
        assert isinstance(d.final, ev.NovelFinished), d.final
        pool = rt.ctx.pool
        snap = await store.load_snapshot(pool, d.novel_id)
        novel = await store.get_novel(pool, d.novel_id)
        runs = await store.list_writer_runs(pool, d.novel_id)
        ledger = await store.list_events(pool, d.novel_id, limit=10_000)
        counts = await store.count_commits_per_unit(pool, d.novel_id)

    assert snap.outline is not None and {c.scene_id for c in snap.commits} == {s.sceneId for s in snap.outline.scenes}
    assert set(counts) == {c.unit_id for c in snap.commits} and set(counts.values()) == {1}  # one per unit
    assert {r.mode for r in runs} == {shape} and all(r.status == "ok" and r.reason == "completed" for r in runs)
    assert len(runs) == len(snap.commits) == novel.writer_runs  # USE-3: successful delegations
    started = [e for e in ledger if e.type == "tool.started"]

    if shape == "W1":
        assert started == [] and all(r.manifest is None for r in runs)
        assert [e for e in ledger if e.type == "verify.failed"] == []
        return
    for run in runs:
        manifest = run.manifest or []
        assert [m["seq"] for m in manifest] == list(range(1, len(manifest) + 1))
        assert set(manifest[0]) == {"seq", "tool", "args", "isError"}
        assert manifest[0]["tool"] in READ_TOOLS  # research before narration
        assert manifest[-1]["tool"] == COMMIT_TOOL and manifest[-1]["isError"] is False
        assert '"paragraphs":{"count":' in manifest[-1]["args"]  # prose is never recorded
        mine = [e for e in started if e.payload["runId"] == run.run_id]
        assert [e.payload["tool"] for e in mine] == [m["tool"] for m in manifest]
        committed = next(e for e in ledger if e.type == "unit.committed" and e.payload["unitId"] == run.unit_id)
        assert mine[-1].seq < committed.seq  # tool.started is live, not written after the run
    assert len(started) == sum(len(r.manifest or []) for r in runs)


async def test_receipt_dependency_summary_and_run5_redispatch_continues_a_session(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-6: the run's reply carries the dependency summary (count, where stored) for a successful run
    with tool calls, nothing for a failed run or a W1 run. RUN-5: a re-dispatch naming the session id
    continues the first dispatch's conversation (same chapter); the session is stored per novel."""
    provider = PerRun([lambda v: text_reply("Not yet.")])  # run 1 stops without committing; then offline
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        ctx, pool = rt.ctx, rt.ctx.pool
        nf = tiny_novel("W2")
        novel_id = await store.create_novel(pool, nf)
        scene_a, scene_b = nf.outline.scenes
        unit_a = await store.prepare_unit(pool, novel_id, scene_a.chapterId, scene_a.sceneId, fragment=1,
                                          continuation_anchor=None)

        async def dispatch(unit: str, claim: cm.ClaimGranted, n: int, shape: str, session: str | None
                           ) -> rm.WriterResult:
            pack = await request(ctx.nc, ctx.subjects.packs, pm.RenderPack(
                novel_id=novel_id, unit_id=unit, shape="full" if shape == "W1" else "trimmed"), pm.PackReady)
            return await request(ctx.nc, ctx.subjects.runs, rm.RunWriter(
                novel_id=novel_id, unit_id=unit, run_id=f"run-{unit}-{n}", delegation_id=claim.delegation_id,
                instance=claim.instance, shape=shape, pack_text=pack.text, dispatch=n,  # type: ignore[arg-type]
                session_id=session, claim_id=claim.claim_id), rm.WriterResult, timeout=30)

        claim = await request(ctx.nc, ctx.subjects.claims, cm.ClaimUnit(
            novel_id=novel_id, unit_id=unit_a, intent_id="intent-a", mode="subagent"), cm.ClaimGranted)
        first = await dispatch(unit_a, claim, 1, "W2", "sess-a")
        assert not first.ok and first.reason == "not-committed"
        assert (first.dependencies, first.dependencies_at, first.session_continued) == (0, None, False)
        second = await dispatch(unit_a, claim, 2, "W2", "sess-a")
        assert second.ok and second.session_continued
        assert second.dependencies == second.tool_calls >= 2
        assert second.dependencies_at is not None and f"run-{unit_a}-2" in second.dependencies_at

        # The second run re-sent the first one's conversation, then the pack as a user turn.
        opening = next(v for v in provider.views if v.run == 1 and v.step == 0).messages
        assert [m["role"] for m in opening[:3]] == ["system", "user", "assistant"]
        assert opening[2]["content"] == "Not yet." and opening[-1]["role"] == "user"
        session = await store.load_session(pool, "sess-a")
        assert session is not None and session.novel_id == novel_id and session.chapter_id == scene_a.chapterId

        runs = {r.run_id: r for r in await store.list_writer_runs(pool, novel_id)}
        assert runs[f"run-{unit_a}-1"].manifest is None  # a failed run stores no manifest
        assert len(runs[f"run-{unit_a}-2"].manifest or []) == second.dependencies

        unit_b = await store.prepare_unit(pool, novel_id, scene_b.chapterId, scene_b.sceneId, fragment=1,
                                          continuation_anchor=None)
        claim_b = await request(ctx.nc, ctx.subjects.claims, cm.ClaimUnit(
            novel_id=novel_id, unit_id=unit_b, intent_id="intent-b", mode="subagent"), cm.ClaimGranted)
        w1 = await dispatch(unit_b, claim_b, 1, "W1", None)
        assert w1.ok and w1.tool_calls == 0
        w1_commit = await store.get_commit_for_unit(pool, novel_id, unit_b)  # W1: the run committed its draft
        assert w1_commit is not None and w1_commit.claim_id == claim_b.claim_id and w1_commit.run_id == f"run-{unit_b}-1"
        assert (w1.dependencies, w1.dependencies_at) == (0, None)
        assert (await store.list_writer_runs(pool, novel_id))[-1].manifest is None  # no tool calls: none
