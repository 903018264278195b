"""Driver (DRV-1..6): consumes work notices, asks the pure `next_work`, runs one unit's flow.

Flow for a `subagent` novel: claim → render pack → dispatch writer → verify → account the turn
→ schedule the next unit (a new durable work notice). Units of one novel are strictly
sequential (one flow per novel at a time); different novels run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

import store
from actors.context import ActorContext
from bus.client import BusUnavailable, RemoteError, request
from bus.codec import MessageError, decode, encode
from bus.streams import WORK_MAX_DELIVER, driver_consumer_config
from messages import claims as cm
from messages import events as ev
from messages import packs as pm
from messages import runs as rm
from messages import usage as um
from messages import verify as vm
from messages.work import WorkNotice
from novel.next_work import (
    AwaitOutline,
    Blocked,
    Finish,
    Inactive,
    InFlight,
    WriteUnit,
    completed_chapters,
    next_work,
)
from novel.snapshot import NovelSnapshot

log = logging.getLogger("novelbus.driver")

HEARTBEAT_S = 10.0


@dataclass
class UnitOutcome:
    ok: bool
    reason: str
    dispatches: int
    missing_blocks: list[str] = field(default_factory=list)
    output_chars: int = 0


@dataclass
class DriverState:
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # one flow per novel (DRV-1)
    driving: set[str] = field(default_factory=set)  # novels with a unit flow in this process
    notices: int = 0
    units_done: int = 0
    running: bool = True


class Driver:
    name = "driver"

    def __init__(self, ctx: ActorContext, *, max_parallel_novels: int = 64) -> None:
        self.ctx = ctx
        self.state = DriverState()
        self._slots = asyncio.Semaphore(max_parallel_novels)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.ctx.subjects
        cfg = driver_consumer_config(s)
        self._psub = await self.ctx.js.pull_subscribe(s.work_all, durable=cfg.durable_name, stream=s.work_stream,
                                                      config=cfg)
        await self.resume_active_novels()
        self._loop_task = asyncio.create_task(self._pull_loop(), name="driver-pull")

    async def stop(self) -> None:
        self.state.running = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        if self._tasks:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def resume_active_novels(self) -> None:
        """A starting driver drives nothing yet: stale claims of active novels are released and
        every active novel gets a notice, so no work waits for a redelivery timeout (REL-1)."""
        for novel in await store.list_novels(self.ctx.pool):
            if novel.status != "active":
                continue
            for unit_id in await store.claimed_units(self.ctx.pool, novel.novel_id):
                with contextlib.suppress(RemoteError, BusUnavailable):
                    await request(self.ctx.nc, self.ctx.subjects.claims,
                                  cm.ReleaseUnit(novel_id=novel.novel_id, unit_id=unit_id, reason="driver-restart"),
                                  cm.ClaimReleased, timeout=self.ctx.settings.request_timeout_s, retries=3)
            await publish_notice(self.ctx, novel.novel_id, reason="driver-start")

    async def _pull_loop(self) -> None:
        while self.state.running:
            try:
                msgs = await self._psub.fetch(batch=32, timeout=1.0)
            except (TimeoutError, NotFoundError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS away: wait and retry (REL-6)
                log.warning("work fetch failed (%s); retrying", type(e).__name__)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self._slots.acquire()
                task = asyncio.create_task(self._handle(msg))
                self._tasks.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        self.state.notices += 1
        try:
            notice = decode(msg.data, WorkNotice, msg.headers)
        except MessageError as e:
            await self._dead_letter(msg, e.code, str(e))
            return
        heartbeat = asyncio.create_task(self._heartbeat(msg))
        try:
            lock = self.state.locks.setdefault(notice.novel_id, asyncio.Lock())
            async with lock:
                await self.advance(notice)
            await msg.ack()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - bounded redelivery, then the dead-letter subject
            code = getattr(e, "code", type(e).__name__)
            delivered = msg.metadata.num_delivered if msg.metadata else 1
            log.warning("notice for %s failed (%s), delivery %s", notice.novel_id, code, delivered)
            if delivered >= WORK_MAX_DELIVER:
                await self._dead_letter(msg, str(code), str(e))
            else:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=min(30.0, 0.5 * 2**delivered))
        finally:
            heartbeat.cancel()

    async def _heartbeat(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                await msg.in_progress()

    async def _dead_letter(self, msg: Msg, code: str, detail: str) -> None:
        headers = {"Novelbus-Error": code, "Novelbus-Error-Detail": detail[:300], "Novelbus-Subject": msg.subject}
        with contextlib.suppress(Exception):
            await self.ctx.js.publish(self.ctx.subjects.dead_letter("work"), msg.data, headers=headers)
        with contextlib.suppress(Exception):
            await msg.term()

    # --- decisions ------------------------------------------------------------------------
    async def advance(self, notice: WorkNotice) -> None:
        pool = self.ctx.pool
        try:
            snapshot = await store.load_snapshot(pool, notice.novel_id)
        except store.NovelNotFound:
            log.info("notice for unknown novel %s dropped", notice.novel_id)
            return
        decision = next_work(snapshot)
        if isinstance(decision, (Inactive, InFlight)):
            return  # paused/finished, or another flow holds the unit
        if isinstance(decision, AwaitOutline):
            await self.pause(snapshot.novel_id, "awaiting-outline", decision.reason)
            return
        if isinstance(decision, Blocked):
            await self.pause(snapshot.novel_id, "awaiting-approval", "; ".join(decision.violations))
            return
        if isinstance(decision, Finish):
            if await store.finish_novel(pool, snapshot.novel_id):
                await self.ctx.emit(ev.NovelFinished(novel_id=snapshot.novel_id, units=len(snapshot.units),
                                                     commits=len(snapshot.commits),
                                                     characters=snapshot.committed_characters))
            return
        assert isinstance(decision, WriteUnit)
        novel = await store.get_novel(pool, snapshot.novel_id)
        budgets = novel.config.budgets
        if novel.turns >= budgets.maxTurns:
            await self.pause(snapshot.novel_id, "budget", f"maxTurns {budgets.maxTurns} reached")
            return
        window_start = novel.duration_window_start.timestamp() if novel.duration_window_start else time.time()
        if (time.time() - window_start) * 1000 > budgets.maxDurationMs:
            await self.pause(snapshot.novel_id, "budget", f"maxDurationMs {budgets.maxDurationMs} reached")
            return
        await self.write_unit(snapshot, decision, notice)

    async def pause(self, novel_id: str, reason: str, detail: str) -> None:
        if await store.pause_novel(self.ctx.pool, novel_id, reason):
            await self.ctx.emit(ev.NovelPaused(novel_id=novel_id, reason=reason, detail=detail[:300]))

    # --- one unit -------------------------------------------------------------------------
    async def write_unit(self, snapshot: NovelSnapshot, decision: WriteUnit, notice: WorkNotice) -> None:
        ctx, pool, novel_id = self.ctx, self.ctx.pool, snapshot.novel_id
        unit_id = decision.unit_id
        if unit_id is None:
            unit_id = await store.prepare_unit(pool, novel_id, decision.chapter_id, decision.scene_id,
                                               fragment=decision.fragment,
                                               continuation_anchor=decision.continuation_anchor)
            await ctx.emit(ev.UnitPrepared(novel_id=novel_id, unit_id=unit_id, chapter_id=decision.chapter_id,
                                           scene_id=decision.scene_id, fragment=decision.fragment))
        novel = await store.get_novel(pool, novel_id)
        mode = novel.writer_mode  # DRV-3: read at claim time; the claim keeps it to the end
        intent_id = f"intent-{secrets.token_hex(8)}"
        await store.record_intent(pool, novel_id, intent_id, unit_id, notice.notice_id)
        try:
            claim = await request(ctx.nc, ctx.subjects.claims,
                                  cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id=intent_id, mode=mode),
                                  cm.UnitClaimed, timeout=ctx.settings.request_timeout_s, retries=2)
        except RemoteError as e:
            if e.code in ("unit-not-claimable", "unit-in-flight", "novel-not-active"):
                return  # someone else moved it on; the state decides what comes next
            raise
        self.state.driving.add(novel_id)
        try:
            outcome = await self.run_claim(novel, snapshot, claim, mode)
        finally:
            self.state.driving.discard(novel_id)
        await self.account(novel_id, unit_id, claim, outcome, snapshot)

    async def run_claim(self, novel: store.NovelRow, snapshot: NovelSnapshot, claim: cm.UnitClaimed,
                        mode: str) -> UnitOutcome:
        """Dispatch writers for one claim, up to writerDispatchLimit (RUN-4, DRV-4)."""
        ctx, novel_id, unit_id = self.ctx, novel.novel_id, claim.unit_id
        shape = novel.config.writerShape
        pack_shape = "full" if shape == "W1" else "trimmed"
        reasons: list[str] = []
        dispatches = 0
        last_output = 0
        while True:
            try:
                grant = await request(ctx.nc, ctx.subjects.claims, cm.BeginDispatch(delegation_id=claim.delegation_id),
                                      cm.DispatchGranted, timeout=ctx.settings.request_timeout_s, retries=2)
            except RemoteError as e:
                if e.code in ("dispatch-limit", "delegation-not-found"):
                    break
                raise
            dispatches = grant.dispatch
            try:
                pack = await request(ctx.nc, ctx.subjects.packs,
                                     pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape=pack_shape,
                                                   profile=novel.config.continuityProfile),
                                     pm.PackRendered, timeout=ctx.settings.request_timeout_s, retries=2)
            except RemoteError as e:
                if e.code == "pack-error":  # PACK-4: no writer starts on a broken pack
                    return UnitOutcome(False, "pack-error", dispatches, missing_blocks=_missing_blocks(e.detail))
                raise
            run_id = f"run-{secrets.token_hex(8)}"
            result = await request(
                ctx.nc, ctx.subjects.runs,
                rm.RunWriter(novel_id=novel_id, unit_id=unit_id, run_id=run_id, delegation_id=claim.delegation_id,
                             instance=claim.instance, shape=shape, pack_text=pack.text, dispatch=dispatches,
                             context_sha256=pack.context_sha256),
                rm.WriterFinished, timeout=ctx.settings.writer_timeout_s)
            self._last_run = result
            last_output = result.output_chars
            if not result.ok:
                reasons.append(result.reason)
                continue
            if shape == "W1":
                failure = await self._commit_draft(novel_id, unit_id, claim, run_id, result, pack.context_sha256)
                if failure:
                    reasons.append(failure)
                    continue
            verified = await request(ctx.nc, ctx.subjects.verify,
                                     vm.VerifyCommit(novel_id=novel_id, unit_id=unit_id, claim_id=claim.claim_id,
                                                     run_id=run_id),
                                     vm.Verified, timeout=ctx.settings.request_timeout_s, retries=2)
            if verified.ok:
                return UnitOutcome(True, "committed", dispatches, output_chars=last_output)
            await ctx.emit(ev.VerificationFailed(novel_id=novel_id, unit_id=unit_id, run_id=run_id,
                                                 failure=verified.failure or "unknown"))
            reasons.append(f"verify:{verified.failure}")
        return UnitOutcome(False, reasons[-1] if reasons else "dispatch-limit", dispatches, output_chars=last_output)

    async def _commit_draft(self, novel_id: str, unit_id: str, claim: cm.UnitClaimed, run_id: str,
                            result: rm.WriterFinished, context_sha256: str | None) -> str | None:
        """W1: validate the draft (VER-2), then commit it through the claim manager (CLM-2)."""
        ctx = self.ctx
        if result.draft is None:
            return "invalid-draft"
        valid = await request(ctx.nc, ctx.subjects.verify,
                              vm.ValidateDraft(novel_id=novel_id, unit_id=unit_id, body=result.draft),
                              vm.Verified, timeout=ctx.settings.request_timeout_s, retries=2)
        if not valid.ok:
            await ctx.emit(ev.VerificationFailed(novel_id=novel_id, unit_id=unit_id, run_id=run_id,
                                                 failure=valid.failure or "schema"))
            return f"verify:{valid.failure}"
        try:
            await request(ctx.nc, ctx.subjects.commit(claim.instance),
                          cm.CommitUnit(delegation_id=claim.delegation_id, novel_id=novel_id, unit_id=unit_id,
                                        body=result.draft, run_id=run_id, context_sha256=context_sha256),
                          cm.CommitReceipt, timeout=ctx.settings.request_timeout_s, retries=2)
        except RemoteError as e:
            return f"commit:{e.code}"
        return None

    async def account(self, novel_id: str, unit_id: str, claim: cm.UnitClaimed, outcome: UnitOutcome,
                      before: NovelSnapshot) -> None:
        """Account the turn, then schedule the next unit or apply the failure policy (DRV-4, DRV-6)."""
        ctx, pool = self.ctx, self.ctx.pool
        novel = await store.get_novel(pool, novel_id)
        budgets = novel.config.budgets
        run = getattr(self, "_last_run", None)
        turn = novel.turns + 1
        if run is not None and run.unit_id == unit_id:
            await request(ctx.nc, ctx.subjects.usage,
                          um.RecordTurn(novel_id=novel_id, unit_id=unit_id, mode=novel.writer_mode, turn=turn,
                                        provider=run.provider, calls=run.calls, tool_bytes=run.tool_bytes,
                                        writer_output_chars=outcome.output_chars, committed=outcome.ok),
                          um.TurnRecorded, timeout=ctx.settings.request_timeout_s, retries=2)
        if outcome.ok:
            await store.record_turn(pool, novel_id, committed=True, writer_output_chars=outcome.output_chars,
                                    failure_signature=None)
            self.state.units_done += 1
            after = await store.load_snapshot(pool, novel_id)
            for chapter_id in sorted(set(completed_chapters(after)) - set(completed_chapters(before))):
                await ctx.emit(ev.ChapterCompleted(novel_id=novel_id, chapter_id=chapter_id))
            await publish_notice(ctx, novel_id, reason="next-unit", dedupe=f"after-{unit_id}-{claim.claim_id}")
            return
        signature = f"{unit_id}:{outcome.reason}"
        await ctx.emit(ev.UnitFailed(novel_id=novel_id, unit_id=unit_id, reason=outcome.reason, signature=signature,
                                     dispatches=outcome.dispatches, missing_blocks=outcome.missing_blocks))
        with contextlib.suppress(RemoteError):
            await request(ctx.nc, ctx.subjects.claims,
                          cm.ReleaseClaim(delegation_id=claim.delegation_id, reason=outcome.reason[:120]),
                          cm.ClaimReleased, timeout=ctx.settings.request_timeout_s, retries=2)
        counters = await store.record_turn(pool, novel_id, committed=False, writer_output_chars=0,
                                           failure_signature=signature)
        # DRV-6 after recording progress (the original checked before): same unit, same signature.
        if counters.stall_count >= budgets.stallThresholdTurns:
            await self.pause(novel_id, "stalled", signature)
        elif counters.consecutive_failures >= budgets.consecutiveFailureLimit:
            await self.pause(novel_id, "recovery-required",
                             f"{counters.consecutive_failures} consecutive failed units; last {signature}")
        else:
            await asyncio.sleep(budgets.externalRetry.backoffMs / 1000 * min(counters.consecutive_failures, 3))
            await publish_notice(ctx, novel_id, reason="retry")


def _missing_blocks(detail: str) -> list[str]:
    # WriterPackError's message ends with "missing: a, b" (PACK-4)
    if "missing:" not in detail:
        return []
    return [b.strip() for b in detail.rsplit("missing:", 1)[1].split(",") if b.strip()]


async def publish_notice(ctx: ActorContext, novel_id: str, *, reason: str, dedupe: str | None = None) -> str:
    """Publish a durable work notice; `dedupe` makes a repeated publish a no-op (BUS-2, REL-2)."""
    notice_id = dedupe or f"notice-{secrets.token_hex(8)}"
    data, headers = encode(WorkNotice(novel_id=novel_id, notice_id=notice_id, reason=reason))
    headers["Nats-Msg-Id"] = f"{novel_id}:{notice_id}"
    await ctx.js.publish(ctx.subjects.work(novel_id), data, headers=headers)
    return notice_id
