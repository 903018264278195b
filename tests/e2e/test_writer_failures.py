"""Misbehaving writers through all six actors on real NATS + PostgreSQL: each is refused or failed as
specified, recorded with its reason, and nothing is written that should not be (RUN-3, RUN-4, DRV-4,
CLM-2, REL-5, USE-3, TOOL-4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.messages import events as ev
from novelbus.writers.offline import ScriptedProvider
from novelbus.writers.provider import ModelReply
from novelbus.writers.tools import COMMIT_TOOL, W2_ALLOW_LIST
from tests.writers.harness import (
    PerRun,
    RunView,
    drive,
    good_body,
    text_reply,
    tiny_novel,
    tool_reply,
    writer_stack,
)


async def _ledger(pool: Any, novel_id: str) -> list[Any]:
    return await store.list_events(pool, novel_id, limit=10_000)


async def test_tool_outside_the_allow_list_is_refused_recorded_and_never_run(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-3 / REL-5: a claim tool and an invented tool are refused host-side, recorded as tool.started
    (refused) + tool.refused, listed in the run's manifest as errors; the writer still commits."""
    def first(v: RunView) -> ModelReply | None:
        if v.step == 0:
            return tool_reply(("novel_claim_unit", {"unitId": "hold-01"}), ("drop_tables", {}),
                              ("novel_status_read", {}))
        return None

    provider = PerRun([first])
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        d = await drive(rt, tiny_novel("W2"))
        pool = rt.ctx.pool
        runs = await store.list_writer_runs(pool, d.novel_id)
        ledger = await _ledger(pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished)
    first_run = runs[0]
    refused = [e.payload for e in ledger if e.type == "tool.refused"]
    assert [(p["runId"], p["tool"]) for p in refused] == [(first_run.run_id, "novel_claim_unit"),
                                                          (first_run.run_id, "drop_tables")]
    started = [e.payload for e in ledger if e.type == "tool.started" and e.payload["runId"] == first_run.run_id]
    assert [(p["tool"], p["refused"]) for p in started[:3]] == [
        ("novel_claim_unit", True), ("drop_tables", True), ("novel_status_read", False)]
    assert first_run.status == "ok" and first_run.manifest is not None
    assert [(m["tool"], m["isError"]) for m in first_run.manifest[:3]] == [
        ("novel_claim_unit", True), ("drop_tables", True), ("novel_status_read", False)]
    # What the model was told: refused by the host, and the tools were never offered.
    answer = next(v for v in provider.views if v.run == 0 and v.step == 1).messages
    results = [json.loads(m["content"]) for m in answer if m["role"] == "tool"]
    assert results[:2] == [{"error": "tool-not-allowed", "tool": "novel_claim_unit"},
                           {"error": "tool-not-allowed", "tool": "drop_tables"}]
    offered = {t["function"]["name"] for t in provider.views[0].tools or []}
    assert "novel_claim_unit" not in offered and offered == set(W2_ALLOW_LIST)


