"""The driver's accounting that no death can lose (REL-7), and usage that never delays a unit.

A unit's flow accounts its own turn. What a dead process left half done, the store still shows,
and `Accounting.reconcile` settles it — on driver start and in every sweep — with the same
once-only keys as the normal path, so running both changes nothing twice:

- a commit whose claim has no turn row and whose flow is gone gets its turn, its usage sample
  sent from the writer runs the store kept (SERVE-5), then the novel a notice;
- a turn whose usage sample never came (its sender died, or gave up while the sampler was
  away) is sent again from the store, however late; only a turn whose figures are gone (no
  writer run of its claim reported) gets one `usage.missing` marker, naming why;
- a writer run left `running` after its claim ended is closed `abandoned` (`writer.abandoned`);
- a commit without `unit.committed`, a completed chapter without `chapter.completed`, a finished
  novel without `novel.finished` get their event (each exists exactly once: `ActorContext.emit`);
- such an event already in the ledger whose emitter may have died before publishing it is
  published again from its row under its message id (stored once: the stream de-duplicates):
  `unit.committed` of a commit whose flow is gone, `chapter.completed` / `novel.finished` of the
  novels a restarted driver (or a sweep that found a dead flow's commit) looks at.

Usage samples go to the sampler from a task the driver owns, never awaited by the flow: a
sampler that is away delays nothing; the sample is retried for `usage_retry_s`, then left to
reconciliation, which sends it again from the store (every writer run keeps its calls' counts,
SERVE-5). A sample the sampler refuses for good is marked `usage.missing`. Either way the turn
gets exactly one (the turn ledger's `usage` column).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from novelbus import store
from novelbus.actors.context import ActorContext, once_key, once_key_of_commit, once_key_of_finish
from novelbus.bus.client import RemoteError, request
from novelbus.bus.tasks import cancel_and_wait
from novelbus.messages import events as ev
from novelbus.messages import usage as um
from novelbus.messages.runs import CallSample
from novelbus.novel.next_work import completed_chapters
from novelbus.novel.retry import RetryPolicy
from novelbus.store.usage import TurnFigures

log = logging.getLogger(__name__)

USAGE_RETRY_S = 30.0  # a sample is retried this long, then left to reconciliation (sent from the store)
USAGE_RETRY = RetryPolicy(initial_interval_s=0.4, maximum_interval_s=5.0)  # within USAGE_RETRY_S
USAGE_GRACE_S = 60.0  # reconciliation sends a turn's unsent sample again this long after it (> retry)
COMMIT_EVENT_GRACE_S = 10.0  # a commit this old without `unit.committed`: its claim manager died
SWEEP_WINDOW_S = 3600.0  # a periodic sweep looks at commits and finishes this recent; a starting driver at all

Notify = Callable[..., Awaitable[str]]  # publish_notice(ctx, novel_id, reason=…, dedupe=…)


def record_from_store(figures: TurnFigures) -> um.RecordTurn | None:
    """A turn's usage record rebuilt from the writer runs the store kept (SERVE-5), as the flow
    would have sent it: every call of every run of the claim that reported, the last one's
    provider and writer mode; None when no run reported (the figures are gone)."""
    runs = [r for r in figures.runs if r.usage is not None]
    if not runs:
        return None
    calls: list[CallSample] = []
    tool_bytes: dict[str, int] = {}
    model_ms = 0.0
    for r in runs:
        usage = r.usage or {}
        calls.extend(msgspec.convert(usage.get("calls") or [], list[CallSample]))
        for tool, n in (usage.get("toolBytes") or {}).items():
            tool_bytes[tool] = tool_bytes.get(tool, 0) + int(n)
        model_ms += float(usage.get("modelMs") or 0.0)
    last = runs[-1]
    committed = figures.outcome == "committed"
    ok = [r for r in runs if r.status == "ok"]
    # a run's `mode` is its shape: inline runs are the inline mode's, W1 and W2 the subagent mode's (DRV-2)
    mode = "inline" if last.mode == "inline" else "subagent"
    return um.RecordTurn(
        novel_id=figures.novel_id, unit_id=figures.unit_id, mode=mode, turn=figures.turn,
        provider=last.provider, calls=calls, tool_bytes=tool_bytes,
        writer_output_chars=ok[-1].output_chars if committed and ok else 0, committed=committed,
        claim_id=figures.claim_id, dispatches=len(runs), model_ms=model_ms)


def figures_gone(figures: TurnFigures | None) -> str:
    """Why a turn's usage cannot be sampled from the store (the marker's reason, SERVE-5)."""
    if figures is None or not figures.runs:
        return "figures-gone:no-writer-run"
    return "figures-gone:run-not-reported"  # its writer died before closing the run


@dataclass
class ReconcileReport:
    turns: list[tuple[str, str]] = field(default_factory=list)  # (novel, unit) accounted here
    usage_missing: int = 0
    usage_resent: int = 0  # samples sent again from the store (SERVE-5)
    abandoned_runs: int = 0
    events: list[str] = field(default_factory=list)  # once-keys of events emitted here

    def __bool__(self) -> bool:
        return bool(self.turns or self.usage_missing or self.usage_resent or self.abandoned_runs or self.events)


class Accounting:
    def __init__(self, ctx: ActorContext, instance: str, notify: Notify, *, lease_s: float,
                 usage_retry_s: float = USAGE_RETRY_S, usage_grace_s: float = USAGE_GRACE_S,
                 commit_event_grace_s: float = COMMIT_EVENT_GRACE_S) -> None:
        self.ctx = ctx
        self.instance = instance
        self.notify = notify
        self.lease_s = lease_s
        self.usage_retry_s = usage_retry_s
        self.usage_grace_s = usage_grace_s
        self.commit_event_grace_s = commit_event_grace_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending: set[tuple[str, str]] = set()  # (novel, claim) of the samples this process is sending

    async def stop(self) -> None:
        """Cancel samples still being retried; reconciliation marks their turns later."""
        await cancel_and_wait(list(self._tasks))

    async def idle(self) -> None:
        """Wait for every usage sample in flight (tests, an orderly stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- usage, off the unit's path --------------------------------------------------------
    def record_usage_later(self, record: um.RecordTurn) -> None:
        key = (record.novel_id, record.claim_id)
        self._sending.add(key)
        task = asyncio.create_task(self._send_usage(record), name=f"usage-{record.claim_id}")
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self._sending.discard(key)

        task.add_done_callback(done)

    async def _send_usage(self, record: um.RecordTurn) -> None:
        ctx, deadline, attempt = self.ctx, time.monotonic() + self.usage_retry_s, 0
        while True:
            try:
                await request(ctx.nc, ctx.subjects.usage, record, um.TurnRecorded,
                              timeout=min(ctx.settings.request_timeout_s, 10.0))
                return
            except asyncio.CancelledError:
                raise
            except RemoteError as e:
                reason = f"sampler-refused:{e.code}"
                if e.code not in ("internal", "bus-unavailable"):
                    # refused for good (e.g. bad input): retrying changes nothing, the figures are unusable
                    log.warning("usage of %s turn %s refused (%s); marked missing", record.unit_id, record.turn,
                                reason)
                    with contextlib.suppress(Exception):  # the store away too: reconciliation settles it
                        await self._mark(record.novel_id, record.unit_id, record.claim_id, record.turn, reason)
                    return
            except Exception as e:  # noqa: BLE001 - the sampler or NATS away: retry, then leave it pending
                reason = f"sampler-unavailable:{type(e).__name__}"
            attempt += 1
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(USAGE_RETRY.delay_s(attempt))
        # SERVE-5: the writer runs keep the figures: reconciliation sends the sample again later
        log.warning("usage of %s turn %s not recorded yet (%s); left to reconciliation", record.unit_id,
                    record.turn, reason)

    async def mark_missing(self, novel_id: str, unit_id: str, claim_id: str, turn: int, reason: str) -> bool:
        """A turn whose flow has no usage to send (`reason`): its sample is sent from the store
        when a writer run of its claim reported (SERVE-5), else it gets its marker, once. True
        when this call set the marker."""
        return await self._settle_from_store(novel_id, unit_id, claim_id, turn, reason) == "missing"

    async def _settle_from_store(self, novel_id: str, unit_id: str, claim_id: str, turn: int,
                                 reason: str | None = None) -> str | None:
        """Send a pending turn's sample again from the store ("resent"), or mark it missing where
        its figures are gone ("missing", the reason says why); "later" while a run of its claim
        is still open (its writer may yet report: a sweep comes back once it is closed or
        abandoned); None: nothing to do here (settled already, or being sent by this process)."""
        if (novel_id, claim_id) in self._sending:
            return None
        figures = await store.turn_figures(self.ctx.pool, novel_id, claim_id)
        if figures is not None and figures.usage is not None:
            return None
        record = None if figures is None else record_from_store(figures)
        if record is not None:
            self.record_usage_later(record)
            return "resent"
        if figures is not None and any(r.status == "running" for r in figures.runs):
            return "later"
        if reason is not None:
            log.info("usage of %s turn %s: %s, and no writer run of its claim reported", unit_id, turn, reason)
        return "missing" if await self._mark(novel_id, unit_id, claim_id, turn, figures_gone(figures)) else None

    async def _mark(self, novel_id: str, unit_id: str, claim_id: str, turn: int, reason: str) -> bool:
        """The turn's usage marker, once: True when this call set it."""
        if not await store.mark_turn_usage(self.ctx.pool, novel_id, claim_id, "missing"):
            return False
        await self.ctx.emit(ev.UsageMissing(novel_id=novel_id, unit_id=unit_id, claim_id=claim_id, turn=turn,
                                            reason=reason[:120]))
        return True

    # --- once-only events -------------------------------------------------------------------
    async def _emit_once(self, event: ev.Event, report: ReconcileReport | None = None, *,
                         republish: bool = False) -> None:
        """Write and publish a once-only event the ledger lacks. `republish`: its emitter may have
        died between the ledger row and the publish, so a row already there is published again
        under its message id (`republish_once`: the stream stores it once either way)."""
        key = once_key(event)
        if key is not None:
            if republish:
                if await self.ctx.republish_once(key, type(event)):
                    return
            elif await store.has_event(self.ctx.pool, key):
                return
        await self.ctx.emit(event)
        if report is not None and key is not None:
            report.events.append(key)

    async def announce_chapters(self, novel_id: str, report: ReconcileReport | None = None, *,
                                republish: bool = False) -> None:
        """Every completed chapter has its `chapter.completed` (DRV-5), recomputed from the store, in
        chapter order; with `republish`, rows already in the ledger are published again (REL-7)."""
        snapshot = await store.load_snapshot(self.ctx.pool, novel_id, prose=False)
        for chapter_id in completed_chapters(snapshot):
            await self._emit_once(ev.ChapterCompleted(novel_id=novel_id, chapter_id=chapter_id), report,
                                  republish=republish)

    # --- reconciliation ---------------------------------------------------------------------
    async def reconcile(self, *, restarted: bool = False, exclude_novel_ids: list[str] | None = None
                        ) -> ReconcileReport:
        """Settle what dead processes left half done (module docstring). `restarted`: this driver
        instance is starting, so whatever its previous incarnation held is settled at once."""
        pool, report = self.ctx.pool, ReconcileReport()
        holder = self.instance if restarted else None
        window = None if restarted else SWEEP_WINDOW_S
        touched: set[str] = set()
        later: list[tuple[str, str, str, int]] = []  # turns whose claim still has an open run
        for c in await store.unaccounted_commits(pool, grace_s=self.lease_s, restarted_holder=holder,
                                                 exclude_novel_ids=exclude_novel_ids, within_s=window):
            counters, first = await store.account_turn(pool, c.novel_id, c.claim_id, outcome="committed",
                                                       unit_id=c.unit_id, holder=self.instance)
            if first:
                log.info("turn of %s/%s (committed, its flow gone) accounted", c.novel_id, c.unit_id)
                await self.ctx.republish_once(once_key_of_commit(c.novel_id, c.unit_id), ev.UnitCommitted)
                report.turns.append((c.novel_id, c.unit_id))
                settled = await self._settle_from_store(c.novel_id, c.unit_id, c.claim_id, counters.turns)
                report.usage_resent += settled == "resent"
                report.usage_missing += settled == "missing"
                if settled == "later":
                    later.append((c.novel_id, c.unit_id, c.claim_id, counters.turns))
            touched.add(c.novel_id)
            await self.notify(self.ctx, c.novel_id, reason="next-unit", dedupe=f"after-{c.unit_id}-{c.claim_id}")
        # SERVE-5: a sample its sender left unsent is sent again from the store, however late
        for p in await store.pending_usage(pool, older_than_s=self.usage_grace_s, restarted_holder=holder):
            settled = await self._settle_from_store(p.novel_id, p.unit_id, p.claim_id, p.turn)
            report.usage_resent += settled == "resent"
            report.usage_missing += settled == "missing"
            if settled == "later":
                later.append((p.novel_id, p.unit_id, p.claim_id, p.turn))
        for r in await store.abandon_writer_runs(pool):
            report.abandoned_runs += 1
            await self.ctx.emit(ev.WriterAbandoned(novel_id=r.novel_id, unit_id=r.unit_id, run_id=r.run_id,
                                                   reason=r.reason))
        for novel_id, unit_id, claim_id, turn in later:  # their runs may be closed now (abandoned)
            settled = await self._settle_from_store(novel_id, unit_id, claim_id, turn)
            report.usage_resent += settled == "resent"
            report.usage_missing += settled == "missing"
        for m in await store.commits_without_event(pool, older_than_s=0 if restarted else self.commit_event_grace_s,
                                                   within_s=window):
            await self._emit_once(ev.UnitCommitted(
                novel_id=m.novel_id, unit_id=m.unit_id, commit_id=m.commit_id,
                effective_characters=m.effective_characters, total_characters=m.total_characters,
                body_sha256=m.body_sha256, context_sha256=m.context_sha256), report)
        # `chapter.completed` and `novel.finished` come from the driver: one that died between the
        # ledger row and the publish left them in the table only. Its restart (and a sweep that
        # found a dead flow's commit) publishes them again from their rows, chapters first, then
        # the finish: per-novel order (REL-7).
        finished: set[str] = set()
        if restarted:
            novels = [n for n in await store.list_novels(pool) if n.status in ("active", "finished")]
            touched.update(n.novel_id for n in novels)
            finished = {n.novel_id for n in novels if n.status == "finished"}
        for novel_id in sorted(touched):
            await self.announce_chapters(novel_id, report, republish=True)
            if novel_id in finished:
                await self.ctx.republish_once(once_key_of_finish(novel_id), ev.NovelFinished)
        for novel_id in await store.finished_without_event(pool, within_s=window):
            snapshot = await store.load_snapshot(pool, novel_id, prose=False)
            await self._emit_once(ev.NovelFinished(novel_id=novel_id, units=len(snapshot.units),
                                                   commits=len(snapshot.commits),
                                                   characters=snapshot.committed_characters), report)
        return report
