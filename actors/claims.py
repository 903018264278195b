"""Claim manager (CLM-1..6): claims units and holds every delegation in private memory.

The execution token is created by the store, kept here, injected into commits here, and never
leaves this actor: not in a reply, an event, a log line or anything a model sees (ARCH-2).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from novelbus import store
from novelbus.actors.context import (
    REPUBLISH_WITHIN_S,
    ActorContext,
    ServiceActor,
    once_key_of_commit,
)
from novelbus.bus.client import BusUnavailable, request
from novelbus.bus.notices import publish_notice
from novelbus.bus.routes import check_instance, claims_instance_subject, delegation_instance
from novelbus.bus.service import CommandService
from novelbus.messages import claims as m
from novelbus.messages import events as ev
from novelbus.messages import verify as vm
from novelbus.messages.base import tag_of
from novelbus.messages.errors import DELEGATION_NOT_FOUND, DISPATCH_LIMIT, SCOPE_VIOLATION
from novelbus.novel.outline import ID_PATTERN


class ClaimRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code



def recorded_id(value: str) -> str:
    """A unit id as an event may carry it (REL-9): as is when it has the shape of an id, else only
    a digest — the id a writer asked for is model-authored text."""
    if re.match(ID_PATTERN, value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]

@dataclass
class Delegation:
    novel_id: str
    unit_id: str
    claim_id: str
    intent_id: str
    execution_token: str
    granted_at: float
    dispatch_limit: int
    dispatches: int = 0
    reply: m.ClaimGranted | None = None  # a retried ClaimUnit of the same intent gets the same answer

    def __repr__(self) -> str:  # never print the token, even by accident
        return f"Delegation(novel={self.novel_id}, unit={self.unit_id}, claim={self.claim_id})"


@dataclass
class ClaimManagerState:
    """ARCH-2: the only place delegation scope exists. Volatile by design (CLM-4)."""

    instance: str
    delegations: dict[str, Delegation] = field(default_factory=dict)
    # Delegations whose claim ended in a commit, kept (bounded) so that a retried CommitUnit
    # replays its receipt (duplicate=True) instead of failing (REL-2).
    committed: OrderedDict[str, Delegation] = field(default_factory=OrderedDict)
    forwarded: int = 0


COMMITTED_KEPT = 4096
FORWARD_TIMEOUT_S = 10.0


class ClaimManager(ServiceActor):
    name = "claims"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = ClaimManagerState(instance=check_instance(ctx.settings.claims_instance))
        s = ctx.subjects
        self.services = [
            # Claims go to any instance (queue group); delegation-scoped commands that reach the
            # wrong instance are forwarded to the one named in the delegation id (CLM-5).
            CommandService(ctx.nc, s.claims, {
                m.ClaimUnit: self.on_claim,
                m.BeginDispatch: self._routed(self.on_begin_dispatch, m.DispatchGranted),
                m.ReleaseClaim: self._routed(self.on_release, m.ReleaseConfirmed),
                m.ReleaseUnit: self.on_release_unit,
            }, queue="claims"),
            # This instance's own delegations: dispatch grants and releases ...
            CommandService(ctx.nc, claims_instance_subject(s, self.state.instance), {
                m.BeginDispatch: self.on_begin_dispatch,
                m.ReleaseClaim: self.on_release,
            }, queue=f"claims-{self.state.instance}"),
            # ... and commits (CLM-5: routed to the instance holding the delegation).
            CommandService(ctx.nc, s.commit(self.state.instance), {m.CommitUnit: self.on_commit},
                           queue=f"commit-{self.state.instance}"),
        ]

    async def start(self) -> None:
        await self.recover()  # CLM-4: before serving, our previous life's claims go back
        await super().start()

    async def recover(self) -> None:
        """CLM-4: after a restart our delegations are gone, so our claimed units go back to prepared.

        REL-7: a previous life killed between a commit's statement (which writes the unit.committed
        row, PERF-2) and its publish left the row ledger-only; whatever the flow did since (its
        writer may even have read the commit back and verified it), the recent rows are published
        again under their message ids, in ledger order, before this instance serves anything: the
        stream's de-duplication keeps each once."""
        for row in await store.recent_once_events(self.ctx.pool, tag_of(ev.UnitCommitted), REPUBLISH_WITHIN_S):
            await self.ctx.publish_recorded(msgspec.convert(row.payload, ev.UnitCommitted), row.seq)
        recovered = await store.recover_claims(self.ctx.pool, claimed_by=self.state.instance)
        by_novel: dict[str, list[str]] = {}
        for novel_id, unit_id in recovered:
            by_novel.setdefault(novel_id, []).append(unit_id)
        for novel_id, unit_ids in by_novel.items():
            await self.ctx.emit(ev.ClaimsRecovered(novel_id=novel_id, unit_ids=unit_ids,
                                                   instance=self.state.instance))
            await publish_notice(self.ctx, novel_id, reason="recovered")

    # --- handlers -------------------------------------------------------------------------
    async def on_claim(self, req: m.ClaimUnit) -> m.ClaimGranted:
        try:
            # PERF-2: the claim and its unit.claimed ledger row in one statement (attempt filled in)
            claim = await store.claim_unit(self.ctx.pool, req.novel_id, req.unit_id, req.intent_id,
                                           mode=req.mode, claimed_by=self.state.instance,
                                           expected_revision=req.outline_revision,
                                           expected_watermark=req.requirement_watermark,
                                           event=lambda claim_id: self.ctx.ledger_entry(ev.UnitClaimed(
                                               novel_id=req.novel_id, unit_id=req.unit_id, claim_id=claim_id,
                                               attempt=0, mode=req.mode)))
        except (store.UnitNotClaimable, store.UnitInFlight):
            # REL-2: a retried ClaimUnit whose first reply was lost gets the same delegation.
            for d in self.state.delegations.values():
                if d.intent_id == req.intent_id and d.unit_id == req.unit_id and d.reply is not None:
                    return d.reply
            raise
        # Units of one novel are strictly sequential: an older delegation of this novel held
        # here belongs to a claim that ended elsewhere (released by a driver, a lease, a stop).
        for stale in [k for k, d in self.state.delegations.items() if d.novel_id == req.novel_id]:
            del self.state.delegations[stale]
        delegation_id = f"dlg-{self.state.instance}-{secrets.token_hex(12)}"
        limit = claim.dispatch_limit
        # PERF-2: the first dispatch granted with the claim, counted like a BeginDispatch (DRV-4).
        first = 1 if req.begin_dispatch and limit >= 1 else None
        reply = m.ClaimGranted(claim_id=claim.claim_id, unit_id=claim.unit_id, attempt=claim.attempt,
                               delegation_id=delegation_id, instance=self.state.instance,
                               dispatch=first, dispatch_limit=limit if first else None)
        # CLM-3: registered before the reply leaves, so no writer can ever call first.
        self.state.delegations[delegation_id] = Delegation(
            novel_id=req.novel_id, unit_id=claim.unit_id, claim_id=claim.claim_id,
            intent_id=req.intent_id, execution_token=claim.token, granted_at=time.time(),
            dispatch_limit=limit, dispatches=first or 0, reply=reply,
        )
        claimed = ev.UnitClaimed(novel_id=req.novel_id, unit_id=claim.unit_id, claim_id=claim.claim_id,
                                 attempt=claim.attempt, mode=req.mode)
        assert claim.event_seq is not None
        await self.ctx.publish_recorded(claimed, claim.event_seq)
        return reply

    async def on_begin_dispatch(self, req: m.BeginDispatch) -> m.DispatchGranted:
        d = self._delegation(req.delegation_id)
        if d.dispatches >= d.dispatch_limit:
            raise ClaimRefused(DISPATCH_LIMIT, f"claim {d.claim_id} used all {d.dispatch_limit} dispatches")
        d.dispatches += 1
        return m.DispatchGranted(delegation_id=req.delegation_id, dispatch=d.dispatches, limit=d.dispatch_limit)

    async def on_commit(self, req: m.CommitUnit) -> m.CommitReceipt:
        d = self.state.delegations.get(req.delegation_id)
        replay = False
        if d is None:
            d = self.state.committed.get(req.delegation_id)
            replay = d is not None
        if d is None:
            # The delegation ended (recovered, released, lost with a restart) or never existed.
            if await store.novel_exists(self.ctx.pool, req.novel_id):
                await self.ctx.emit(ev.DelegationRefused(novel_id=req.novel_id, requested_unit_id=recorded_id(req.unit_id),
                                                         code=DELEGATION_NOT_FOUND))
            raise ClaimRefused(DELEGATION_NOT_FOUND, "no such delegation (it may have ended)")
        if req.unit_id != d.unit_id or req.novel_id != d.novel_id:
            # CLM-2, CLM-6: scope is structural; a writer cannot widen it whatever its text says.
            await self.ctx.emit(ev.ScopeViolation(novel_id=d.novel_id, requested_unit_id=recorded_id(req.unit_id),
                                                  delegated_unit_id=d.unit_id))
            raise ClaimRefused(SCOPE_VIOLATION, f"delegation covers unit {d.unit_id}, not {req.unit_id}")
        if not replay:  # HOUSE-6: every candidate, of either shape, is checked here, once
            await self._check_candidate(req, d)
        # PERF-2: the commit and its unit.committed ledger row in one statement (REL-7 once-key);
        # commit_id, the character counts and body_sha256 are filled in by the store.
        entry = ActorContext.ledger_entry(ev.UnitCommitted(
            novel_id=d.novel_id, unit_id=d.unit_id, commit_id="", effective_characters=0, total_characters=0,
            body_sha256="", context_sha256=req.context_sha256))
        try:
            receipt, event_seq = await store.commit_body_with_event(
                self.ctx.pool, d.novel_id, d.unit_id, d.execution_token, req.body, run_id=req.run_id,
                context_hash=req.context_sha256, event=entry, once_key=once_key_of_commit(d.novel_id, d.unit_id))
        except (store.UnitNotClaimed, store.TokenMismatch) as e:
            # The claim ended without this delegation (released by its driver, a lapsed lease, a
            # stop): the store refuses, the delegation goes, and the refusal is recorded.
            self.state.delegations.pop(req.delegation_id, None)
            await self.ctx.emit(ev.DelegationRefused(novel_id=d.novel_id, requested_unit_id=recorded_id(req.unit_id),
                                                     code=e.code))
            raise
        # CLM-3: the claim ended with its commit; the delegation goes with it (kept for replays).
        if self.state.delegations.pop(req.delegation_id, None) is not None:
            self.state.committed[req.delegation_id] = d
            while len(self.state.committed) > COMMITTED_KEPT:
                self.state.committed.popitem(last=False)
        if not receipt.duplicate and not replay:
            committed = ev.UnitCommitted(
                novel_id=d.novel_id, unit_id=d.unit_id, commit_id=receipt.commit_id,
                effective_characters=receipt.effective_characters, total_characters=receipt.total_characters,
                body_sha256=receipt.body_hash, context_sha256=receipt.context_hash)
            if event_seq is None:  # a replayed commit: the row is written here (once-key)
                await self.ctx.emit(committed)
            else:
                # A kill between the statement and this publish leaves the row ledger-only: the
                # flow (UnitFlow.settle / committed_under), the sweep and this manager's restart
                # (`recover`) publish it again from the row (REL-7).
                await self.ctx.publish_recorded(committed, event_seq)
        return m.CommitReceipt(
            commit_id=receipt.commit_id, unit_id=receipt.unit_id, claim_id=receipt.claim_id,
            body_sha256=receipt.body_hash, effective_characters=receipt.effective_characters,
            delta_characters=receipt.delta_characters, total_characters=receipt.total_characters,
            duplicate=receipt.duplicate, context_sha256=receipt.context_hash)

    async def on_release(self, req: m.ReleaseClaim) -> m.ReleaseConfirmed:
        d = self.state.delegations.pop(req.delegation_id, None)
        if d is None:
            raise ClaimRefused(DELEGATION_NOT_FOUND, "no such delegation (it may have ended)")
        # Only this delegation's own claim: a late release never frees a newer claim of the unit.
        released = await store.release_claim(self.ctx.pool, d.novel_id, d.unit_id, reason=req.reason,
                                             claim_id=d.claim_id)
        if released:
            await self.ctx.emit(ev.ClaimReleased(novel_id=d.novel_id, unit_id=d.unit_id, reason=req.reason))
        return m.ReleaseConfirmed(unit_id=d.unit_id, released=released)

    async def on_release_unit(self, req: m.ReleaseUnit) -> m.ReleaseConfirmed:
        for delegation_id, d in list(self.state.delegations.items()):
            if d.novel_id == req.novel_id and d.unit_id == req.unit_id:
                del self.state.delegations[delegation_id]
        released = await store.release_claim(self.ctx.pool, req.novel_id, req.unit_id, reason=req.reason)
        if released:
            await self.ctx.emit(ev.ClaimReleased(novel_id=req.novel_id, unit_id=req.unit_id, reason=req.reason))
        return m.ReleaseConfirmed(unit_id=req.unit_id, released=released)

    # --- helpers --------------------------------------------------------------------------
    async def _check_candidate(self, req: m.CommitUnit, d: Delegation) -> None:
        """QUAL-2 / HOUSE-6: the verifier's path (the content gate, then the detector) before the
        token makes the candidate canon; a refusal refuses the commit with its code and what to
        change. The body's own rules are the store's, in the commit's transaction (STORE-2)."""
        attempt = f"{req.run_id}:commit" if req.attempt == 1 else f"{req.run_id}:commit-{req.attempt}"
        verified = await request(self.ctx.nc, self.ctx.subjects.verify,
                                 vm.ValidateDraft(novel_id=d.novel_id, unit_id=d.unit_id, body=req.body,
                                                  target_min=req.target_min, shape=req.shape,
                                                  context_sha256=req.context_sha256, claim_id=d.claim_id,
                                                  attempt=attempt),
                                 vm.Verified, timeout=self.ctx.settings.request_timeout_s, retries=2)
        if verified.ok:
            return
        failure = verified.failure or "refused"
        raise ClaimRefused(f"{failure}:{verified.code}" if verified.code else failure,
                           verified.detail or "the candidate was refused")

    def _routed(self, handler: Any, reply_type: type) -> Any:
        """Serve a delegation-scoped command here, or forward it to the instance that holds it."""
        async def serve(req: Any) -> Any:
            owner = delegation_instance(req.delegation_id)
            if req.delegation_id in self.state.delegations or owner in (None, self.state.instance):
                return await handler(req)
            self.state.forwarded += 1
            try:
                return await request(self.ctx.nc, claims_instance_subject(self.ctx.subjects, owner), req,
                                     reply_type, timeout=FORWARD_TIMEOUT_S, retries=1)
            except BusUnavailable:
                raise ClaimRefused(DELEGATION_NOT_FOUND,
                                   f"claim-manager instance {owner} holding this delegation is not reachable") from None
        return serve

    def _delegation(self, delegation_id: str) -> Delegation:
        d = self.state.delegations.get(delegation_id)
        if d is None:
            raise ClaimRefused(DELEGATION_NOT_FOUND, "no such delegation (it may have ended)")
        return d
