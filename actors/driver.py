"""Driver (DRV-1..6): consumes work notices, asks the pure `next_work`, runs one unit's flow.

Flow for a `subagent` novel: claim → render pack → dispatch writer → verify → account the turn
→ schedule the next unit (a new durable work notice). Units of one novel are strictly
sequential (one flow per novel at a time); different novels run concurrently.

What lives elsewhere: the JetStream loop (fetch, heartbeat, nak backoff, dead letters) is
`bus.consumer.DurablePullConsumer`; one claim's flow is the pure `novel.unit_flow`, carried out by
`actors.unit_flow`; the other decisions are pure too (`novel.next_work`, `novel.after_turn`). This
module leases, decides and accounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, TypeVar

import msgspec

from novelbus import store
from novelbus.actors.accounting import USAGE_RETRY_S, Accounting
from novelbus.actors.context import ActorContext
from novelbus.actors.extraction import CanonKeeper
from novelbus.actors.steering import Steering
from novelbus.actors.unit_flow import (
    ClaimLost,
    UnitFlow,
    is_infrastructure_error,
    usage_record,
)
from novelbus.bus import outbox, tally
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.bus.consumer import DurablePullConsumer, error_code
from novelbus.bus.notices import publish_notice
from novelbus.bus.routes import check_instance, claims_instance_subject
from novelbus.bus.streams import WORK_MAX_DELIVER, driver_consumer_config
from novelbus.bus.tasks import cancel_and_wait
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages.errors import (
    INTERNAL,
    NOVEL_NOT_ACTIVE,
    REQUIREMENTS_OPEN,
    REVISION_CONFLICT,
    UNIT_IN_FLIGHT,
    UNIT_NOT_CLAIMABLE,
    WATERMARK_CONFLICT,
)
from novelbus.messages.work import WorkNotice
from novelbus.novel.after_turn import (
    NextUnit,
    Pause,
    after_turn,
    budget_exhausted,
    failure_signature,
    removed_scene_units,
    turn_kind,
)
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
from novelbus.novel.retry import RetryPolicy
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.unit_flow import UnitOutcome

log = logging.getLogger(__name__)

T = TypeVar("T")

HEARTBEAT_S = 5.0  # in-progress acks; well inside the consumer's ack wait
LEASE_S = 12.0  # a flow's lease on its unit; renewed every LEASE_RENEW_S while the flow runs (REL-1)
LEASE_RENEW_S = 3.0
SWEEP_S = 2.0  # how often a driver looks for claims nobody drives any more
INTERNAL_RETRY_S = 30.0  # an actor answering `internal` is retried in place this long, then the notice naks
# REL-6: a notice waits out NATS or PostgreSQL being away (no attempt bound: the error class decides)
NOTICE_RETRY = RetryPolicy(initial_interval_s=0.5, maximum_interval_s=5.0)
# REL-6 inside a flow that holds a claim: shorter waits, so the unit resumes soon after the outage
STEP_RETRY = RetryPolicy(initial_interval_s=0.2, maximum_interval_s=2.0)


STOP_GRACE_S = 10.0  # how long a stopping driver waits for its cancelled continuations
MAX_CONTINUED = 4096  # notices continued in-process whose JetStream copy has not come back yet


class FlowLock(asyncio.Lock):
    """A novel's flow lock (FIFO) that counts its acquisitions: a continuation can tell whether
    anybody (a steering command, another notice) held the novel between two of its steps."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        self.epoch += 1
        return True


class FlowLocks(dict[str, asyncio.Lock]):
    """Per-novel flow locks; `setdefault(novel, anything)` always stores a FlowLock (steering
    takes the same locks the same way)."""

    def setdefault(self, key: str, default: asyncio.Lock | None = None) -> asyncio.Lock:
        lock = self.get(key)
        if lock is None:
            lock = self[key] = FlowLock()
        return lock


