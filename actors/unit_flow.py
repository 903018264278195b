"""The driver's unit flow for one claim, carried out: dispatch → pack → writer (which commits) →
verify → record (RUN-4, DRV-4, HOUSE-7).

A helper of the driver actor (actors/driver.py), not an actor: the decisions are the pure state
machine `novel.unit_flow`; this module only turns its commands into requests and store calls and
their replies back into events. The store, not a reply, is the truth of whether a commit landed
(VER-1).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
import nats.errors

from novelbus import store
from novelbus.actors.context import ActorContext, once_key_of_commit
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.bus.consumer import error_code
from novelbus.bus.routes import claims_instance_subject
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.messages.errors import CLAIM_LOST
from novelbus.novel import unit_flow as flow
from novelbus.novel.unit_flow import UnitOutcome
from novelbus.store.detections import detection_gaps
from novelbus.writers.sampling import sampling_of

log = logging.getLogger(__name__)
T = TypeVar("T")


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


Step = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]  # runs an idempotent step, waiting out outages


class UnitFlow:
    """Carries out the pure unit flow (`novel.unit_flow`, HOUSE-7) for one claim: each command as
    a request or a store call, each reply, error reply or timeout fed back as its event. The
    driver owns leases, what a turn's record does, and what comes next."""

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

    async def drive(self, novel: store.NovelRow, claim: cm.ClaimGranted, mode: str, *,
                    record: Callable[[UnitOutcome], Awaitable[None]], until_available: Step[Any],
                    resume: bool = False, nonce: str | None = None) -> tuple[flow.Done, BaseException | None]:
        """Run the flow of `claim` to its end (`resume`: settle an interrupted one, REL-7): the end
        and the error that interrupted it, if any, for the caller to act on. `nonce` names the
        flow's runs (`novel.unit_flow.run_id_of`); a fresh one when not given."""
        # DRV-2: an inline unit goes to the novel's one author session (trimmed pack → brief).
        shape: flow.Shape = "inline" if mode == "inline" else novel.config.writerShape
        spec = flow.FlowSpec(novel_id=novel.novel_id, unit_id=claim.unit_id, claim_id=claim.claim_id, shape=shape,
                             detector=novel.config.detector != "off", nonce=nonce or secrets.token_hex(8),
                             first_dispatch=None if resume else claim.dispatch)
        state, commands = flow.resume(spec) if resume else flow.start(spec)
        cause: BaseException | None = None
        while True:
            for command in commands:
                if isinstance(command, flow.Done):
                    return command, cause
                if isinstance(command, flow.EmitVerificationFailed):  # VER-4
                    await self.ctx.emit(ev.VerificationFailed(novel_id=novel.novel_id, unit_id=claim.unit_id,
                                                              run_id=command.run_id, failure=command.failure))
                    continue
                try:
                    event = await self._carry_out(command, novel, claim, shape, record, until_available)
                except Exception as e:  # noqa: BLE001 - an error reply, or NATS, the database or an actor away
                    if cause is None or not isinstance(command, flow.Settle):
                        cause = e  # what ended the flow; settling failing too keeps what interrupted it
                    event = failure_event(command.step, e)
                state, commands = flow.advance(state, event)
                break
            else:
                raise AssertionError(f"the unit flow stopped in {state.phase} without a command")

    async def _carry_out(self, command: flow.Command, novel: store.NovelRow, claim: cm.ClaimGranted,
                         shape: flow.Shape, record: Callable[[UnitOutcome], Awaitable[None]],
                         until_available: Step[Any]) -> flow.Event:
        """One command of the flow, as the request or store call it names; its reply as an event."""
        ctx, novel_id, unit_id = self.ctx, novel.novel_id, claim.unit_id
        timeout = ctx.settings.request_timeout_s
        match command:
            case flow.BeginDispatch(step=step):  # CLM-5: to the claim-manager instance holding the delegation
                grant = await request(ctx.nc, claims_instance_subject(ctx.subjects, claim.instance),
                                      cm.BeginDispatch(delegation_id=claim.delegation_id),
                                      cm.DispatchGranted, timeout=timeout, retries=2)
                return flow.DispatchGranted(step=step, dispatch=grant.dispatch)
            case flow.ReadEvidence(step=step):  # ROLE-2
                gaps = await detection_gaps(ctx.pool, novel_id, unit_id, claim.claim_id)
                return flow.EvidenceRead(step=step, evidence=tuple(gaps))
            case flow.RenderPack(step=step, evidence=evidence):
                pack = await request(ctx.nc, ctx.subjects.packs,
                                     pm.RenderPack(novel_id=novel_id, unit_id=unit_id,
                                                   shape="full" if shape == "W1" else "trimmed",
                                                   profile=novel.config.continuityProfile, evidence=list(evidence)),
                                     pm.PackReady, timeout=timeout, retries=2)
                return flow.PackRendered(step=step, text=pack.text, context_sha256=pack.context_sha256)
            case flow.RunWriter(step=step, run_id=run_id, dispatch=dispatch, pack_text=text, context_sha256=sha):
                model = novel.config.model
                result = await request(
                    ctx.nc, ctx.subjects.runs,
                    rm.RunWriter(novel_id=novel_id, unit_id=unit_id, run_id=run_id, delegation_id=claim.delegation_id,
                                 instance=claim.instance, shape=shape, pack_text=text, dispatch=dispatch,
                                 context_sha256=sha, claim_id=claim.claim_id, context_window=model.contextWindow,
                                 usage_threshold_ratio=model.usageThresholdRatio, sampling=sampling_of(model.sampling),
                                 raw_vault_days=(novel.config.rawVault.retentionDays
                                                 if novel.config.rawVault.enabled else None)),
                    rm.WriterResult, timeout=self.writer_timeout_s)
                return flow.WriterFinished(step=step, result=result)
            case flow.CheckLanded(step=step):
                return flow.Landed(step=step, landed=await self.landed(novel_id, unit_id, claim))
            case flow.Verify(step=step, run_id=run_id):  # VER-1, both shapes
                verified = await request(ctx.nc, ctx.subjects.verify,
                                         vm.VerifyCommit(novel_id=novel_id, unit_id=unit_id, claim_id=claim.claim_id,
                                                         run_id=run_id),
                                         vm.Verified, timeout=timeout, retries=2)
                return flow.Verified(step=step, ok=verified.ok, failure=verified.failure)
            case flow.Settle(step=step, reason=reason):  # waiting out an outage: settling must not be skipped
                settled = await until_available(lambda: self.settle(novel_id, unit_id, claim, reason))
                return flow.Settled(step=step, landed=settled is not None)
            case flow.RecordTurn(step=step, outcome=outcome):  # once per claim (the turn ledger, REL-2)
                await until_available(lambda: record(outcome))
                return flow.TurnRecorded(step=step)
        raise AssertionError(f"no reply awaited for {type(command).__name__}")


def failure_event(step: int, e: Exception) -> flow.Event:
    """An error as the flow hears it: an error reply with its code (BUS-4), or no reply / a
    server away (REL-6)."""
    if isinstance(e, RemoteError):
        return flow.Refused(step=step, code=e.code, missing_blocks=tuple(e.missing_blocks))
    if isinstance(e, BusUnavailable):  # no reply in time
        return flow.Unavailable(step=step, code=BusUnavailable.code)
    if is_infrastructure_error(e):
        return flow.Unavailable(step=step, code=error_code(e))
    return flow.Refused(step=step, code=error_code(e))


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
