"""PLAN-6 (bounded chaos): steering a novel while its actor processes are SIGKILLed at random keeps
every REL guarantee. The novel is outlined with 3 of its 4 planned chapters and a turn budget too
small for it; during the run a steerer (polling, not trusting any single event) sends directives
(each twice, idempotent), applies them by revision with compare-and-set, raises the budget when the
novel pauses for it, and adds the fourth chapter when asked — retrying whatever a kill interrupts.
Then, from PostgreSQL and JetStream: finished, one commit per unit, no scene completed twice,
prose in outline order, every directive applied exactly once in the ledger, no notice lost, no
steering event twice."""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from novelbus import store
from novelbus.actors.runtime import connected
from novelbus.bench.common import settle_work_consumer, stop_supervised
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import BusUnavailable, RemoteError
from novelbus.bus.notices import publish_notice
from novelbus.bus.steering import SteeringClient
from novelbus.infra.supervise import Supervisor
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from novelbus.novel.requirements import RequirementUpdate
from tests.waiting import elapse

KILLS = 12


async def steer_step(steer: SteeringClient, pool: Any, novel_id: str, directives: list[str],
                     log: list[str]) -> bool:
    """One look at the novel and at most one steering action; True once it is finished."""
    commits = len(await store.list_commits(pool, novel_id))
    for i, threshold in enumerate((3, 8)):
        if commits >= threshold and len(directives) <= i:
            mid = f"chaos-m{i}"
            for _ in range(2):  # the same message twice: one requirement
                await steer.direct(novel_id, f"Directive number {i}: keep the rain falling.", mid)
            directives.append(mid)
            log.append(f"directive {mid} at {commits} commits")
    state = await steer.outline(novel_id)
    if state.status == "finished":
        return True
    if state.requirements_pending:
        ledger = await steer.requirements(novel_id)
        pending = [r.requirement_id for r in ledger.requirements if r.status == "pending"]
        await steer.revise(novel_id, {}, expected_revision=state.revision, reason=f"apply {','.join(pending)}",
                           requirements=[RequirementUpdate(requirement_id=r, status="applied") for r in pending],
                           hold_ms=3_000)
        log.append(f"applied {pending}")
    elif state.status == "paused" and state.pause_reason == "budget":
        await steer.config(novel_id, {"budgets.maxTurns": 200})
        log.append("raised maxTurns")
    elif state.awaiting == "next-chapter" and state.outline is not None:
        o = state.outline
        order = state.next_chapter_order
        cast = o["scenes"][0]["participants"]
        chapter = {"chapterId": f"ch{order:03d}", "order": order, "title": f"Chapter {order}"}
        scenes = [{"sceneId": f"ch{order:03d}s{i:02d}", "chapterId": chapter["chapterId"], "order": i,
                   "goal": f"The search ends, step {i}.", "participants": cast} for i in (1, 2)]
        await steer.revise(novel_id, {"chapters": o["chapters"] + [chapter], "scenes": o["scenes"] + scenes},
                           expected_revision=state.revision, reason=f"chapter {order}", hold_ms=3_000)
        log.append(f"added chapter {order}")
    return False


