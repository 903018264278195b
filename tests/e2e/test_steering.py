"""Steering a running novel over the bus (PLAN-1, PLAN-2, PLAN-5): outline revisions with
compare-and-set and the §16 protections, `outline.requested` and resuming by revision, config of a
running novel and preflight warnings. Real NATS, real PostgreSQL, all six actors in process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import RemoteError
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.bus.steering import SteeringClient
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from tests.store.helpers import make_body
from tests.waiting import arrives, elapse


@pytest.fixture
async def rt(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as runtime:
        runtime.dsn = dsn  # type: ignore[attr-defined]
        yield runtime


def novel_file(chapters: int = 1, scenes: int = 2, **config: Any) -> NovelFile:
    data = generate_novel_file(chapters, scenes, unit_chars=600)
    data["config"].update(config)
    return NovelFile.model_validate(data)


class Events:
    """Every event of one novel, as they arrive."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.changed = asyncio.Event()

    async def on(self, msg: Any) -> None:
        self.items.append(decode(msg.data, ev.NovelEvent))
        self.changed.set()

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.items if isinstance(e, kind)]

    async def wait_for(self, pred: Any, timeout: float = 60.0) -> Any:
        async def loop() -> Any:
            while True:
                for e in self.items:
                    if pred(e):
                        return e
                self.changed.clear()
                await self.changed.wait()
        return await arrives(loop(), timeout, lambda: f"the awaited event; seen: {[type(e).__name__ for e in self.items]}")


async def watch(rt: Runtime, novel_id: str) -> Events:
    events = Events()
    await rt.ctx.nc.subscribe(rt.ctx.subjects.events_of(novel_id), cb=events.on)
    return events


async def write_unit(pool: Any, novel_id: str, chapter_id: str, scene_id: str) -> str:
    """Prepare, claim and commit one unit through the store (the novel must be active)."""
    status = (await store.get_novel(pool, novel_id)).status
    if status == "paused":
        await store.resume_novel(pool, novel_id)
    unit = await store.prepare_unit(pool, novel_id, chapter_id, scene_id, fragment=1, continuation_anchor=None)
    claim = await store.claim_unit(pool, novel_id, unit, f"intent-{unit}", mode="subagent")
    await store.commit_body(pool, novel_id, unit, claim.token, make_body("The harbour lights came on one by one."),
                            run_id="run-test", context_hash=None)
    if status == "paused":
        await store.pause_novel(pool, novel_id, "user-request")
    return unit


def chapter(n: int, title: str = "") -> dict[str, Any]:
    return {"chapterId": f"ch{n:03d}", "order": n, "title": title or f"Chapter {n}",
            "purpose": f"Part {n} of the search.", "entryCondition": "", "exitCondition": "", "keyEvents": []}


def scene(ch: int, n: int, participants: list[str]) -> dict[str, Any]:
    return {"sceneId": f"ch{ch:03d}s{n:02d}", "chapterId": f"ch{ch:03d}", "order": n,
            "goal": f"The search goes on in part {ch}, step {n}.", "participants": participants}


