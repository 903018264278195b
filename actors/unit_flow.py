"""The driver's unit flow for one claim: dispatch → pack → writer (which commits) → verify (RUN-4, DRV-4).

A helper of the driver actor (actors/driver.py), not an actor: it holds no state of its own and
talks to the other actors only through their commands. The store, not a reply, is the truth of
whether a commit landed (VER-1).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import asyncpg  # type: ignore[import-untyped]
import nats.errors

from novelbus import store
from novelbus.actors.context import ActorContext, once_key_of_commit
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.bus.routes import claims_instance_subject
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.messages.errors import CLAIM_LOST, DELEGATION_NOT_FOUND, DISPATCH_LIMIT, PACK_ERROR
from novelbus.novel.after_turn import WINDOW_EXCEEDED
from novelbus.novel.quality import refused_code
from novelbus.store.detections import detection_gaps
from novelbus.writers.sampling import sampling_of

log = logging.getLogger(__name__)


class ClaimLost(Exception):
    """The claim ended under the flow: its delegation is gone (the claim-manager instance restarted
    and recovered it, or cannot be reached). The unit goes back to prepared; nothing was lost."""

    code = CLAIM_LOST


def is_infrastructure_error(e: BaseException) -> bool:
    """NATS or PostgreSQL away (REL-6): the work waits and is retried, it is never dead-lettered.

    asyncpg's InternalClientError ("cannot switch to state …; another operation … is in progress")
    is a pooled connection the server dropped in mid-operation: seen as the database stops."""
    if isinstance(e, (BusUnavailable, ClaimLost, OSError, asyncpg.PostgresConnectionError,
                      asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError, asyncpg.InterfaceError,
                      asyncpg.InternalClientError, asyncpg.TooManyConnectionsError, nats.errors.Error,
                      TimeoutError)):
        return True
    return isinstance(e, RemoteError) and e.code == BusUnavailable.code


@dataclass
class UnitOutcome:
    ok: bool
    reason: str
    dispatches: int
    missing_blocks: list[str] = field(default_factory=list)
    output_chars: int = 0
    runs: list[rm.WriterResult] = field(default_factory=list)  # every dispatch, for usage (USE-1)


class UnitFlow:
    """Runs one claim to an outcome; the driver owns leases, accounting and what comes next."""

    def __init__(self, ctx: ActorContext, *, writer_timeout_s: float) -> None:
        self.ctx = ctx
        self.writer_timeout_s = writer_timeout_s

    async def committed_under(self, novel_id: str, unit_id: str, claim: cm.ClaimGranted) -> bool:
        """VER-1: the store, not a reply, says whether this claim's commit landed (a reply lost to a
        NATS or database hiccup must not turn a written unit into a failed one or a re-dispatch)."""
        commit = await store.get_commit_for_unit(self.ctx.pool, novel_id, unit_id)
        return commit is not None and commit.claim_id == claim.claim_id

    async def landed(self, novel_id: str, unit_id: str, claim: cm.ClaimGranted) -> bool:
        """`committed_under` for a flow whose writer or commit reply failed although the commit
        landed: the claim manager may have died between the commit's statement (which writes the
        unit.committed row, PERF-2) and its publish, so the row is published again from the ledger
        (REL-7; the stream stores it once) before the unit counts as a success — per-novel order."""
        if not await self.committed_under(novel_id, unit_id, claim):
            return False
        await self.ctx.republish_once(once_key_of_commit(novel_id, unit_id), ev.UnitCommitted)
        return True

    async def settle(self, novel_id: str, unit_id: str, claim: cm.ClaimGranted, reason: str) -> UnitOutcome | None:
        """An interrupted flow: committed under this claim → a success to account (the store is the
        truth, VER-1); otherwise the claim goes back to prepared (STORE-4) and None is returned."""
        if await self.landed(novel_id, unit_id, claim):  # the commit went through, its reply did not come
            return UnitOutcome(True, "committed", 0)
        if await store.release_claim(self.ctx.pool, novel_id, unit_id, reason=reason, claim_id=claim.claim_id):
            await self.ctx.emit(ev.ClaimReleased(novel_id=novel_id, unit_id=unit_id, reason=reason))
        return None

    async def run_claim(self, novel: store.NovelRow, claim: cm.ClaimGranted, mode: str) -> UnitOutcome:
        """Dispatch writers for one claim, up to writerDispatchLimit (RUN-4, DRV-4)."""
        ctx, novel_id, unit_id = self.ctx, novel.novel_id, claim.unit_id
        # DRV-2: an inline unit goes to the novel's one author session (trimmed pack → brief).
        shape = "inline" if mode == "inline" else novel.config.writerShape
        pack_shape: pm.PackShape = "full" if shape == "W1" else "trimmed"
        reasons: list[str] = []
        runs: list[rm.WriterResult] = []
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
                    if e.code == DISPATCH_LIMIT:
                        break
                    if e.code == DELEGATION_NOT_FOUND:  # CLM-4: the instance restarted and recovered it
                        raise ClaimLost(e.detail) from None
                    raise
                except BusUnavailable:
                    raise ClaimLost(f"claim-manager instance {claim.instance} not reachable") from None
                dispatches = grant.dispatch
            evidence: list[str] = []
            if runs and novel.config.detector != "off":  # ROLE-2: a fresh writer gets what the detector missed
                evidence = await detection_gaps(ctx.pool, novel_id, unit_id, claim.claim_id)
            try:
                pack = await request(ctx.nc, ctx.subjects.packs,
                                     pm.RenderPack(novel_id=novel_id, unit_id=unit_id, shape=pack_shape,
                                                   profile=novel.config.continuityProfile, evidence=evidence),
                                     pm.PackReady, timeout=ctx.settings.request_timeout_s, retries=2)
            except RemoteError as e:
                if e.code == PACK_ERROR:  # PACK-4: no writer starts on a broken pack
                    return UnitOutcome(False, PACK_ERROR, dispatches, missing_blocks=e.missing_blocks, runs=runs)
                raise
            run_id = f"run-{secrets.token_hex(8)}"
            try:
                result = await request(
                    ctx.nc, ctx.subjects.runs,
                    rm.RunWriter(novel_id=novel_id, unit_id=unit_id, run_id=run_id, delegation_id=claim.delegation_id,
                                 instance=claim.instance, shape=shape, pack_text=pack.text, dispatch=dispatches,
                                 context_sha256=pack.context_sha256, claim_id=claim.claim_id,
                                 context_window=novel.config.model.contextWindow,
                                 usage_threshold_ratio=novel.config.model.usageThresholdRatio,
                                 sampling=sampling_of(novel.config.model.sampling),
                                 raw_vault_days=(novel.config.rawVault.retentionDays
                                                 if novel.config.rawVault.enabled else None)),
                    rm.WriterResult, timeout=self.writer_timeout_s)
            except RemoteError as e:
                if e.code == store.UnitNotClaimed.code:  # CTX-14: the claim ended before the run began
                    raise ClaimLost(e.detail) from None
                raise
            runs.append(result)
            last_output = result.output_chars
            if not result.ok:
                reasons.append(result.reason)
                if await self.landed(novel_id, unit_id, claim):  # the commit's reply was lost
                    return UnitOutcome(True, "committed", dispatches, output_chars=last_output, runs=runs)
                if result.reason == WINDOW_EXCEEDED:  # MODEL-5: deterministic; no re-dispatch
                    break
                if refused_code(result.reason) is not None:  # QUAL-3: refused after its repair turn
                    break
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
        return UnitOutcome(False, reasons[-1] if reasons else DISPATCH_LIMIT, dispatches, output_chars=last_output,
                           runs=runs)


def usage_record(novel_id: str, unit_id: str, claim: cm.ClaimGranted, outcome: UnitOutcome, mode: str,
                 turn: int) -> um.RecordTurn:
    """USE-1: every call of every dispatch of a turn, in the claimed mode, as one usage record."""
    tool_bytes: dict[str, int] = {}
    for r in outcome.runs:
        for tool, n in r.tool_bytes.items():
            tool_bytes[tool] = tool_bytes.get(tool, 0) + n
    return um.RecordTurn(
        novel_id=novel_id, unit_id=unit_id, mode=mode, turn=turn,
        provider=outcome.runs[-1].provider, calls=[c for r in outcome.runs for c in r.calls],
        tool_bytes=tool_bytes, writer_output_chars=outcome.output_chars, committed=outcome.ok,
        claim_id=claim.claim_id, dispatches=len(outcome.runs),
        model_ms=sum(r.model_ms for r in outcome.runs))