async def test_steering_during_chaos_keeps_rel_guarantees(nats_url: str, new_database: Any) -> None:
    """PLAN-6"""
    dsn = await new_database()
    rng = random.Random(11)
    subjects = Subjects(f"steer{secrets.token_hex(4)}.")
    data = generate_novel_file(3, 3, seed=11, unit_chars=500)
    data["config"]["plannedChapters"] = 4
    data["config"]["budgets"] = {"maxTurns": 5}
    log_dir = Path(tempfile.mkdtemp(prefix="novelbus-steer-chaos-"))
    log: list[str] = []
    directives: list[str] = []
    async with connected(nats_url, dsn, subjects=subjects, name="steer-chaos") as ctx:
        pool = ctx.pool
        novel_id = await store.create_novel(pool, NovelFile.model_validate(data))
        sup = Supervisor(nats_url, dsn, namespace=subjects.namespace, log_dir=log_dir,
                         claims_instances=("claims-0", "claims-1"), request_timeout_s=5.0, writer_timeout_s=10.0)
        steer = SteeringClient(ctx.nc, subjects, timeout=3.0)
        watcher: asyncio.Task[None] | None = None
        finished = False
        kills: Counter[str] = Counter()
        try:
            await sup.start()
            watcher = asyncio.create_task(sup.watch())
            await sup.wait_ready(timeout=60)
            await publish_notice(ctx, novel_id, reason="chaos-start")
            deadline = time.monotonic() + 150

            async def killer() -> None:
                # Kills go on while a steering step waits (a revision holds its lock for 3 s), so
                # a fast novel still sees them all (every actor kind, the driver included).
                while sum(kills.values()) < KILLS:
                    await elapse(rng.uniform(0.2, 0.5))
                    ready = sorted(k for k, c in sup.children.items() if c.ready)
                    if ready:
                        least = min(kills[k] for k in ready)
                        victim = rng.choice([k for k in ready if kills[k] == least])
                        if sup.kill(victim) is not None:
                            kills[victim] += 1
                            await publish_notice(ctx, novel_id, reason="chaos-probe")

            killing = asyncio.create_task(killer())
            while time.monotonic() < deadline and not (finished and killing.done()):
                if not finished:
                    try:
                        finished = await steer_step(steer, pool, novel_id, directives, log)
                    except (BusUnavailable, RemoteError) as e:  # a kill got in the way: look again
                        log.append(f"retry ({getattr(e, 'code', type(e).__name__)})")
                await elapse(0.1)  # the pace of the steering steps
            killing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await killing
            pending = await settle_work_consumer(ctx, subjects, 30)
        finally:
            await stop_supervised(sup, watcher)
        detail = f"kills {dict(kills)}; log {log[-25:]}; actor logs {log_dir}"
        dlq = await ctx.js.stream_info(subjects.dlq_stream)
        novel = await store.get_novel(pool, novel_id)
        assert novel.status == "finished", detail
        assert sum(kills.values()) >= KILLS and kills["driver"] >= 1 and len(kills) >= 6, detail
        snap = await store.load_snapshot(pool, novel_id)
        assert snap.outline is not None and len(snap.outline.chapters) == 4, detail
        live = [u for u in snap.units if u.state != "superseded"]
        per_unit = await store.count_commits_per_unit(pool, novel_id)
        assert [u.unit_id for u in live if per_unit.get(u.unit_id, 0) != 1] == [], detail
        done_scenes = Counter((c.chapter_id, c.scene_id) for c in snap.commits if c.scene_completion.completed)
        assert max(done_scenes.values()) == 1 and len(done_scenes) == 11, detail
        chapter_order = {c.chapterId: c.order for c in snap.outline.chapters}
        scene_order = {(s.chapterId, s.sceneId): s.order for s in snap.outline.scenes}
        keys = [(chapter_order[c.chapter_id], scene_order[(c.chapter_id, c.scene_id)]) for c in snap.commits]
        assert keys == sorted(keys), detail
        ledger, mark = await store.list_requirements(pool, novel_id)
        assert [(r.requirement_id, r.message_id, r.status) for r in ledger] == [
            ("req-1", "chaos-m0", "applied"), ("req-2", "chaos-m1", "applied")], detail
        assert mark == 2 and novel.config.budgets.maxTurns == 200, detail
        assert pending == 0 and int(dlq.state.messages) == 0, detail
        events = await store.list_events(pool, novel_id, limit=100_000)
        received = Counter(e.payload["requirementId"] for e in events if e.type == "requirement.received")
        revised = Counter(e.payload["revision"] for e in events if e.type == "outline.revised")
        assert all(n == 1 for n in received.values()) and all(n == 1 for n in revised.values()), detail
        for stream in (subjects.work_stream, subjects.events_stream, subjects.dlq_stream):
            with contextlib.suppress(Exception):
                await ctx.js.delete_stream(stream)
    print(f"\nsteer chaos: {sum(kills.values())} kills {dict(kills)}; {log}")