@dataclass(frozen=True)
class UnsettledFlow:
    """A flow of this driver interrupted after its claim whose settling failed too: what its
    novel's next step needs to settle and account it first (REL-7)."""

    claim: cm.ClaimGranted
    before: NovelSnapshot
    novel: store.NovelRow
    mode: str


@dataclass
class DriverState:
    locks: FlowLocks = field(default_factory=FlowLocks)  # one flow per novel (DRV-1)
    unsettled: dict[str, UnsettledFlow] = field(default_factory=dict)  # novel → its unsettled flow
    # ADR 0003: notice id → outcome of its in-process continuation (True: done, its copy on the
    # work stream only needs acking; False: the copy is handled as any notice)
    continued: dict[str, asyncio.Future[bool]] = field(default_factory=dict)
    driving: set[str] = field(default_factory=set)  # novels with a unit flow in this process
    notices: int = 0
    continuations: int = 0  # notices run in-process right after the flow that published them
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
        self.lease_s = lease_s
        self.flow = UnitFlow(ctx, writer_timeout_s=writer_timeout_s or ctx.settings.writer_timeout_s)
        s = ctx.subjects
        self.consumer = DurablePullConsumer(
            ctx.nc, ctx.js, stream=s.work_stream, config=driver_consumer_config(s), message_type=WorkNotice,
            handle=self.on_notice, dead_letter_subject=s.dead_letter("work"), max_deliver=WORK_MAX_DELIVER,
            backoff_s=redelivery_backoff_s, heartbeat_s=HEARTBEAT_S, max_parallel=max_parallel_novels,
            before_ack=outbox.settle)  # a flow's last events are stored before its notice is done
        # PLAN-1..5: the driver serves steering commands (revisions, config, directives)
        self.steering = Steering(ctx, self.state.locks,
                                 lambda novel_id, reason: publish_notice(ctx, novel_id, reason=reason))
        # REL-7: settles what a dead process left half done; sends usage off the unit's path.
        self.accounting = Accounting(ctx, self.instance, publish_notice, lease_s=lease_s,
                                     usage_retry_s=usage_retry_s)
        # ROLE-3: extracts canon from each commit, off the unit's path, once per commit.
        self.canon = CanonKeeper(ctx)
        self._sweeper: asyncio.Task[None] | None = None
        self._continuations: set[asyncio.Task[None]] = set()

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.resume_active_novels()
        await self.steering.reconcile()
        await self.steering.service.start()
        await self.consumer.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="driver-sweep")
        self.canon.start()  # sweeps what a previous incarnation left unextracted

    async def stop(self) -> None:
        self.state.running = False
        with contextlib.suppress(Exception):
            await self.steering.service.stop()
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
        await self.consumer.stop()  # first: a copy waiting for its continuation is not acked
        # Their notices are on the work stream, unacked. Bounded: one deaf to its cancel must
        # not hang the stop.
        stuck = await cancel_and_wait(list(self._continuations), grace_s=STOP_GRACE_S)
        if stuck:
            log.warning("%d continuations did not stop within %.0f s", len(stuck), STOP_GRACE_S)
        await self.accounting.stop()
        await self.canon.stop()

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

    async def on_notice(self, notice: WorkNotice) -> None:
        """Run the notice; NATS or PostgreSQL being away delays it without consuming a delivery
        (REL-6), an actor answering `internal` is retried for a while, anything else raises (the
        consumer naks it, then dead-letters it after the redelivery bound)."""
        tally.actor.set("driver")  # this handler's task and the flows it runs count as the driver's
        tally.trace_key.set(notice.novel_id)  # a benchmark may trace where this novel's time goes
        tally.mark("notice in")
        self.state.notices += 1
        local = self.state.continued.get(notice.notice_id)
        if local is not None:  # this driver already runs (or ran) this notice in-process
            done = await asyncio.shield(local)
            self.state.continued.pop(notice.notice_id, None)
            if done:
                return  # its work is done and what it published is stored: ack the copy
        started, attempt = time.monotonic(), 0
        while True:
            try:
                lock = self.state.locks.setdefault(notice.novel_id, asyncio.Lock())
                with tally.span("novel lock"):
                    await lock.acquire()
                try:
                    await self.advance(notice)
                finally:
                    lock.release()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                internal = isinstance(e, RemoteError) and e.code == INTERNAL
                if not self.state.running or not (
                        is_infrastructure_error(e) or (internal and time.monotonic() - started < INTERNAL_RETRY_S)):
                    raise
                attempt += 1
                delay = NOTICE_RETRY.delay_s(attempt)
                log.warning("notice for %s delayed (%s); retry %s in %.1f s", notice.novel_id, error_code(e),
                            attempt, delay)
                await asyncio.sleep(delay)

    # --- decisions ------------------------------------------------------------------------
    async def advance(self, notice: WorkNotice,
                      known: tuple[NovelSnapshot, store.NovelRow] | None = None) -> None:
        """Decide and do the novel's next step; `known`: its snapshot and novel row as read after
        the previous turn, when nothing has held the novel since (a continuation)."""
        pool = self.ctx.pool
        left = self.state.unsettled.get(notice.novel_id)
        if left is not None:
            if await self._settle_left(notice.novel_id, left):
                return  # its turn accounted; what comes next was published (and continued) by `account`
            known = None  # its claim went back to prepared: read the novel again
        # An unknown novel raises NovelNotFound: a poison notice, dead-lettered after the bound.
        # PERF-2: the novel row (budgets, counters, mode) is read with the snapshot, one statement.
        snapshot, novel = known or await store.load_snapshot_and_novel(pool, notice.novel_id)
        if removed_scene_units(snapshot) or "superseded" in map(attrgetter("state"), snapshot.units):
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
            if await self.pause(snapshot.novel_id, Pause("awaiting-outline", decision.reason)):
                request = outline_request(snapshot, decision)
                await self.ctx.emit(ev.OutlineRequested(novel_id=snapshot.novel_id,
                                                        **msgspec.structs.asdict(request)))
            return
        if isinstance(decision, RequirementConflict):
            await self.pause(snapshot.novel_id, Pause("requirement-conflict", f"{decision.blocked} requirement(s) blocked"))
            return
        if isinstance(decision, Blocked):
            await self.pause(snapshot.novel_id, Pause("awaiting-approval", "; ".join(decision.violations)))
            return
        if isinstance(decision, Finish):
            await self.accounting.announce_chapters(snapshot.novel_id)  # REL-7: none lost to a death
            if await store.finish_novel(pool, snapshot.novel_id):
                await self.ctx.emit(ev.NovelFinished(novel_id=snapshot.novel_id, units=len(snapshot.units),
                                                     commits=len(snapshot.commits),
                                                     characters=snapshot.committed_characters))
            return
        assert isinstance(decision, WriteUnit)
        now = time.time()
        window_start = novel.duration_window_start.timestamp() if novel.duration_window_start else now
        exhausted = budget_exhausted(novel.config.budgets, turns=novel.turns, elapsed_ms=(now - window_start) * 1000)
        if exhausted is not None:
            await self.pause(snapshot.novel_id, exhausted)
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

    async def pause(self, novel_id: str, pause: Pause) -> bool:
        if await store.pause_novel(self.ctx.pool, novel_id, pause.reason):
            await self.ctx.emit(ev.NovelPaused(novel_id=novel_id, reason=pause.reason, detail=pause.detail[:300]))
            return True
        return False

    # --- one unit -------------------------------------------------------------------------
    async def write_unit(self, snapshot: NovelSnapshot, decision: WriteUnit, notice: WorkNotice,
                         novel: store.NovelRow) -> None:
        ctx, pool, novel_id = self.ctx, self.ctx.pool, snapshot.novel_id
        unit_id = decision.unit_id
        # DRV-3: read at claim time; the claim keeps it to the end (the store admits only these two)
        mode: cm.WriterMode = "inline" if novel.writer_mode == "inline" else "subagent"
        intent_id = f"intent-{secrets.token_hex(8)}"
        # DRV-1: the intent is recorded, and (REL-1) the unit leased before it is claimed (the claim
        # carries this intent), so a claim always has somebody responsible for it, even if this
        # process dies right after the claim — one statement (PERF-2).
        if unit_id is None:
            # PERF-2: a new unit is prepared, its unit.prepared ledger row written, the
            # intent recorded and the unit leased in ONE statement; then the row is published.
            chapter_id, scene_id, fragment = decision.chapter_id, decision.scene_id, decision.fragment

            def prepared_event(unit: str) -> ev.UnitPrepared:
                return ev.UnitPrepared(novel_id=novel_id, unit_id=unit, chapter_id=chapter_id, scene_id=scene_id,
                                       fragment=fragment)

            prepared = await store.prepare_and_lease_unit(
                pool, novel_id, chapter_id, scene_id, fragment=fragment,
                continuation_anchor=decision.continuation_anchor, intent_id=intent_id,
                notice_id=notice.notice_id, holder=self.instance, seconds=self.lease_s,
                event=lambda candidate: ctx.ledger_entry(prepared_event(candidate)))
            unit_id = prepared.unit_id
            assert prepared.event_seq is not None
            await ctx.publish_recorded(prepared_event(unit_id), prepared.event_seq)
            tally.mark("prepared")
            if not prepared.leased:
                return  # the unit moved on (claimed by another flow, committed); the state decides
        elif not await store.record_intent_and_lease(pool, novel_id, intent_id, unit_id, notice.notice_id,
                                                     self.instance, self.lease_s):
            return  # the unit moved on (claimed by another flow, committed); the state decides
        try:
            # SPEC §16 Claim: the claim carries the outline revision and requirement watermark this
            # decision was made on; a revision or directive in between refuses it (PLAN-1, PLAN-4).
            claim = await request(ctx.nc, ctx.subjects.claims,
                                  cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id=intent_id, mode=mode,
                                               outline_revision=snapshot.outline_revision,
                                               requirement_watermark=snapshot.requirement_watermark,
                                               begin_dispatch=True),
                                  cm.ClaimGranted, timeout=ctx.settings.request_timeout_s, retries=2)
        except RemoteError as e:
            if e.code in (UNIT_NOT_CLAIMABLE, UNIT_IN_FLIGHT, NOVEL_NOT_ACTIVE):
                return  # someone else moved it on; the state decides what comes next
            if e.code in (REVISION_CONFLICT, WATERMARK_CONFLICT, REQUIREMENTS_OPEN):
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

    async def _drive_claim(self, novel: store.NovelRow, snapshot: NovelSnapshot, claim: cm.ClaimGranted,
                           mode: str) -> None:
        """The claim's unit flow (`UnitFlow.drive`, the pure `novel.unit_flow`), then what its end
        asks: a lost claim's next step, the interrupting error raised (REL-1, REL-6: the notice is
        retried), or an unsettled flow kept for its novel's next step (REL-7)."""
        novel_id, unit_id = novel.novel_id, claim.unit_id
        try:
            done, cause = await self.flow.drive(
                novel, claim, mode, until_available=self._until_available,
                record=lambda outcome: self.account(novel_id, unit_id, claim, outcome, snapshot, mode, novel))
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flow.settle(novel_id, unit_id, claim, "driver-stopped"), 5)
            raise
        if done.result == "recorded":
            return
        if done.result == "released" and done.notice is not None:
            await publish_notice(self.ctx, novel_id, reason=done.notice)
            return
        if done.result == "unsettled":
            # Settling must not be skipped: a retried notice would see the unit committed and move
            # on, its turn unaccounted until the REL-7 sweep; its novel's next step settles it first.
            self.state.unsettled[novel_id] = UnsettledFlow(claim=claim, before=snapshot, novel=novel, mode=mode)
            log.warning("flow of %s/%s interrupted (%s) and not settled: its novel's next step settles it",
                        novel_id, unit_id, done.error)
        raise cause if cause is not None else ClaimLost(f"flow of {unit_id} ended {done.result} ({done.error})")

    async def _settle_left(self, novel_id: str, left: UnsettledFlow) -> bool:
        """REL-7: settle a flow of this driver that could not settle, before its novel moves on — a
        commit that landed is accounted now (True), else the claim goes back to prepared (False)."""
        unit_id = left.claim.unit_id

        async def once(step: Callable[[], Awaitable[T]]) -> T:
            return await step()  # the novel's notice is retried when this fails

        done, cause = await self.flow.drive(
            left.novel, left.claim, left.mode, until_available=once, resume=True,
            record=lambda outcome: self.account(novel_id, unit_id, left.claim, outcome, left.before, left.mode,
                                                left.novel))
        if done.result not in ("recorded", "released"):
            raise cause if cause is not None else ClaimLost(f"flow of {unit_id} not settled ({done.error})")
        self.state.unsettled.pop(novel_id, None)
        return done.result == "recorded"

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
                await asyncio.sleep(STEP_RETRY.delay_s(attempt))

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

    async def account(self, novel_id: str, unit_id: str, claim: cm.ClaimGranted, outcome: UnitOutcome,
                      before: NovelSnapshot, mode: str | None = None,
                      novel: store.NovelRow | None = None) -> None:
        """Account the turn, then act on the pure after-turn policy (DRV-4, DRV-6).

        REL-2: the turn is accounted once per claim (the store's turn ledger); a repeated call for
        the same claim records no usage and emits no event twice, it only re-publishes what comes
        next (notices are de-duplicated, releases are conditional)."""
        ctx, pool = self.ctx, self.ctx.pool
        if novel is None:  # the flow's own row: budgets and mode as they were at claim time
            novel = await store.get_novel(pool, novel_id)
        kind = turn_kind(outcome.ok, outcome.reason)
        signature = failure_signature(unit_id, outcome.reason)
        after: NovelSnapshot | None = None
        if outcome.ok:  # PERF-2: the next decision's input read in the same statement
            counters, first, after = await store.account_turn_and_snapshot(
                pool, novel_id, claim.claim_id, outcome=kind, writer_output_chars=outcome.output_chars,
                unit_id=unit_id, holder=self.instance)
        else:
            counters, first = await store.account_turn(
                pool, novel_id, claim.claim_id, outcome=kind, writer_output_chars=0,
                failure_signature=signature if kind == "failed" else None, unit_id=unit_id, holder=self.instance)
        if first and outcome.runs:  # USE-1: every call of every dispatch of this turn, in the claimed mode
            # USE-2: usage is observation — sent from a task the driver owns, never awaited by the
            # flow, so a sampler that is away delays no unit; recorded exactly once (the turn's key).
            self.accounting.record_usage_later(
                usage_record(novel_id, unit_id, claim, outcome, mode or novel.writer_mode, counters.turns))
        elif first:  # REL-7: one sample or marker per turn; this one made no model call to sample
            await self.accounting.mark_missing(novel_id, unit_id, claim.claim_id, counters.turns, "no-writer-run")
        known: tuple[NovelSnapshot, store.NovelRow] | None = None
        if outcome.ok and first and after is not None:
            self.state.units_done += 1
            known = (after, counters)  # the next decision's input too
            if novel.config.extractor != "off":  # ROLE-3: off the unit's path
                self.canon.after_commit(novel_id)
            for chapter_id in sorted(set(completed_chapters(after)) - set(completed_chapters(before))):
                await ctx.emit(ev.ChapterCompleted(novel_id=novel_id, chapter_id=chapter_id))
        if not outcome.ok:
            if first:
                await ctx.emit(ev.UnitFailed(novel_id=novel_id, unit_id=unit_id, reason=outcome.reason,
                                             signature=signature, dispatches=outcome.dispatches,
                                             missing_blocks=list(outcome.missing_blocks)))
            await self._release(novel_id, unit_id, claim, outcome.reason[:120])
        lost = await store.external_failures(pool, novel_id) if kind == "external" else 0
        decision = after_turn(unit_id=unit_id, claim_id=claim.claim_id, ok=outcome.ok, reason=outcome.reason,
                              budgets=novel.config.budgets, stall_count=counters.stall_count,
                              consecutive_failures=counters.consecutive_failures, external_failures=lost)
        if isinstance(decision, NextUnit):
            # ADR 0003: once its notice is stored (for another process or a restart), the next
            # unit starts here at once, without a round trip through the work stream.
            notice_id = await publish_notice(ctx, novel_id, reason="next-unit", dedupe=decision.dedupe)
            self._continue(WorkNotice(novel_id=novel_id, notice_id=notice_id, reason="next-unit"), known)
        elif isinstance(decision, Pause):
            await self.pause(novel_id, decision)
        else:
            await asyncio.sleep(decision.delay_s)
            await publish_notice(ctx, novel_id, reason=decision.reason)

    def _continue(self, notice: WorkNotice, known: tuple[NovelSnapshot, store.NovelRow] | None) -> None:
        """Run `notice` in-process right after the flow that published it (ADR 0003: no round trip
        through the work stream between two units of a novel this driver is driving).

        The notice itself is on the work stream too. Its copy, when it comes back to this
        driver, waits for the continuation: done → acked; failed → handled like any notice (so
        every retry, backoff and dead-letter rule still applies). A copy delivered to another
        driver process is handled there as any notice: the claim lets only one of them write
        the unit (REL-2). Everything the previous flow published is stored before (the notice's
        publish waited for it), so per-novel order is as through the work stream."""
        if not self.state.running or notice.notice_id in self.state.continued:
            return  # stopping, or a retried accounting that already continued
        if len(self.state.continued) >= MAX_CONTINUED:  # copies that went to other processes
            for key in [k for k, f in self.state.continued.items() if f.done()][:MAX_CONTINUED // 2]:
                del self.state.continued[key]
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.state.continued[notice.notice_id] = outcome
        lock = self.state.locks.setdefault(notice.novel_id)
        epoch = lock.epoch if isinstance(lock, FlowLock) else -1
        task = asyncio.create_task(self._run_continuation(notice, known, epoch, outcome),
                                   name=f"continue-{notice.novel_id}")
        self._continuations.add(task)
        task.add_done_callback(self._continuations.discard)

    async def _run_continuation(self, notice: WorkNotice, known: tuple[NovelSnapshot, store.NovelRow] | None,
                                epoch: int, outcome: asyncio.Future[bool]) -> None:
        done = False
        try:
            lock = self.state.locks.setdefault(notice.novel_id)
            await lock.acquire()
            try:
                if not isinstance(lock, FlowLock) or lock.epoch != epoch + 1:
                    known = None  # somebody held the novel in between: read it again
                self.state.continuations += 1
                tally.mark("continued")  # the next unit did not wait for its notice's delivery
                await self.advance(notice, known)
            finally:
                lock.release()
            await outbox.settle()  # what it published is stored before its copy is acked (as before_ack)
            done = True
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the notice's copy on the work stream takes over
            log.info("continuation of %s left to its work notice (%s)", notice.novel_id, error_code(e))
        finally:
            if not outcome.done():
                outcome.set_result(done)

    async def _release(self, novel_id: str, unit_id: str, claim: cm.ClaimGranted, reason: str) -> None:
        """A failed turn gives its claim back: through the claim-manager instance holding the
        delegation (CLM-5), or directly in the store if that instance is away."""
        ctx = self.ctx
        try:
            await request(ctx.nc, claims_instance_subject(ctx.subjects, claim.instance),
                          cm.ReleaseClaim(delegation_id=claim.delegation_id, reason=reason),
                          cm.ReleaseConfirmed, timeout=ctx.settings.request_timeout_s, retries=2)
        except (RemoteError, BusUnavailable):
            if await store.release_claim(ctx.pool, novel_id, unit_id, reason=reason, claim_id=claim.claim_id):
                await ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=unit_id, reason=reason))