async def test_revise_overlay_cas_and_event(rt: Runtime) -> None:
    """PLAN-1: an overlay carries omitted layers forward; a stale expected revision is refused with
    the current revision named; `outline.revised` has counts and the revision, never content."""
    pool = rt.ctx.pool
    nf = novel_file()
    novel_id = await store.create_novel(pool, nf)
    await store.pause_novel(pool, novel_id, "user-request")  # nothing runs under this test
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    state = await steer.outline(novel_id)
    assert state.seq == 1 and state.outline is not None and state.revision is not None
    outline = state.outline
    participants = outline["scenes"][0]["participants"]
    layers = {"chapters": outline["chapters"] + [chapter(2, "The secret harbour")],
              "scenes": outline["scenes"] + [scene(2, 1, participants)]}
    revised = await steer.revise(novel_id, layers, expected_revision=state.revision, reason="add chapter 2")
    assert (revised.parent, revised.seq, revised.chapters, revised.scenes) == (state.revision, 2, 2, 3)
    after = await steer.outline(novel_id)
    assert after.revision == revised.revision
    assert after.outline is not None
    assert after.outline["story"] == outline["story"] and after.outline["characters"] == outline["characters"]
    assert after.outline["lore"] == outline["lore"]  # omitted layers carried forward

    with pytest.raises(RemoteError) as stale:
        await steer.revise(novel_id, {"chapters": outline["chapters"]}, expected_revision=state.revision,
                           reason="stale")
    assert stale.value.code == "revision-conflict"
    assert revised.revision in stale.value.detail  # the current revision is named

    with pytest.raises(RemoteError) as bad:
        await steer.revise(novel_id, {"scenes": [{"sceneId": "x", "chapterId": "nope", "order": 1, "goal": "g"}]},
                           expected_revision=revised.revision, reason="bad")
    assert bad.value.code == "bad-outline" and "unknown chapter 'nope'" in bad.value.detail
    assert (await steer.outline(novel_id)).revision == revised.revision  # nothing half-written

    e = await events.wait_for(lambda e: isinstance(e, ev.OutlineRevised))
    assert (e.revision, e.parent, e.chapters, e.scenes, e.superseded_units) == (
        revised.revision, state.revision, 2, 3, 0)
    raw = [m for m in await store.list_events(pool, novel_id) if m.type == "outline.revised"]
    assert raw and "harbour" not in json.dumps(raw[0].payload) and "add chapter" not in json.dumps(raw[0].payload)

    history = await steer.revisions(novel_id)
    assert [r.seq for r in history.revisions] == [1, 2] and history.current == revised.revision
    assert [r.reason for r in history.revisions] == ["create", "add chapter 2"]


async def test_committed_chapters_stay_and_removed_scenes_supersede(rt: Runtime) -> None:
    """PLAN-1, SPEC §16: chapters with commits may not disappear or change relative order; a
    prepared unit of a scene the revision removes is superseded (and announced)."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(chapters=2, scenes=2))
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    await store.pause_novel(pool, novel_id, "user-request")
    # one commit in chapter 1, a prepared unit for the second scene of chapter 2
    await write_unit(pool, novel_id, "ch001", "ch001s01")
    unit = await store.prepare_unit(pool, novel_id, "ch002", "ch002s02", fragment=1, continuation_anchor=None)
    state = await steer.outline(novel_id)
    assert state.outline is not None
    o = state.outline
    with pytest.raises(RemoteError) as gone:
        await steer.revise(novel_id, {"chapters": [c for c in o["chapters"] if c["chapterId"] != "ch001"],
                                      "scenes": [s for s in o["scenes"] if s["chapterId"] != "ch001"],
                                      "foreshadowing": []},
                           expected_revision=state.revision, reason="drop chapter 1")
    assert gone.value.code == "revision-refused" and "ch001" in gone.value.detail
    swapped = [dict(c, order=3 - c["order"]) for c in o["chapters"]]
    await steer.revise(novel_id, {"chapters": swapped}, expected_revision=state.revision,
                       reason="swap uncommitted chapter 2 first")  # ch002 has no commits: allowed
    state = await steer.outline(novel_id)
    revised = await steer.revise(
        novel_id, {"scenes": [s for s in o["scenes"] if s["sceneId"] != "ch002s02"]},
        expected_revision=state.revision, reason="drop a scene")
    assert revised.superseded_units == [unit]
    assert (await store.get_unit(pool, novel_id, unit)).state == "superseded"
    await store.resume_novel(pool, novel_id)
    await publish_notice(rt.ctx, novel_id, reason="test")
    e = await events.wait_for(lambda e: isinstance(e, ev.UnitSuperseded))
    assert e.unit_id == unit


async def test_revision_held_until_the_claim_settles(rt: Runtime) -> None:
    """PLAN-1 (choice: hold): a revision sent while a unit is claimed waits for the claim to settle
    and then lands before the next claim; with holdMs 0 it is refused at once with unit-in-flight."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(chapters=1, scenes=6))
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    # hold a claim ourselves, as a unit in flight
    unit = await store.prepare_unit(pool, novel_id, "ch001", "ch001s01", fragment=1,
                                     continuation_anchor=None)
    await store.pause_novel(pool, novel_id, "user-request")
    await store.resume_novel(pool, novel_id)
    claim = await store.claim_unit(pool, novel_id, unit, "intent-test", mode="subagent")
    state = await steer.outline(novel_id)
    with pytest.raises(RemoteError) as busy:
        await steer.revise(novel_id, {}, expected_revision=state.revision, reason="now", hold_ms=0)
    assert busy.value.code == "unit-in-flight" and unit in busy.value.detail

    async def settle() -> None:
        await elapse(0.5)  # the unit stays in flight a while, then its claim goes
        await store.release_claim(pool, novel_id, unit, reason="test", claim_id=claim.claim_id)

    settler = asyncio.create_task(settle())
    revised = await steer.revise(novel_id, {}, expected_revision=state.revision, reason="held", hold_ms=5_000)
    await settler
    assert revised.held_ms >= 400
    assert revised.revision != state.revision
    del events


