"""Driver policies end to end: budgets (DRV-4, SPEC §16), externalRetry, stall signature (DRV-6),
mode switch (DRV-3), chapter and book completion with finish guards (DRV-5), continuation units
that keep the previous commit's nextAnchor, automatic supersede of units whose scene a revision
removed. Each shows up as a clear event and in the novel's status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.offline import COMMIT_TOOL, OfflineProvider
from novelbus.writers.provider import ModelReply, ProviderError, ToolCall
from tests.waiting import drive, elapse, work_drained

ANCHOR = "the ferry bell rang twice and nobody answered it"


class HookedProvider:
    """The offline writer with test hooks: `before` runs ahead of every model call (and may raise a
    ProviderError), `on_commit` may rewrite the arguments of a commit tool call."""

    name = "hooked"
    label = "offline writer with test hooks (no language model)"

    def __init__(self, *, before: Callable[[list[Any]], Awaitable[None]] | None = None,
                 on_commit: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.offline = OfflineProvider()
        self.before, self.on_commit = before, on_commit
        self.packs: list[str] = []  # the system message (the pack) of every call

    async def aclose(self) -> None:
        return None

    async def complete(self, messages: list[Any], tools: Any, *, max_output_tokens: int,
                       **options: Any) -> ModelReply:
        self.packs.append(str(messages[0].get("content", "")))
        if self.before is not None:
            await self.before(messages)
        reply = await self.offline.complete(messages, tools, max_output_tokens=max_output_tokens)
        if self.on_commit is None or not reply.tool_calls:
            return reply
        calls = []
        for call in reply.tool_calls:
            if call.name == COMMIT_TOOL:
                args = await self.on_commit(json.loads(call.arguments))
                call = ToolCall(id=call.id, name=call.name, arguments=json.dumps(args, ensure_ascii=False))
            calls.append(call)
        return ModelReply(text=reply.text, tool_calls=calls, usage=reply.usage, stop_reason=reply.stop_reason)


def sample(**budgets: Any) -> NovelFile:
    data = json.loads(sample_novel_bytes())
    data["novelId"] = None
    data["config"]["budgets"] = budgets
    return NovelFile.model_validate(data)


@contextlib.asynccontextmanager
async def stack_with(nats_url: str, new_database: Any, namespace: str,
                     provider: Any = None) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    kwargs = {"writer": {"provider": provider}} if provider is not None else None
    async with running(nats_url, dsn, subjects=Subjects(namespace), actor_kwargs=kwargs) as rt:
        rt.dsn = dsn  # type: ignore[attr-defined]  # for the CLI status line
        yield rt


async def status_line(rt: Any, nats_url: str, novel_id: str) -> dict[str, Any]:
    """What `novelbus status NOVEL --json` says (OPS-4)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", "status", novel_id, "--json", "--nats-url", nats_url,
        "--database-url", rt.dsn, "--namespace", rt.ctx.subjects.namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return json.loads(out)  # type: ignore[no-any-return]


def of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


