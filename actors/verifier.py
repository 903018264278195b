"""Commit verifier (VER-1..4): the store is the truth; a model's report is never trusted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from novelbus import store
from novelbus.actors.context import ActorContext, ServiceActor
from novelbus.actors.detection import CandidateDetector
from novelbus.bus.service import CommandService
from novelbus.messages import events as ev
from novelbus.messages import verify as m
from novelbus.messages.claims import CommitReceipt
from novelbus.novel.commitcheck import business_hash
from novelbus.novel.quality import OutlineProfile, check_candidate, outline_profile
from novelbus.novel.text import effective_characters
from novelbus.store.raw_vault import RawVault
from novelbus.writers.provider import ModelProvider

log = logging.getLogger(__name__)

PROFILES_KEPT = 256  # outline profiles (novel, revision) this verifier keeps

CandidateCheck = Callable[["Candidate"], Awaitable[m.Verified | None]]


class Candidate:
    """One `ValidateDraft` on its way through the checks, with the store read they share: the
    content gate's inputs and the detector's, in one statement (PERF-2), read when first asked."""

    def __init__(self, ctx: ActorContext, req: m.ValidateDraft) -> None:
        self.ctx = ctx
        self.req = req
        self._inputs: store.GateInputs | None = None
        self._body_hash: str | None = None

    @property
    def body_hash(self) -> str:
        if self._body_hash is None:
            self._body_hash = business_hash(self.req.body)
        return self._body_hash

    async def inputs(self) -> store.GateInputs:
        if self._inputs is None:
            req = self.req
            self._inputs = await store.gate_inputs(
                self.ctx.pool, req.novel_id, req.unit_id, req.context_sha256, self.body_hash)
        return self._inputs


@dataclass
class VerifierState:
    verified: int = 0
    failed: int = 0
    refused: int = 0  # by the content gate (QUAL-2)
    profiles: dict[tuple[str, str, int], OutlineProfile] = field(default_factory=dict)


class CommitVerifier(ServiceActor):
    name = "verifier"

    def __init__(self, ctx: ActorContext, detector_provider: ModelProvider | None = None) -> None:
        self.ctx = ctx
        self.state = VerifierState()
        # ROLE-2: `detector_provider` answers a novel's `detector: model` (default: the deployment's
        # writer model, made when first needed)
        self.detector = CandidateDetector(ctx, detector_provider)
        # QUAL-5: the deployment's raw vault, where refused candidates are kept (None: nowhere)
        self.vault = RawVault.open(ctx.settings.raw_vault) if ctx.settings.raw_vault else None
        self.services = [CommandService(ctx.nc, ctx.subjects.verify, {
            m.VerifyCommit: self.on_verify_commit,
            m.ValidateDraft: self.on_validate_draft,
        }, queue="verify")]

    async def stop(self) -> None:
        await super().stop()
        await self.detector.aclose()

    async def on_verify_commit(self, req: m.VerifyCommit) -> m.Verified:
        """VER-1: the unit must be committed, under this very claim."""
        commit = await store.get_commit_for_unit(self.ctx.pool, req.novel_id, req.unit_id)
        if commit is None:
            return self._fail("not-committed", f"unit {req.unit_id} has no commit")
        if commit.claim_id != req.claim_id:
            return self._fail("wrong-claim", f"unit {req.unit_id} was committed under another claim")
        self.state.verified += 1
        receipt = CommitReceipt(
            commit_id=commit.commit_id, unit_id=commit.unit_id, claim_id=commit.claim_id,
            body_sha256=commit.body_hash, effective_characters=commit.effective_chars,
            delta_characters=commit.effective_chars, total_characters=commit.total_chars,
            duplicate=False, context_sha256=commit.context_hash, run_id=commit.run_id)
        return m.Verified(ok=True, receipt=receipt, scene_completed=commit.scene_completed)

    async def on_validate_draft(self, req: m.ValidateDraft) -> m.Verified:
        """QUAL-2 / HOUSE-6: a candidate the claim manager holds (a W1 draft or a W2 commit) runs
        the verification path's checks in order; the first that refuses answers. A check returns
        None (passed) or a failed `Verified`. The body's own rules and the prose guard are the
        store's, in the commit's transaction (STORE-2, STORE-6): each rule is evaluated once."""
        candidate = Candidate(self.ctx, req)
        for check in self.candidate_checks():
            failed = await check(candidate)
            if failed is not None:
                await self._keep_refused(req, failed)
                return failed
        self.state.verified += 1
        return m.Verified(ok=True, scene_completed=req.body.scene_completion.completed)

    async def _keep_refused(self, req: m.ValidateDraft, failed: m.Verified) -> None:
        """QUAL-5 / CTX-10: a refused candidate goes to the raw vault, with the failure and code,
        when the deployment has one and the novel's config.rawVault is enabled. Never in an event
        or a log line; a vault that cannot be written loses the record, not the refusal."""
        if self.vault is None:
            return
        keep = (await store.get_novel(self.ctx.pool, req.novel_id)).config.rawVault
        if not keep.enabled:
            return
        code = f"{failed.failure}:{failed.code}" if failed.code else (failed.failure or "refused")
        try:
            await asyncio.to_thread(
                self.vault.store_refused_candidate, novel_id=req.novel_id, unit_id=req.unit_id,
                run_id=req.claim_id or req.unit_id, code=code, detail=failed.detail,
                candidate=msgspec.to_builtins(req.body), retention_days=keep.retentionDays)
        except OSError as e:
            log.warning("raw vault: a refused candidate of unit %s not kept: %s", req.unit_id,
                        e.strerror or type(e).__name__)

    def candidate_checks(self) -> list[CandidateCheck]:
        return [self._check_quality, self._check_detector]

    async def _check_quality(self, candidate: Candidate) -> m.Verified | None:
        """QUAL-2: the content gate with the novel's config.quality; a refusal is counted as a
        `unit.refused` event (code and counts, QUAL-3) and answered with what to change."""
        req, inputs = candidate.req, await candidate.inputs()
        rules = inputs.config.quality
        if not rules.enabled or inputs.outline is None or inputs.outline_revision is None:
            return None
        key = (req.novel_id, inputs.outline_revision, rules.outlineRun)
        profile = self.state.profiles.get(key)
        if profile is None:
            profile = outline_profile(inputs.outline, rules)
            if len(self.state.profiles) >= PROFILES_KEPT:
                self.state.profiles.pop(next(iter(self.state.profiles)))
            self.state.profiles[key] = profile
        refusal = check_candidate(req.body.paragraphs, rules=rules, profile=profile, earlier=inputs.earlier,
                                  target_min=req.target_min)
        if refusal is None:
            return None
        self.state.refused += 1
        # One refusal per attempt and body: a retried request (its reply lost) is answered again
        # without a second count; a W2 writer committing the very same body again in its run is
        # the same refusal (QUAL-3).
        once = (f"unit.refused:{req.novel_id}:{req.unit_id}:{req.attempt}:{candidate.body_hash}"
                if req.attempt else None)
        await self.ctx.emit(ev.UnitRefused(
            novel_id=req.novel_id, unit_id=req.unit_id, code=refusal.code, shape=req.shape,
            paragraph_count=len(req.body.paragraphs),
            characters=sum(effective_characters(p) for p in req.body.paragraphs)), once=once)
        self.state.failed += 1
        return m.Verified(ok=False, failure="quality", code=refusal.code, detail=refusal.for_model())

    async def _check_detector(self, candidate: Candidate) -> m.Verified | None:
        """ROLE-2: the semantic detector, after the content gate (`actors.detection`): a
        contradiction or an evidence gap refuses the candidate, with the claims and their
        pointers for the writer; the record and the events are written by the detector."""
        req, inputs = candidate.req, await candidate.inputs()
        verdict = await self.detector.check(req.novel_id, req.unit_id, req.body, context_sha256=req.context_sha256,
                                            claim_id=req.claim_id, shape=req.shape, config=inputs.config,
                                            inputs=inputs.detection, body_hash=candidate.body_hash)
        if verdict.code is None:
            return None
        self.state.failed += 1
        return m.Verified(ok=False, failure="detector", code=verdict.code, detail=verdict.message)

    def _fail(self, failure: str, detail: str) -> m.Verified:
        self.state.failed += 1
        return m.Verified(ok=False, failure=failure, detail=detail)
