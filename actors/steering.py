"""Steering (PLAN-1..5): the driver's command service on `novelbus.cmd.steer`.

Outline revisions, configuration and user directives change what the driver decides, so the
driver serves them: one handler per message type, each one store transaction, then events (ids,
counts, hashes — never outline content, reasons or directive text) and a work notice so the
driver looks again.

Revising while a unit is claimed: the revision is HELD until the claim settles, bounded by the
request's `holdMs` (default 10 s), then refused with `unit-in-flight`. Holding takes the driver's
per-novel flow lock (FIFO), so a revision waits for the unit in flight to be accounted and gets in
before the next unit is claimed; a claim held by another driver process is waited out by polling.
The store itself refuses any revision while a unit is claimed, and every claim carries the
outline revision and requirement watermark it was decided on, so neither side can slip past the
other.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.bus.service import CommandService
from novelbus.messages import events as ev
from novelbus.messages import steer as m
from novelbus.novel.next_work import AwaitOutline, finished_scenes, next_work
from novelbus.novel.planning import budget_exceeded, outline_request, pause_resolved, preflight
from novelbus.novel.roles.planner import planning_view
from novelbus.novel.snapshot import NovelSnapshot

MAX_HOLD_MS = 120_000
POLL_S = 0.02

Notify = Callable[[str, str], Awaitable[Any]]


class SteeringRefused(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Steering:
    """Handlers for `novelbus.cmd.steer`; `locks` are the driver's per-novel flow locks."""

    def __init__(self, ctx: ActorContext, locks: dict[str, asyncio.Lock], notify: Notify) -> None:
        self.ctx = ctx
        self.locks = locks
        self.notify = notify
        self.service = CommandService(ctx.nc, ctx.subjects.steer, {
            m.GetOutline: self.on_outline,
            m.ReviseOutline: self.on_revise,
            m.ListRevisions: self.on_revisions,
            m.ConfigureNovel: self.on_config,
            m.DirectNovel: self.on_direct,
            m.ListRequirements: self.on_requirements,
            m.GetPlanningView: self.on_planning,
        }, queue="steer")

    async def reconcile(self) -> None:
        """At driver start: a steering handler killed between its store transaction and the resume
        that should follow leaves a novel paused although nothing holds it any more. Paused
        `awaiting-outline`/`requirement-conflict` novels whose state resolves the pause, and
        `budget` novels whose budgets allow another unit, are resumed (PLAN-6, REL)."""
        for novel in await store.list_novels(self.ctx.pool):
            if novel.status == "paused" and novel.pause_reason in ("awaiting-outline", "requirement-conflict"):
                await self._resume_if_resolved(await store.load_snapshot(self.ctx.pool, novel.novel_id, prose=False))
            elif novel.status == "paused" and novel.pause_reason == "budget":
                await self._resume_if_budget_allows(novel)

    async def _resume_if_budget_allows(self, novel: store.NovelRow) -> bool:
        if novel.status != "paused" or novel.pause_reason != "budget":
            return False
        elapsed_ms = (time.time() - novel.duration_window_start.timestamp()) * 1000
        if budget_exceeded(novel.config.budgets, novel.turns, elapsed_ms) is not None:
            return False
        resumed = await store.resume_novel(self.ctx.pool, novel.novel_id)
        if resumed:
            await self.ctx.emit(ev.NovelResumed(novel_id=novel.novel_id))
        await self.notify(novel.novel_id, "config-changed")
        return resumed

    # --- outline (PLAN-1, PLAN-2) -------------------------------------------------------------
    async def _awaiting(self, novel: store.NovelRow) -> tuple[str | None, int]:
        """What planning the novel needs now (the `why` of outline.requested) and the next
        chapter's order (PLAN-2)."""
        if novel.status == "finished":
            return None, 1
        snapshot = await store.load_snapshot(self.ctx.pool, novel.novel_id, prose=False)
        decision = next_work(msgspec.structs.replace(snapshot, status="active", units=[
            u for u in snapshot.units if u.state != "claimed"]))
        if isinstance(decision, AwaitOutline):
            asked = outline_request(snapshot, decision)
            return asked.why, asked.next_chapter_order
        return None, 1

    async def on_outline(self, req: m.GetOutline) -> m.OutlineState:
        novel, outline, seq = await store.outline_state(self.ctx.pool, req.novel_id)
        awaiting, next_order = await self._awaiting(novel)
        return m.OutlineState(
            awaiting=awaiting, next_chapter_order=next_order,
            novel_id=novel.novel_id, revision=novel.outline_revision, seq=seq,
            outline=None if outline is None else outline.model_dump(mode="json"),
            status=novel.status, pause_reason=novel.pause_reason,
            planned_chapters=novel.config.plannedChapters,
            requirement_watermark=novel.requirement_watermark,
            requirements_pending=novel.requirements_pending, requirements_blocked=novel.requirements_blocked)

    async def on_planning(self, req: m.GetPlanningView) -> m.PlanningView:
        """ROLE-4: the planner role's projection (`novel.roles.planner`) at the latest commit — an
        external planner reads this, never prose nor anything after `asOf`."""
        novel, _, _ = await store.outline_state(self.ctx.pool, req.novel_id)
        awaiting, next_order = await self._awaiting(novel)
        snapshot = await store.planning_snapshot(self.ctx.pool, req.novel_id)
        return m.PlanningView(novel_id=novel.novel_id, revision=novel.outline_revision, status=novel.status,
                              as_of=snapshot.as_of_seq, projection=planning_view(snapshot), awaiting=awaiting,
                              next_chapter_order=next_order)

    async def on_revise(self, req: m.ReviseOutline) -> m.RevisionApplied:
        if not 0 <= req.hold_ms <= MAX_HOLD_MS:
            raise SteeringRefused("bad-request", f"holdMs must be within 0..{MAX_HOLD_MS}")
        layers = req.layers.get("outline", req.layers) if set(req.layers) == {"outline"} else req.layers
        if not isinstance(layers, dict):
            raise SteeringRefused("bad-outline", "layers must be an object of outline layers")
        if not req.reason.strip():
            raise SteeringRefused("bad-request", "reason must not be empty")
        await store.get_novel(self.ctx.pool, req.novel_id)  # an unknown novel gets no lock
        started = time.monotonic()
        deadline = started + req.hold_ms / 1000
        lock = self.locks.setdefault(req.novel_id, asyncio.Lock())
        try:  # hold: wait for this driver's flow of the novel to end (FIFO), bounded
            await asyncio.wait_for(lock.acquire(), timeout=max(0.001, deadline - time.monotonic()))
        except TimeoutError:
            return await self._revise(req, layers, deadline, started)  # refused as unit-in-flight
        try:
            return await self._revise(req, layers, deadline, started)
        finally:
            lock.release()

    async def _revise(self, req: m.ReviseOutline, layers: dict[str, Any], deadline: float,
                      started: float) -> m.RevisionApplied:
        ctx, pool = self.ctx, self.ctx.pool
        while True:
            try:
                result = await store.revise_novel(
                    pool, req.novel_id, _outline_layers(layers), expected_revision=req.expected_revision,
                    reason=req.reason, requirements=req.requirements)
                break
            except store.UnitInFlight:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(POLL_S)  # a claim held by another driver process: wait it out
        held_ms = int((time.monotonic() - started) * 1000)
        moved = {"applied": [], "blocked": [], "superseded": []}  # type: dict[str, list[str]]
        for t in result.transitions:
            moved[t.after].append(t.requirement_id)
        await ctx.emit(ev.OutlineRevised(
            novel_id=req.novel_id, revision=result.revision, parent=result.parent, seq=result.seq,
            chapters=result.chapters, scenes=result.scenes, superseded_units=len(result.superseded_units),
            requirements_applied=len(moved["applied"]), requirements_blocked=len(moved["blocked"]),
            requirements_superseded=len(moved["superseded"])))
        for t in result.transitions:  # one event per transition (PLAN-4)
            by = t.resolved_conflict.resolved_by if t.resolved_conflict else None
            if t.after == "applied":
                await ctx.emit(ev.RequirementApplied(
                    novel_id=req.novel_id, requirement_id=t.requirement_id, revision=result.revision,
                    watermark=result.watermark, resolved_by=by.kind if by else None,
                    resolved_message_id=by.message_id if by else None))
            elif t.after == "blocked":
                await ctx.emit(ev.RequirementBlocked(novel_id=req.novel_id, requirement_id=t.requirement_id,
                                                     revision=result.revision))
            else:
                await ctx.emit(ev.RequirementSuperseded(
                    novel_id=req.novel_id, requirement_id=t.requirement_id, superseded_by=t.superseded_by or "",
                    revision=result.revision, watermark=result.watermark, resolved_by=by.kind if by else None,
                    resolved_message_id=by.message_id if by else None))
        if moved["blocked"] and await store.repause_novel(pool, req.novel_id, "requirement-conflict",
                                                          from_reasons=("awaiting-outline",)):
            await ctx.emit(ev.NovelPaused(novel_id=req.novel_id, reason="requirement-conflict",
                                          detail=f"blocked: {', '.join(moved['blocked'])}"))
        snapshot = await store.load_snapshot(pool, req.novel_id, prose=False)
        resumed = await self._resume_if_resolved(snapshot)
        novel = await store.get_novel(pool, req.novel_id)
        return m.RevisionApplied(
            novel_id=req.novel_id, revision=result.revision, parent=result.parent, seq=result.seq,
            chapters=result.chapters, scenes=result.scenes, superseded_units=result.superseded_units,
            applied=moved["applied"], blocked=moved["blocked"], superseded=moved["superseded"],
            requirement_watermark=result.watermark, warnings=_preflight(snapshot, novel.turns),
            resumed=resumed, held_ms=held_ms)

    async def _resume_if_resolved(self, snapshot: NovelSnapshot) -> bool:
        """PLAN-2: a revision that resolves an awaiting-outline / requirement-conflict pause resumes
        the novel; an active novel gets a notice so the driver looks at the new outline."""
        resumed = False
        if pause_resolved(snapshot) and await store.resume_novel(self.ctx.pool, snapshot.novel_id):
            await self.ctx.emit(ev.NovelResumed(novel_id=snapshot.novel_id))
            resumed = True
        if resumed or snapshot.status == "active":
            await self.notify(snapshot.novel_id, "steered")
        return resumed

    async def on_revisions(self, req: m.ListRevisions) -> m.Revisions:
        revisions = await store.list_revisions(self.ctx.pool, req.novel_id)
        novel = await store.get_novel(self.ctx.pool, req.novel_id)
        return m.Revisions(novel_id=req.novel_id, current=novel.outline_revision, revisions=[
            m.RevisionEntry(seq=r.seq, revision=r.revision, parent=r.parent, reason=r.reason,
                            created_at=r.created_at.isoformat(), chapters=r.chapters, scenes=r.scenes)
            for r in revisions])

    # --- configuration (PLAN-5) ---------------------------------------------------------------
    async def on_config(self, req: m.ConfigureNovel) -> m.NovelConfigured:
        ctx, pool = self.ctx, self.ctx.pool
        novel, changed = await store.configure_novel(pool, req.novel_id, req.set)
        if changed:
            await ctx.emit(ev.ConfigChanged(novel_id=req.novel_id, fields=changed))
        # also without a change: a retried request whose first reply was lost resumes all the same
        resumed = await self._resume_if_budget_allows(novel) if req.set else False
        snapshot = await store.load_snapshot(pool, req.novel_id, prose=False)
        if req.set and not resumed:
            resumed = await self._resume_if_resolved(snapshot)
        return m.NovelConfigured(novel_id=req.novel_id, config=novel.config.model_dump(mode="json"),
                                 changed=changed, warnings=_preflight(snapshot, novel.turns), resumed=resumed)

    # --- requirements ledger (PLAN-4) ---------------------------------------------------------
    async def on_direct(self, req: m.DirectNovel) -> m.DirectiveReceived:
        record, duplicate = await store.receive_requirement(self.ctx.pool, req.novel_id, req.text, req.message_id)
        if not duplicate:
            digest = hashlib.sha256(record.text.encode()).hexdigest()
            await self.ctx.emit(ev.RequirementReceived(
                novel_id=req.novel_id, requirement_id=record.requirement_id, sequence=record.sequence,
                message_id=record.message_id, chars=len(record.text), sha256=digest))
            await self.notify(req.novel_id, "directive")  # the driver stops claiming and asks to plan
        return m.DirectiveReceived(novel_id=req.novel_id, requirement_id=record.requirement_id,
                                   sequence=record.sequence, status=record.status, duplicate=duplicate)

    async def on_requirements(self, req: m.ListRequirements) -> m.RequirementsState:
        ledger, mark = await store.list_requirements(self.ctx.pool, req.novel_id)
        return m.RequirementsState(novel_id=req.novel_id, watermark=mark, requirements=[
            m.RequirementEntry(
                requirement_id=r.requirement_id, sequence=r.sequence, message_id=r.message_id, text=r.text,
                received_at=r.received_at.isoformat(), status=r.status, applied_revision=r.applied_revision,
                blocked_reason=r.blocked_reason, superseded_by=r.superseded_by,
                resolved_conflict=r.resolved_conflict)
            for r in ledger])


def _outline_layers(layers: dict[str, Any]) -> dict[str, Any]:
    """The overlay as given; `store.revise_novel` validates it (errors name the field)."""
    return dict(layers)


def _preflight(snapshot: NovelSnapshot, turns: int) -> list[str]:
    outline = snapshot.outline
    done = 0
    if outline is not None:
        finished = finished_scenes(snapshot)
        done = sum(1 for s in outline.scenes if (s.chapterId, s.sceneId) in finished)
    return preflight(snapshot.config, outline, turns_used=turns,
                     committed_characters=sum(c.effective_characters for c in snapshot.commits), scenes_done=done)