async def test_max_turns_is_a_hard_stop(nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-4: maxTurns pauses the novel with reason `budget`; resuming does not lift a hard stop."""
    async with stack_with(nats_url, new_database, namespace) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample(maxTurns=3))
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelPaused) and final.reason == "budget"
        assert final.detail == "maxTurns 3 reached"
        novel = await store.get_novel(pool, novel_id)
        assert (novel.status, novel.pause_reason, novel.turns) == ("paused", "budget", 3)
        assert len(of(events, ev.UnitCommitted)) == 3
        info = await status_line(rt, nats_url, novel_id)
        assert (info["status"], info["pauseReason"], info["pauseDetail"]) == ("paused", "budget", "maxTurns 3 reached")
        await store.resume_novel(pool, novel_id)
        final = (await drive(rt, novel_id)).final
        assert isinstance(final, ev.NovelPaused) and final.reason == "budget"
        assert len(await store.list_commits(pool, novel_id)) == 3


async def test_max_duration_pauses_and_resume_resets_the_window(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-4, SPEC §16: maxDurationMs is a hard stop; resume resets the duration window."""
    async def slow(_: list[Any]) -> None:
        await elapse(0.05)  # a writer slow enough for the duration budget to run out

    async with stack_with(nats_url, new_database, namespace, HookedProvider(before=slow)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample(maxDurationMs=600))
        final = (await drive(rt, novel_id)).final
        assert isinstance(final, ev.NovelPaused) and final.reason == "budget"
        assert final.detail == "maxDurationMs 600 reached"
        written = len(await store.list_commits(pool, novel_id))
        assert written < 9
        await elapse(0.7)  # the old window is long gone
        await store.resume_novel(pool, novel_id)
        final = (await drive(rt, novel_id)).final
        assert isinstance(final, (ev.NovelPaused, ev.NovelFinished))
        assert len(await store.list_commits(pool, novel_id)) > written  # a fresh window


async def test_external_retry_backs_off_and_does_not_count_as_unit_failure(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-4 externalRetry: turns lost to an unavailable provider are retried with backoff and do
    not count towards consecutiveFailureLimit (here 1), so the novel still finishes."""
    failures = {"left": 2}

    async def flaky(_: list[Any]) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise ProviderError("provider-unavailable", "test: provider away")

    async with stack_with(nats_url, new_database, namespace, HookedProvider(before=flaky)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample(
            writerDispatchLimit=1, consecutiveFailureLimit=1, externalRetry={"maxAttempts": 3, "backoffMs": 20}))
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelFinished), final
        failed = of(events, ev.UnitFailed)
        assert [f.reason for f in failed] == ["provider-error:provider-unavailable"] * 2
        novel = await store.get_novel(pool, novel_id)
        assert novel.turns == 9 + 2 and novel.writer_runs == 9 and novel.consecutive_failures == 0


async def test_external_retry_exhausted_pauses_recovery_required(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-4"""
    async def away(_: list[Any]) -> None:
        raise ProviderError("provider-rate-limited", "test: always rate limited")

    async with stack_with(nats_url, new_database, namespace, HookedProvider(before=away)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample(
            writerDispatchLimit=1, externalRetry={"maxAttempts": 2, "backoffMs": 10}))
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelPaused) and final.reason == "recovery-required"
        assert final.detail == "externalRetry: 2 consecutive turns lost to provider-error:provider-rate-limited"
        assert len(of(events, ev.UnitFailed)) == 2
        units = await store.list_units(pool, novel_id)
        assert [u.state for u in units] == ["prepared"]  # the claim went back; nothing written


def guard_bait(args: dict[str, Any]) -> dict[str, Any]:
    args["paragraphs"] = ["Chapter 3", *args["paragraphs"]]  # STORE-6 refuses bookkeeping in prose
    return args


async def test_same_signature_stalls_after_recording_progress(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-6: the same unit failing with the same signature pauses the novel `stalled` with that
    signature — checked after recording the turn, so exactly stallThresholdTurns turns ran."""
    async def bait(args: dict[str, Any]) -> dict[str, Any]:
        return guard_bait(args)

    async with stack_with(nats_url, new_database, namespace, HookedProvider(on_commit=bait)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample(
            writerDispatchLimit=1, stallThresholdTurns=2, consecutiveFailureLimit=5,
            externalRetry={"maxAttempts": 3, "backoffMs": 10}))
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        failed = of(events, ev.UnitFailed)
        assert isinstance(final, ev.NovelPaused) and final.reason == "stalled"
        assert len(failed) == 2 and final.detail == failed[0].signature == failed[1].signature
        assert (await status_line(rt, nats_url, novel_id))["pauseDetail"] == final.detail
        assert failed[0].signature.endswith(":not-committed")
        novel = await store.get_novel(pool, novel_id)
        assert (novel.turns, novel.stall_count, novel.pause_reason) == (2, 2, "stalled")
        assert await store.list_commits(pool, novel_id) == []


async def test_consecutive_failures_pause_recovery_required(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-4"""
    async def bait(args: dict[str, Any]) -> dict[str, Any]:
        return guard_bait(args)

    async with stack_with(nats_url, new_database, namespace, HookedProvider(on_commit=bait)) as rt:
        novel_id = await store.create_novel(rt.ctx.pool, sample(
            writerDispatchLimit=1, stallThresholdTurns=5, consecutiveFailureLimit=2,
            externalRetry={"maxAttempts": 3, "backoffMs": 10}))
        final = (await drive(rt, novel_id)).final
        assert isinstance(final, ev.NovelPaused) and final.reason == "recovery-required"
        assert final.detail.startswith("2 consecutive failed units; last ")


async def test_mode_switch_takes_effect_from_the_next_unit(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-3: switching writerMode while a unit is claimed leaves that unit in its claimed mode
    (claim event and usage sample say `subagent`); the next unit is claimed `inline`."""
    holder: dict[str, Any] = {}

    async def switch(args: dict[str, Any]) -> dict[str, Any]:
        if not holder.get("switched"):
            holder["switched"] = True
            await store.set_writer_mode(holder["pool"], holder["novel"], "inline")
        return args

    async with stack_with(nats_url, new_database, namespace, HookedProvider(on_commit=switch)) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample())
        holder.update(pool=pool, novel=novel_id)
        driven = await drive(rt, novel_id, timeout=90)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelFinished), final
        modes = [e.mode for e in of(events, ev.UnitClaimed)]
        assert modes[0] == "subagent" and set(modes[1:]) == {"inline"}, modes
        samples = await store.recent_usage(pool, novel_id)
        assert [s["mode"] for s in samples][:2] == ["subagent", "inline"]
        totals = await store.usage_totals(pool, novel_id)
        assert totals["subagent"]["samples"] == 1 and totals["inline"]["samples"] == len(samples) - 1


async def test_finish_guard_blocks_until_required_foreshadowing_is_resolved(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """DRV-5: every chapter completes (one `chapter.completed` each), but the book does not finish
    while required foreshadowing is unresolved: the novel pauses naming the violation. Once the
    outline no longer requires it, resume finishes the book (`novel.finished`)."""
    async def no_payoff(args: dict[str, Any]) -> dict[str, Any]:
        args["canonChanges"] = [c for c in args.get("canonChanges", []) if c.get("kind") != "foreshadowing"]
        return args

    async with stack_with(nats_url, new_database, namespace, HookedProvider(on_commit=no_payoff)) as rt:
        pool = rt.ctx.pool
        nf = sample()
        novel_id = await store.create_novel(pool, nf)
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelPaused) and final.reason == "awaiting-approval"
        assert "required foreshadowing torn-log-page unresolved" in final.detail
        assert "required foreshadowing paraffin-receipts unresolved" in final.detail
        assert [c.chapter_id for c in of(events, ev.ChapterCompleted)] == [
            c.chapterId for c in nf.outline.ordered_chapters()]
        assert not of(events, ev.NovelFinished)

        novel = await store.get_novel(pool, novel_id)
        outline = nf.outline.model_dump(mode="json")
        for item in outline["foreshadowing"]:
            item["required"] = False
        await store.revise_outline(pool, novel_id, {"foreshadowing": outline["foreshadowing"]},
                                   expected_revision=novel.outline_revision, reason="drop payoff requirement")
        await store.resume_novel(pool, novel_id)
        final = (await drive(rt, novel_id)).final
        assert isinstance(final, ev.NovelFinished) and final.commits == 9
        assert (await store.get_novel(pool, novel_id)).status == "finished"


async def test_continuation_unit_keeps_the_previous_commits_next_anchor(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """SPEC §16 Units: a commit that does not complete its scene makes the driver prepare a
    continuation unit (fragment 2) whose anchor is that commit's nextAnchor (the original lost
    it); the writer's pack for the continuation carries the anchor."""
    state = {"first": True}

    async def unfinished(args: dict[str, Any]) -> dict[str, Any]:
        if state.pop("first", False):
            args["sceneCompletion"] = {"completed": False, "basis": "the meeting is only half done",
                                       "outstandingGoals": ["the ledger changes hands"], "nextAnchor": ANCHOR}
        return args

    provider = HookedProvider(on_commit=unfinished)
    async with stack_with(nats_url, new_database, namespace, provider) as rt:
        pool = rt.ctx.pool
        novel_id = await store.create_novel(pool, sample())
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelFinished), final
        prepared = of(events, ev.UnitPrepared)
        assert [p.fragment for p in prepared[:2]] == [1, 2]
        assert prepared[0].scene_id == prepared[1].scene_id
        units = await store.list_units(pool, novel_id)
        assert units[1].fragment == 2 and units[1].continuation_anchor == ANCHOR
        assert any(ANCHOR in pack for pack in provider.packs)
        assert len(await store.list_commits(pool, novel_id)) == 10  # 9 scenes, one in two units
        assert set((await store.count_commits_per_unit(pool, novel_id)).values()) == {1}


async def test_units_of_a_removed_scene_are_superseded_and_announced(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """SPEC §16 finish guards: a prepared unit whose scene an outline revision removed is
    superseded automatically (the original forgot), announced once with `unit.superseded`, and
    does not block the finish. The store backstop supersedes units of scenes that vanished."""
    async with stack_with(nats_url, new_database, namespace) as rt:
        pool = rt.ctx.pool
        nf = sample()
        novel_id = await store.create_novel(pool, nf)
        last = nf.outline.scenes_of(nf.outline.ordered_chapters()[-1].chapterId)[-1]
        doomed = await store.prepare_unit(pool, novel_id, last.chapterId, last.sceneId, fragment=1,
                                          continuation_anchor=None)
        scenes = [s.model_dump(mode="json") for s in nf.outline.scenes if s.sceneId != last.sceneId]
        novel = await store.get_novel(pool, novel_id)
        await store.revise_outline(pool, novel_id, {"scenes": scenes}, expected_revision=novel.outline_revision,
                                   reason="cut the last scene")
        # a unit of a scene that is in no outline at all (left by an older deployment)
        await pool.execute("INSERT INTO units (novel_id, unit_id, chapter_id, scene_id, fragment)"
                           " VALUES ($1, 'ghost-01', $2, 'ghost', 1)", novel_id, last.chapterId)
        driven = await drive(rt, novel_id)
        final, events = driven.final, driven.events
        assert isinstance(final, ev.NovelFinished), final
        superseded = of(events, ev.UnitSuperseded)
        assert sorted((s.unit_id, s.reason) for s in superseded) == sorted(
            [(doomed, "scene-removed"), ("ghost-01", "scene-removed")])
        assert (await store.get_unit(pool, novel_id, doomed)).state == "superseded"
        assert (await store.get_unit(pool, novel_id, "ghost-01")).state == "superseded"
        info = await status_line(rt, nats_url, novel_id)
        assert info["units"] == {"committed": 8, "superseded": 2} and info["inFlight"] is None
        await publish_notice(rt.ctx, novel_id, reason="again")
        await work_drained(rt)
        announced = [e for e in await store.list_events(pool, novel_id) if e.type == "unit.superseded"]
        assert len(announced) == 2  # once each