async def test_outline_requested_and_a_resolving_revision_resumes(rt: Runtime) -> None:
    """PLAN-2: a novel planned with 2 chapters but outlined with 1 pauses `awaiting-outline` after
    chapter 1 and publishes `outline.requested` (why next-chapter, the revision, characters, next
    chapter order); a revision adding chapter 2 resumes it by itself, and it finishes."""
    pool = rt.ctx.pool
    nf = novel_file(chapters=1, scenes=2, plannedChapters=2,
                    length={"kind": "target", "targetCharacters": 2400, "toleranceRatio": 0.3})
    novel_id = await store.create_novel(pool, nf)
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    await publish_notice(rt.ctx, novel_id, reason="test")
    asked = await events.wait_for(lambda e: isinstance(e, ev.OutlineRequested))
    state = await steer.outline(novel_id)
    assert (state.status, state.pause_reason) == ("paused", "awaiting-outline")
    assert asked.why == "next-chapter" and asked.revision == state.revision
    assert asked.next_chapter_order == 2 and asked.chapters == 1 and asked.planned_chapters == 2
    committed = sum(c.effective_chars for c in await store.list_commits(pool, novel_id))
    assert asked.committed_characters == committed > 0
    assert asked.remaining_characters == 3120 - committed  # upper bound 2400 × 1.3
    # the per-unit share counted the planned chapter: chapter 1 did not eat the whole book
    assert committed < 2400 * 0.7
    assert state.outline is not None
    participants = state.outline["scenes"][0]["participants"]
    revised = await steer.revise(
        novel_id, {"chapters": state.outline["chapters"] + [chapter(2)],
                   "scenes": state.outline["scenes"] + [scene(2, 1, participants), scene(2, 2, participants)]},
        expected_revision=state.revision, reason="chapter 2")
    assert revised.resumed
    done = await events.wait_for(lambda e: isinstance(e, (ev.NovelFinished, ev.NovelPaused))
                                 and e is not events.of(ev.NovelPaused)[0], timeout=60)
    assert isinstance(done, ev.NovelFinished), done
    assert {c.chapter_id for c in await store.list_commits(pool, novel_id)} == {"ch001", "ch002"}


async def test_revision_that_does_not_resolve_keeps_the_pause(rt: Runtime) -> None:
    """PLAN-2: a revision that leaves the chapter count short of the plan does not resume."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, novel_file(chapters=1, scenes=1, plannedChapters=3))
    events = await watch(rt, novel_id)
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    await publish_notice(rt.ctx, novel_id, reason="test")
    await events.wait_for(lambda e: isinstance(e, ev.OutlineRequested))
    state = await steer.outline(novel_id)
    revised = await steer.revise(novel_id, {"story": {"premise": "A quieter book."}},
                                 expected_revision=state.revision, reason="story only")
    assert not revised.resumed
    assert (await store.get_novel(pool, novel_id)).pause_reason == "awaiting-outline"