async def test_writer_committing_another_unit_is_refused_then_redispatched(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """CLM-2 / REL-5 / RUN-4 / USE-3: the writer of unit 2 commits unit 1 (already committed) and a unit of
    another novel; both are refused as scope-violation and recorded, neither unit changes; the dispatch
    fails (not-committed) and the re-dispatch commits. writerRuns counts successful delegations only."""
    state: dict[str, Any] = {}

    def intruder(v: RunView) -> ModelReply | None:
        if v.step == 0:
            return tool_reply((COMMIT_TOOL, {"unitId": state["unit1"], **good_body("Overwritten.")}),
                              (COMMIT_TOOL, {"unitId": state["foreign"], **good_body("Foreign.")}))
        return text_reply("Done, I committed it.")

    def remember_unit1(v: RunView) -> ModelReply | None:
        state["unit1"] = v.unit_id
        return None  # offline: commits unit 1

    provider = PerRun([remember_unit1, intruder])
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        pool = rt.ctx.pool
        other = tiny_novel("W2")
        other_id = await store.create_novel(pool, other.model_copy(update={"novelId": "n-other"}))
        scene = other.outline.scenes[0]
        state["foreign"] = await store.prepare_unit(pool, other_id, scene.chapterId, scene.sceneId, fragment=1,
                                                    continuation_anchor=None)
        d = await drive(rt, tiny_novel("W2"))
        novel = await store.get_novel(pool, d.novel_id)
        runs = await store.list_writer_runs(pool, d.novel_id)
        ledger = await _ledger(pool, d.novel_id)
        snap = await store.load_snapshot(pool, d.novel_id)
        foreign = await store.get_unit(pool, other_id, state["foreign"])
        foreign_commit = await store.get_commit_for_unit(pool, other_id, state["foreign"])
    assert isinstance(d.final, ev.NovelFinished)
    violations = [e.payload for e in ledger if e.type == "scope.violation"]
    unit2 = provider.unit_ids[1]
    assert [(p["requestedUnitId"], p["delegatedUnitId"]) for p in violations] == [
        (state["unit1"], unit2), (state["foreign"], unit2)]
    assert foreign.state == "prepared" and foreign_commit is None
    assert all("Overwritten." not in c.paragraphs and "Foreign." not in c.paragraphs for c in snap.commits)
    assert len(snap.commits) == 2
    assert [(r.unit_id, r.dispatch, r.status, r.reason) for r in runs] == [
        (state["unit1"], 1, "ok", "completed"), (unit2, 1, "failed", "not-committed"), (unit2, 2, "ok", "completed")]
    assert runs[1].manifest is None  # a failed run stores no manifest
    assert novel.writer_runs == 2 and len(runs) == 3  # USE-3


async def test_two_commits_in_one_reply_only_the_first_runs(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-3 / STORE-2: the first successful commit ends the run; the second commit of the same reply is
    never executed, the model is not called again, and exactly one commit (the first body) stands."""
    def twice(v: RunView) -> ModelReply | None:
        assert v.step == 0, "the run must end at the first successful commit"
        return tool_reply((COMMIT_TOOL, {"unitId": v.unit_id, **good_body("First take.")}),
                          (COMMIT_TOOL, {"unitId": v.unit_id, **good_body("Second take.")}))

    provider = PerRun([twice])
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        d = await drive(rt, tiny_novel("W2"))
        pool = rt.ctx.pool
        counts = await store.count_commits_per_unit(pool, d.novel_id)
        first_commit = await store.get_commit_for_unit(pool, d.novel_id, provider.unit_ids[0])
        runs = await store.list_writer_runs(pool, d.novel_id)
        ledger = await _ledger(pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished)
    assert first_commit is not None and first_commit.body is not None
    assert first_commit.body.paragraphs[0] == "First take."
    assert set(counts.values()) == {1}
    assert [v.step for v in provider.views if v.run == 0] == [0]
    assert runs[0].manifest == [{"seq": 1, "tool": COMMIT_TOOL, "args": runs[0].manifest[0]["args"], "isError": False}]
    assert len([e for e in ledger if e.type == "tool.started" and e.payload["runId"] == runs[0].run_id]) == 1


def _empty(v: RunView) -> ModelReply:
    return text_reply("")


def _chatter(v: RunView) -> ModelReply:
    return text_reply("I have finished the scene in my head.")


def _research_forever(v: RunView) -> ModelReply:
    return tool_reply(("novel_status_read", {}), prefix=f"r{v.run}-{v.step}")


@pytest.mark.parametrize(("behaviour", "reason"), [
    (_empty, "empty-output"),
    (_chatter, "not-committed"),
    (_research_forever, "tool-round-limit"),
])
async def test_failing_writer_is_redispatched_up_to_the_limit_then_the_turn_fails(
        behaviour: Any, reason: str, nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-4 / DRV-4: empty output, a writer that never commits, or one that researches past the tool-round
    limit: each dispatch fails with its reason and is recorded; the claim is re-dispatched up to the
    novel's writerDispatchLimit (2 here, the first included), then the unit's turn fails; nothing is
    committed; writerRuns stays 0; with consecutiveFailureLimit 1 the novel pauses."""
    provider = PerRun([], default=behaviour)
    settings = Settings(max_tool_rounds=2)
    async with writer_stack(nats_url, new_database, namespace, provider=provider, settings=settings) as rt:
        d = await drive(rt, tiny_novel("W2", writerDispatchLimit=2, consecutiveFailureLimit=1))
        pool = rt.ctx.pool
        runs = await store.list_writer_runs(pool, d.novel_id)
        novel = await store.get_novel(pool, d.novel_id)
        commits = await store.list_commits(pool, d.novel_id)
        units = await store.list_units(pool, d.novel_id)
    assert isinstance(d.final, ev.NovelPaused) and d.final.reason == "recovery-required"
    failed = d.of(ev.UnitFailed)
    assert [(f.reason, f.dispatches) for f in failed] == [(reason, 2)]
    assert [(r.dispatch, r.status, r.reason, r.manifest) for r in runs] == [(1, "failed", reason, None),
                                                                           (2, "failed", reason, None)]
    assert [f.reason for f in d.of(ev.WriterFinished)] == [reason, reason]
    assert commits == [] and novel.writer_runs == 0 and novel.turns == 1
    assert [u.state for u in units] == ["prepared"]  # the claim was released, the unit is still to write
    if reason == "tool-round-limit":
        assert len(d.of(ev.ToolStarted)) == 4  # every executed call recorded, even in failed runs


async def test_w1_invalid_and_guarded_drafts_fail_then_a_valid_one_commits(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-2 / VER-2 / RUN-4: a reply that is not a draft fails the dispatch (invalid-draft); a draft whose
    prose carries a chapter heading is refused at its commit (guard), never committed, and its dispatch
    fails with that reason; the third dispatch commits."""
    guarded = {**good_body(), "paragraphs": ["Chapter 3", "Mara listened."]}
    # MODEL-2: an invalid draft gets one repair round (a second call of the same run) first.
    provider = PerRun([lambda v: text_reply("Here is the scene you asked for." if v.step == 0 else "No."),
                       lambda v: text_reply(json.dumps(guarded))])
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        d = await drive(rt, tiny_novel("W1"))
        pool = rt.ctx.pool
        runs = await store.list_writer_runs(pool, d.novel_id)
        commits = (await store.load_snapshot(pool, d.novel_id)).commits
        novel = await store.get_novel(pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished)
    assert [(r.dispatch, r.status, r.reason) for r in runs[:3]] == [
        (1, "failed", "invalid-draft"), (2, "failed", "verify:guard"), (3, "ok", "completed")]
    assert [f.failure for f in d.of(ev.VerificationFailed)] == ["guard"]
    assert all("Chapter 3" not in c.paragraphs for c in commits) and len(commits) == 2
    assert novel.writer_runs == 2 and all(v.tools is None for v in provider.views)  # W1: no tools offered


async def test_read_tools_not_enabled_fails_w2_closed_before_any_model_call(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """TOOL-4: with read tools disabled, a W2 dispatch fails closed before the model is called, recorded
    as READ_TOOLS_NOT_ENABLED; a W1 novel (no tools) on the same stack is unaffected."""
    provider = ScriptedProvider([])  # any model call would raise: there must be none
    async with writer_stack(nats_url, new_database, namespace, provider=provider,
                            settings=Settings(read_tools_enabled=False)) as rt:
        d = await drive(rt, tiny_novel("W2", writerDispatchLimit=1, consecutiveFailureLimit=1))
        runs = await store.list_writer_runs(rt.ctx.pool, d.novel_id)
        commits = await store.list_commits(rt.ctx.pool, d.novel_id)
    assert provider.calls == []
    assert isinstance(d.final, ev.NovelPaused)
    assert [f.reason for f in d.of(ev.UnitFailed)] == ["READ_TOOLS_NOT_ENABLED"]
    assert [(r.status, r.reason) for r in runs] == [("failed", "READ_TOOLS_NOT_ENABLED")] and commits == []

    async with writer_stack(nats_url, new_database, namespace + "w1.",
                            settings=Settings(read_tools_enabled=False)) as rt:
        w1 = await drive(rt, tiny_novel("W1"))
    assert isinstance(w1.final, ev.NovelFinished)
