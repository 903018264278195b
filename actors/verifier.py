"""Commit verifier (VER-1..4): the store is the truth; a model's report is never trusted."""

from __future__ import annotations

from dataclasses import dataclass

from novelbus import store
from novelbus.actors.context import ActorContext, ServiceActor
from novelbus.bus.service import CommandService
from novelbus.messages import verify as m
from novelbus.messages.claims import CommitReceipt
from novelbus.novel.commitcheck import BodyError, check_body
from novelbus.novel.guard import ProseGuardError, guard_prose


@dataclass
class VerifierState:
    verified: int = 0
    failed: int = 0


class CommitVerifier(ServiceActor):
    name = "verifier"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = VerifierState()
        self.services = [CommandService(ctx.nc, ctx.subjects.verify, {
            m.VerifyCommit: self.on_verify_commit,
            m.ValidateDraft: self.on_validate_draft,
        }, queue="verify")]

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
        """VER-2: a W1 draft is checked before the orchestrator commits it."""
        try:
            check_body(req.body, known_commits=await store.commit_paragraph_counts(self.ctx.pool, req.novel_id),
                       hard_max_remaining=None)
            guard_prose(req.body.paragraphs)
        except ProseGuardError as e:
            return self._fail("guard", str(e))
        except BodyError as e:
            return self._fail("schema", str(e))
        self.state.verified += 1
        return m.Verified(ok=True, scene_completed=req.body.scene_completion.completed)

    def _fail(self, failure: str, detail: str) -> m.Verified:
        self.state.failed += 1
        return m.Verified(ok=False, failure=failure, detail=detail)
