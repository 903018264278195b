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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg
import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from novelbus import store
from novelbus.actors.accounting import USAGE_RETRY_S, Accounting
from novelbus.actors.context import ActorContext
from novelbus.actors.steering import Steering
from novelbus.bus import outbox, tally
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.bus.codec import MessageError, decode, encode
from novelbus.bus.routes import check_instance, claims_instance_subject
from novelbus.bus.streams import WORK_MAX_DELIVER, driver_consumer_config
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.messages.work import WorkNotice
from novelbus.novel.next_work import (
    AwaitOutline,
    Blocked,
    Finish,
    Inactive,
    InFlight,
    RequirementConflict,
    WriteUnit,
    completed_chapters,
    next_work,
)
from novelbus.novel.planning import outline_request
from novelbus.novel.snapshot import NovelSnapshot

log = logging.getLogger(__name__)

T = TypeVar("T")

HEARTBEAT_S = 5.0  # in-progress acks; well inside the consumer's ack wait
LEASE_S = 12.0  # a flow's lease on its unit; renewed every LEASE_RENEW_S while the flow runs (REL-1)
LEASE_RENEW_S = 3.0
SWEEP_S = 2.0  # how often a driver looks for claims nobody drives any more
INTERNAL_RETRY_S = 30.0  # an actor answering `internal` is retried in place this long, then the notice naks
EXTERNAL_REASONS = ("provider-error:provider-unavailable", "provider-error:provider-rate-limited")


class ClaimLost(Exception):
    """The claim ended under the flow: its delegation is gone (the claim-manager instance restarted
    and recovered it, or cannot be reached). The unit goes back to prepared; nothing was lost."""

    code = "claim-lost"


def is_infrastructure_error(e: BaseException) -> bool:
    """NATS or PostgreSQL away (REL-6): the work waits and is retried, it is never dead-lettered."""
    if isinstance(e, (BusUnavailable, ClaimLost, OSError, asyncpg.PostgresConnectionError,
                      asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError, asyncpg.InterfaceError,
                      asyncpg.TooManyConnectionsError, nats.errors.Error, TimeoutError)):
        return True
    return isinstance(e, RemoteError) and e.code == BusUnavailable.code


@dataclass
class UnitOutcome:
    ok: bool
    reason: str
    dispatches: int
    missing_blocks: list[str] = field(default_factory=list)
    output_chars: int = 0
    runs: list[rm.WriterFinished] = field(default_factory=list)  # every dispatch, for usage (USE-1)


@dataclass
class DriverState:
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # one flow per novel (DRV-1)
    driving: set[str] = field(default_factory=set)  # novels with a unit flow in this process
    notices: int = 0
    units_done: int = 0
    running: bool = True


class Driver:
    name = "driver"

    def __init__(self, ctx: ActorContext, *, max_parallel_novels: int = 64, instance: str = "driver-0",
                 redelivery_backoff_s: float = 0.5, writer_timeout_s: float | None = None,
                 lease_s: float = LEASE_S, usage_retry_s: float = USAGE_RETRY_S) -> None:
        self.ctx = ctx
        self.state = DriverState()
        # Stable per driver process slot (like a claim-manager instance): a restarted driver gives
        # back exactly the claims its previous incarnation leased (REL-1).
        self.instance = check_instance(instance)
        self.redelivery_backoff_s = redelivery_backoff_s
        self.writer_timeout_s = writer_timeout_s or ctx.settings.writer_timeout_s
        self.lease_s = lease_s
        self._sweeper: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(max_parallel_novels)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        # PLAN-1..5: the driver serves steering commands (revisions, config, directives)
        self.steering = Steering(ctx, self.state.locks,
                                 lambda novel_id, reason: publish_notice(ctx, novel_id, reason=reason))
        # REL-7: settles what a dead process left half done; sends usage off the unit's path.
        self.accounting = Accounting(ctx, self.instance, publish_notice, lease_s=lease_s,
                                     usage_retry_s=usage_retry_s)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.ctx.subjects
        cfg = driver_consumer_config(s)
        self._psub = await self.ctx.js.pull_subscribe(s.work_all, durable=cfg.durable_name, stream=s.work_stream,
                                                      config=cfg)
        await self.resume_active_novels()
        await self.steering.reconcile()
        await self.steering.service.start()
        self._loop_task = asyncio.create_task(self._pull_loop(), name="driver-pull")
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="driver-sweep")

    async def stop(self) -> None:
        self.state.running = False
        with contextlib.suppress(Exception):
            await self.steering.service.stop()
        for task in (self._loop_task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._tasks:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.accounting.stop()
        with contextlib.suppress(Exception):
            await self._psub.unsubscribe()

    async def resume_active_novels(self) -> None:
        """A starting driver drives nothing yet: the claims its previous incarnation leased go back
        to prepared, so do claims nobody drives any more, and every active novel gets a notice, so
        no work waits for a redelivery timeout (REL-1)."""
        pool = self.ctx.pool
        await self._announce_released(
            await store.release_held_claims(pool, self.instance, reason="driver-restart"), "driver-restart")
        await self._announce_released(
            await store.release_lapsed_claims(pool, grace_s=self.lease_s, reason="lease-expired"), "lease-expired")
        # REL-7: what the previous incarnation (or any dead flow) committed but did not account.
        await self.accounting.reconcile(restarted=True)
        for novel in await store.list_novels(pool):
            if novel.status == "active":
                await publish_notice(self.ctx, novel.novel_id, reason="driver-start")

    async def _announce_released(self, released: list[tuple[str, str]], reason: str) -> None:
        for novel_id, unit_id in released:
            log.info("claim on %s/%s released (%s)", novel_id, unit_id, reason)
            await self.ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=unit_id, reason=reason))

    async def _sweep_loop(self) -> None:
        """REL-1, CLM-5: a claim whose lease lapsed has nobody driving it (its driver died, or the
        claim-manager instance holding its delegation died and did not come back): any driver
        returns it to prepared and gives the novel a fresh notice."""
        tally.actor.set("driver")
        while self.state.running:
            await asyncio.sleep(SWEEP_S)
            try:
                released = await store.release_lapsed_claims(self.ctx.pool, grace_s=self.lease_s,
                                                             exclude_novel_ids=sorted(self.state.driving))
                await self._announce_released(released, "lease-expired")
                for novel_id in sorted({n for n, _ in released}):
                    await publish_notice(self.ctx, novel_id, reason="lease-expired")
                await self.accounting.reconcile(exclude_novel_ids=sorted(self.state.driving))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the store or NATS away: next sweep (REL-6)
                log.warning("claim sweep failed (%s)", type(e).__name__)

    async def _pull_loop(self) -> None:
        tally.actor.set("driver")  # this task and the flows it starts count as the driver's
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
            await self._advance_until_done(notice)
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
                    await msg.nak(delay=min(30.0, self.redelivery_backoff_s * 2**delivered))
            return
        finally:
            heartbeat.cancel()
        with contextlib.suppress(Exception):  # NATS away: the notice is redelivered, and changes nothing twice
            await outbox.settle()  # the flow's last events are stored before its notice is done
            await msg.ack()

    async def _advance_until_done(self, notice: WorkNotice) -> None:
        """Run the notice; NATS or PostgreSQL being away delays it without consuming a delivery
        (REL-6), an actor answering `internal` is retried for a while, anything else raises."""
        started, attempt = time.monotonic(), 0
        while True:
            try:
                lock = self.state.locks.setdefault(notice.novel_id, asyncio.Lock())
                async with lock:
                    await self.advance(notice)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                internal = isinstance(e, RemoteError) and e.code == "internal"
                if not self.state.running or not (
                        is_infrastructure_error(e) or (internal and time.monotonic() - started < INTERNAL_RETRY_S)):
                    raise
                attempt += 1
                delay = min(5.0, 0.25 * 2 ** min(attempt, 5))
                log.warning("notice for %s delayed (%s); retry %s in %.1f s", notice.novel_id,
                            getattr(e, "code", type(e).__name__), attempt, delay)
                await asyncio.sleep(delay)

    async def _heartbeat(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                await msg.in_progress()

    async def _dead_letter(self, msg: Msg, code: str, detail: str) -> None:
        """Poison: the notice goes to `novelbus.dlq.work` with its error, then leaves the work stream.
        If the dead-letter publish fails, the notice stays (nak), so it is never silently dropped."""
        meta = msg.metadata
        headers = {"Novelbus-Error": code, "Novelbus-Error-Detail": detail[:300], "Novelbus-Subject": msg.subject,
                   "Novelbus-Deliveries": str(meta.num_delivered if meta else 1)}
        if meta is not None:  # a repeated dead-lettering of one stream message is stored once
            headers["Nats-Msg-Id"] = f"dlq-{meta.stream}-{meta.sequence.stream}"
        try:
            await self.ctx.js.publish(self.ctx.subjects.dead_letter("work"), msg.data, headers=headers)
        except Exception as e:  # noqa: BLE001
            log.warning("dead-letter publish failed (%s); the notice stays", type(e).__name__)
            with contextlib.suppress(Exception):
                await msg.nak(delay=5.0)
            return
        with contextlib.suppress(Exception):
            await msg.term()

    # --- decisions ------------------------------------------------------------------------
    async def advance(self, notice: WorkNotice) -> None:
        pool = self.ctx.pool
        # An unknown novel raises NovelNotFound: a poison notice, dead-lettered after the bound.
        # PERF-2: the novel row (budgets, counters, mode) is read with the snapshot, one statement.
        snapshot, novel = await store.load_snapshot_and_novel(pool, notice.novel_id)
        if _removed_scene_units(snapshot) or any(u.state == "superseded" for u in snapshot.units):
            snapshot = await self.supersede_removed(snapshot)
        decision = next_work(snapshot)
        if isinstance(decision, InFlight) and snapshot.novel_id not in self.state.driving:
            # Leased by this driver instance but driven by no flow here: a flow that could not
            # give its claim back (the database was away). Release it now, not after the lease.
            released = await store.release_held_claims(pool, self.instance, reason="flow-interrupted",
                                                       novel_id=snapshot.novel_id)
            if released:
                await self._announce_released(released, "flow-interrupted")
                snapshot = await store.load_snapshot(pool, notice.novel_id, prose=False)
                decision = next_work(snapshot)
        if isinstance(decision, (Inactive, InFlight)):
            return  # paused/finished, or another flow holds the unit
        if isinstance(decision, AwaitOutline):
            # PLAN-2: planning needed is a conversation: whoever plans is asked, with why.
            if await self.pause(snapshot.novel_id, "awaiting-outline", decision.reason):
                request = outline_request(snapshot, decision)
                await self.ctx.emit(ev.OutlineRequested(novel_id=snapshot.novel_id,
                                                        **msgspec.structs.asdict(request)))
            return
        if isinstance(decision, RequirementConflict):
            await self.pause(snapshot.novel_id, "requirement-conflict",
                             f"{decision.blocked} requirement(s) blocked")
            return
        if isinstance(decision, Blocked):
            await self.pause(snapshot.novel_id, "awaiting-approval", "; ".join(decision.violations))
            return
        if isinstance(decision, Finish):
            await self.accounting.announce_chapters(snapshot.novel_id)  # REL-7: none lost to a death
            if await store.finish_novel(pool, snapshot.novel_id):
                await self.ctx.emit(ev.NovelFinished(novel_id=snapshot.novel_id, units=len(snapshot.units),
                                                     commits=len(snapshot.commits),
                                                     characters=snapshot.committed_characters))
            return
        assert isinstance(decision, WriteUnit)
        budgets = novel.config.budgets
        if novel.turns >= budgets.maxTurns:
            await self.pause(snapshot.novel_id, "budget", f"maxTurns {budgets.maxTurns} reached")
            return
        window_start = novel.duration_window_start.timestamp() if novel.duration_window_start else time.time()
        if (time.time() - window_start) * 1000 > budgets.maxDurationMs:
            await self.pause(snapshot.novel_id, "budget", f"maxDurationMs {budgets.maxDurationMs} reached")
            return
        await self.write_unit(snapshot, decision, notice, novel)

    async def supersede_removed(self, snapshot: NovelSnapshot) -> NovelSnapshot:
        """Prepared units whose scene a revision removed are superseded automatically (SPEC §16;
        the revision itself does it, this is the backstop), and every superseded unit is
        announced once with a `unit.superseded` event."""
        pool, novel_id = self.ctx.pool, snapshot.novel_id
        changed = bool(await store.supersede_removed_units(pool, novel_id))
        for unit_id, chapter_id, scene_id, reason in await store.unannounced_superseded_units(pool, novel_id):
            await self.ctx.emit(ev.UnitSuperseded(novel_id=novel_id, unit_id=unit_id, chapter_id=chapter_id,
                                                  scene_id=scene_id, reason=reason))
        return await store.load_snapshot(pool, novel_id, prose=False) if changed else snapshot

    async def pause(self, novel_id: str, reason: str, detail: str) -> bool:
        if await store.pause_novel(self.ctx.pool, novel_id, reason):
            await self.ctx.emit(ev.NovelPaused(novel_id=novel_id, reason=reason, detail=detail[:300]))
            return True
        return False

    # --- one unit -------------------------------------------------------------------------
    async def write_unit(self, snapshot: NovelSnapshot, decision: WriteUnit, notice: WorkNotice,
                         novel: store.NovelRow) -> None:
        ctx, pool, novel_id = self.ctx, self.ctx.pool, snapshot.novel_id
        unit_id = decision.unit_id
        if unit_id is None:
            unit_id = await store.prepare_unit(pool, novel_id, decision.chapter_id, decision.scene_id,
                                               fragment=decision.fragment,
                                               continuation_anchor=decision.continuation_anchor)
            await ctx.emit(ev.UnitPrepared(novel_id=novel_id, unit_id=unit_id, chapter_id=decision.chapter_id,
                                           scene_id=decision.scene_id, fragment=decision.fragment))
        mode = novel.writer_mode  # DRV-3: read at claim time; the claim keeps it to the end
        intent_id = f"intent-{secrets.token_hex(8)}"
        await store.record_intent(pool, novel_id, intent_id, unit_id, notice.notice_id)
        # REL-1: lease the unit before claiming it (the claim carries this intent), so a claim always
        # has somebody responsible for it, even if this process dies right after the claim.
        if not await store.hold_lease(pool, novel_id, unit_id, intent_id, self.instance, self.lease_s):
            return  # the unit moved on (claimed by another flow, committed); the state decides
        try:
            # SPEC §16 Claim: the claim carries the outline revision and requirement watermark this
            # decision was made on; a revision or directive in between refuses it (PLAN-1, PLAN-4).
            claim = await request(ctx.nc, ctx.subjects.claims,
                                  cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id=intent_id, mode=mode,
                                               outline_revision=snapshot.outline_revision,
                                               requirement_watermark=snapshot.requirement_watermark,
                                               begin_dispatch=True),
                                  cm.UnitClaimed, timeout=ctx.settings.request_timeout_s, retries=2)
        except RemoteError as e:
            if e.code in ("unit-not-claimable", "unit-in-flight", "novel-not-active"):
                return  # someone else moved it on; the state decides what comes next
            if e.code in ("revision-conflict", "watermark-conflict", "requirements-open"):
                # steered in between: look again at the new state
                await publish_notice(ctx, novel_id, reason="steered", dedupe=f"steered-{intent_id}")
                return
            raise
        self.state.driving.add(novel_id)
        # The lease is kept until the turn is accounted: reconciliation leaves a live flow's
        # commit to the flow (REL-7).
        keeper = asyncio.create_task(self._keep_lease(novel_id, unit_id, intent_id))
        try:
            await self._drive_claim(novel, snapshot, claim, mode)
        finally:
            keeper.cancel()
            self.state.driving.discard(novel_id)

    async def _drive_claim(self, novel: store.NovelRow, snapshot: NovelSnapshot, claim: cm.UnitClaimed,
                           mode: str) -> None:
        ctx, novel_id, unit_id = self.ctx, novel.novel_id, claim.unit_id
        try:
            outcome = await self.run_claim(novel, snapshot, claim, mode)
        except ClaimLost:
            settled = await self._settle(novel_id, unit_id, claim, "claim-lost")
            if settled is None:
                await publish_notice(ctx, novel_id, reason="claim-lost")
                return
            outcome = settled
        except Exception as e:
            # NATS, the database or an actor away mid-flow: give the claim back (unless the commit
            # already went through, which is then accounted) and let the notice retry (REL-1, REL-6).
            # Settling waits for the infrastructure: a retried notice would see the unit committed
            # and move on, and this unit's turn would never be accounted.
            settled = None
            with contextlib.suppress(Exception):
                settled = await self._until_available(
                    lambda: self._settle(novel_id, unit_id, claim, "flow-interrupted"))
            if settled is None:
                raise e
            outcome = settled
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._settle(novel_id, unit_id, claim, "driver-stopped"), 5)
            raise
        # The turn is accounted exactly once (turn ledger), so waiting out an outage here is safe.
        await self._until_available(
            lambda: self.account(novel_id, unit_id, claim, outcome, snapshot, mode, novel))

    async def _until_available(self, step: Callable[[], Awaitable[T]], *, limit_s: float = 120.0) -> T:
        """Run an idempotent step, waiting out NATS or PostgreSQL being away (REL-6)."""
        started, attempt = time.monotonic(), 0
        while True:
            try:
                return await step()
            except Exception as e:
                if not (self.state.running and is_infrastructure_error(e)) or time.monotonic() - started > limit_s:
                    raise
                attempt += 1
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(attempt, 5)))

    async def _keep_lease(self, novel_id: str, unit_id: str, intent_id: str) -> None:
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            try:
                if not await store.hold_lease(self.ctx.pool, novel_id, unit_id, intent_id, self.instance,
                                              self.lease_s):
                    # Say what happened: the unit left this claim (released, recovered or lapsed).
                    outcome = await store.claim_outcome(self.ctx.pool, novel_id, unit_id, intent_id)
                    if outcome == "committed":
                        log.info("lease on %s/%s ended: the unit committed under this claim", novel_id, unit_id)
                    else:
                        log.warning("lease on %s/%s lost: the claim was released elsewhere; a commit under it"
                                    " will be refused", novel_id, unit_id)
                    return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the database away: try again (REL-6)
                log.warning("lease renewal for %s failed (%s)", unit_id, type(e).__name__)

    async def _committed_under(self, novel_id: str, unit_id: str, claim: cm.UnitClaimed) -> bool:
        """VER-1: the store, not a reply, says whether this claim's commit landed (a reply lost to a
        NATS or database hiccup must not turn a written unit into a failed one or a re-dispatch)."""
        commit = await store.get_commit_for_unit(self.ctx.pool, novel_id, unit_id)
        return commit is not None and commit.claim_id == claim.claim_id

    async def _settle(self, novel_id: str, unit_id: str, claim: cm.UnitClaimed, reason: str) -> UnitOutcome | None:
        """An interrupted flow: committed under this claim → a success to account (the store is the
        truth, VER-1); otherwise the claim goes back to prepared (STORE-4) and None is returned."""
        if await self._committed_under(novel_id, unit_id, claim):
            return UnitOutcome(True, "committed", 0)
        if await store.release_claim(self.ctx.pool, novel_id, unit_id, reason=reason, claim_id=claim.claim_id):
            await self.ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=unit_id, reason=reason))
        return None

    async def run_claim(self, novel: store.NovelRow, snapshot: NovelSnapshot, claim: cm.UnitClaimed,
                        mode: str) -> UnitOutcome:
        """Dispatch writers for one claim, up to writerDispatchLimit (RUN-4, DRV-4)."""
        ctx, novel_id, unit_id = self.ctx, novel.novel_id, claim.unit_id
        # DRV-2: an inline unit goes to the novel's one author session (trimmed pack → brief).
        shape = "inline" if mode == "inline" else novel.config.writerShape
        pack_shape = "full" if shape == "W1" else "trimmed"
        reasons: list[str] = []
        runs: list[rm.WriterFinished] = []
        dispatches = 0
        last_output = 0
        granted = claim.dispatch  # PERF-2: the claim reply carries the first dispatch grant
        while True:
            if granted is not None:
                dispatches, granted = granted, None
            else:
                try:  # CLM-5: to the claim-manager instance holding the delegation
                    grant = await request(ctx.nc, claims_instance_subject(ctx.subjects, claim.instance),
                                          cm.BeginDispatch(delegation_id=claim.delegation_id),
                                          cm.DispatchGranted, timeout=ctx.settings.request_timeout_s, retries=2)
                except RemoteError as e:
                    if e.code == "dispatch-limit":
                        break
                    if e.code == "delegation-not-found":  # CLM-4: the instance restarted and recovered it
                        raise ClaimLost(e.detail) from None
                    raise
                except BusUnavailable:
                    raise ClaimLost(f"claim-manager instance {claim.instance} not reachable") from None
                dispatches = grant.dispatch
            try:
                pack = await request(ctx.nc, ctx.subjects.packs,
                                     pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape=pack_shape,
                                                   profile=novel.config.continuityProfile),
                                     pm.PackRendered, timeout=ctx.settings.request_timeout_s, retries=2)
            except RemoteError as e:
                if e.code == "pack-error":  # PACK-4: no writer starts on a broken pack
                    return UnitOutcome(False, "pack-error", dispatches, missing_blocks=_missing_blocks(e.detail),
                                       runs=runs)
                raise
            run_id = f"run-{secrets.token_hex(8)}"
            result = await request(
                ctx.nc, ctx.subjects.runs,
                rm.RunWriter(novel_id=novel_id, unit_id=unit_id, run_id=run_id, delegation_id=claim.delegation_id,
                             instance=claim.instance, shape=shape, pack_text=pack.text, dispatch=dispatches,
                             context_sha256=pack.context_sha256, claim_id=claim.claim_id,
                             context_window=novel.config.model.contextWindow,
                             usage_threshold_ratio=novel.config.model.usageThresholdRatio),
                rm.WriterFinished, timeout=self.writer_timeout_s)
            runs.append(result)
            last_output = result.output_chars
            if not result.ok:
                reasons.append(result.reason)
                if await self._committed_under(novel_id, unit_id, claim):  # the commit's reply was lost
                    return UnitOutcome(True, "committed", dispatches, output_chars=last_output, runs=runs)
                if result.reason == "window-exceeded":  # MODEL-5: deterministic; no re-dispatch
                    break
                continue
            if shape == "W1":
                failure = await self._commit_draft(novel_id, unit_id, claim, run_id, result, pack.context_sha256)
                if failure:
                    reasons.append(failure)
                    if await self._committed_under(novel_id, unit_id, claim):
                        return UnitOutcome(True, "committed", dispatches, output_chars=last_output, runs=runs)
                    continue
            verified = await request(ctx.nc, ctx.subjects.verify,
                                     vm.VerifyCommit(novel_id=novel_id, unit_id=unit_id, claim_id=claim.claim_id,
                                                     run_id=run_id),
                                     vm.Verified, timeout=ctx.settings.request_timeout_s, retries=2)
            if verified.ok:
                return UnitOutcome(True, "committed", dispatches, output_chars=last_output, runs=runs)
            await ctx.emit(ev.VerificationFailed(novel_id=novel_id, unit_id=unit_id, run_id=run_id,
                                                 failure=verified.failure or "unknown"))
            reasons.append(f"verify:{verified.failure}")
        return UnitOutcome(False, reasons[-1] if reasons else "dispatch-limit", dispatches, output_chars=last_output,
                           runs=runs)

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
                      before: NovelSnapshot, mode: str | None = None,
                      novel: store.NovelRow | None = None) -> None:
        """Account the turn, then schedule the next unit or apply the failure policy (DRV-4, DRV-6).

        REL-2: the turn is accounted once per claim (the store's turn ledger); a repeated call for
        the same claim records no usage and emits no event twice, it only re-publishes what comes
        next (notices are de-duplicated, releases are conditional)."""
        ctx, pool = self.ctx, self.ctx.pool
        if novel is None:  # the flow's own row: budgets and mode as they were at claim time
            novel = await store.get_novel(pool, novel_id)
        budgets = novel.config.budgets
        external = not outcome.ok and outcome.reason in EXTERNAL_REASONS
        kind: store.TurnOutcome = "committed" if outcome.ok else "external" if external else "failed"
        signature = f"{unit_id}:{outcome.reason}"
        counters, first = await store.account_turn(
            pool, novel_id, claim.claim_id, outcome=kind,
            writer_output_chars=outcome.output_chars if outcome.ok else 0,
            failure_signature=signature if kind == "failed" else None, unit_id=unit_id, holder=self.instance)
        if first and outcome.runs:  # USE-1: every call of every dispatch of this turn, in the claimed mode
            self._record_usage(novel_id, unit_id, claim, outcome, mode or novel.writer_mode, counters.turns)
        elif first:  # REL-7: one sample or marker per turn; this one made no model call to sample
            await self.accounting.mark_missing(novel_id, unit_id, claim.claim_id, counters.turns, "no-writer-run")
        if outcome.ok:
            if first:
                self.state.units_done += 1
                after = await store.load_snapshot(pool, novel_id, prose=False)
                for chapter_id in sorted(set(completed_chapters(after)) - set(completed_chapters(before))):
                    await ctx.emit(ev.ChapterCompleted(novel_id=novel_id, chapter_id=chapter_id))
            await publish_notice(ctx, novel_id, reason="next-unit", dedupe=f"after-{unit_id}-{claim.claim_id}")
            return
        if first:
            await ctx.emit(ev.UnitFailed(novel_id=novel_id, unit_id=unit_id, reason=outcome.reason,
                                         signature=signature, dispatches=outcome.dispatches,
                                         missing_blocks=outcome.missing_blocks))
        try:  # CLM-5: to the instance holding the delegation; the store directly if it is away
            await request(ctx.nc, claims_instance_subject(ctx.subjects, claim.instance),
                          cm.ReleaseClaim(delegation_id=claim.delegation_id, reason=outcome.reason[:120]),
                          cm.ClaimReleased, timeout=ctx.settings.request_timeout_s, retries=2)
        except (RemoteError, BusUnavailable):
            if await store.release_claim(pool, novel_id, unit_id, reason=outcome.reason[:120],
                                         claim_id=claim.claim_id):
                await ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=unit_id, reason=outcome.reason[:120]))
        if outcome.reason == "window-exceeded":
            # MODEL-5: the model's window cannot hold this unit's request; retrying cannot help.
            await self.pause(novel_id, "recovery-required",
                             "window-exceeded: the writer request does not fit the model's context window "
                             "(raise config.model.contextWindow or use a model with a larger window)")
            return
        if external:
            # DRV-4 externalRetry: the provider was away, not the unit at fault. Retried with a
            # growing backoff up to maxAttempts consecutive times, then the novel pauses.
            lost = await store.external_failures(pool, novel_id)
            retry = budgets.externalRetry
            if lost >= retry.maxAttempts:
                await self.pause(novel_id, "recovery-required",
                                 f"externalRetry: {lost} consecutive turns lost to {outcome.reason}")
            else:
                await asyncio.sleep(retry.backoffMs / 1000 * 2 ** (max(lost, 1) - 1))
                await publish_notice(ctx, novel_id, reason="external-retry")
            return
        # DRV-6 after recording progress (the original checked before): same unit, same signature.
        if counters.stall_count >= budgets.stallThresholdTurns:
            await self.pause(novel_id, "stalled", signature)
        elif counters.consecutive_failures >= budgets.consecutiveFailureLimit:
            await self.pause(novel_id, "recovery-required",
                             f"{counters.consecutive_failures} consecutive failed units; last {signature}")
        else:
            await asyncio.sleep(budgets.externalRetry.backoffMs / 1000 * min(counters.consecutive_failures, 3))
            await publish_notice(ctx, novel_id, reason="retry")

    def _record_usage(self, novel_id: str, unit_id: str, claim: cm.UnitClaimed, outcome: UnitOutcome,
                      mode: str, turn: int) -> None:
        """USE-2: usage is observation — sent from a task the driver owns, never awaited by the
        flow, so a sampler that is away delays no unit; recorded exactly once (the turn's key)."""
        tool_bytes: dict[str, int] = {}
        for r in outcome.runs:
            for tool, n in r.tool_bytes.items():
                tool_bytes[tool] = tool_bytes.get(tool, 0) + n
        self.accounting.record_usage_later(um.RecordTurn(
            novel_id=novel_id, unit_id=unit_id, mode=mode, turn=turn,
            provider=outcome.runs[-1].provider, calls=[c for r in outcome.runs for c in r.calls],
            tool_bytes=tool_bytes, writer_output_chars=outcome.output_chars, committed=outcome.ok,
            claim_id=claim.claim_id, dispatches=len(outcome.runs),
            model_ms=sum(r.model_ms for r in outcome.runs)))


def _removed_scene_units(snapshot: NovelSnapshot) -> list[str]:
    """Prepared units whose (chapter, scene) the current outline no longer has."""
    outline = snapshot.outline
    if outline is None:
        return []
    chapters = {c.chapterId for c in outline.chapters}
    scenes = {(s.chapterId, s.sceneId) for s in outline.scenes if s.chapterId in chapters}
    return [u.unit_id for u in snapshot.units
            if u.state == "prepared" and (u.chapter_id, u.scene_id) not in scenes]


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
    await outbox.settle()  # the flow's events are stored before the notice that follows them
    tally.count("publishes")
    tally.count("publish_waits")
    await ctx.js.publish(ctx.subjects.work(novel_id), data, headers=headers)
    return notice_id
