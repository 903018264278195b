"""Claim manager commands (CLM-1..3). No message here ever carries an execution token."""

from typing import Literal

from novelbus.messages.base import Message
from novelbus.messages.body import CommitBody

WriterMode = Literal["inline", "subagent"]


class ClaimUnit(Message, tag="claims.claim", frozen=True):
    novel_id: str
    unit_id: str
    intent_id: str
    mode: WriterMode
    # SPEC §16 Claim: what the decision was made on; a mismatch refuses the claim (PLAN-1, PLAN-4)
    outline_revision: str | None = None
    requirement_watermark: int | None = None
    # PERF-2: grant the claim's first dispatch with the claim (one round trip fewer per unit)
    begin_dispatch: bool = False


class ClaimGranted(Message, tag="claims.claimed", frozen=True):
    claim_id: str
    unit_id: str
    attempt: int
    delegation_id: str
    instance: str  # which claim-manager instance holds the delegation (CLM-5 routing)
    dispatch: int | None = None  # the first dispatch, granted with the claim when asked (else None)
    dispatch_limit: int | None = None


class BeginDispatch(Message, tag="claims.dispatch", frozen=True):
    delegation_id: str


class DispatchGranted(Message, tag="claims.dispatch-granted", frozen=True):
    delegation_id: str
    dispatch: int
    limit: int


class CommitUnit(Message, tag="claims.commit", frozen=True):
    delegation_id: str
    novel_id: str
    unit_id: str
    body: CommitBody
    run_id: str
    context_sha256: str | None = None
    # HOUSE-6 / QUAL-2: the claim manager has every candidate checked once before it becomes
    # canon; `target_min` is the unit's targetMin from its pack, for the gate's too-short check.
    target_min: int | None = None
    shape: str = "W2"
    # QUAL-3: which candidate of its run this is: a W1 draft and its repair are two refusals, a
    # W2 writer committing the same body again is one (the refusal's once-key holds the body).
    attempt: int = 1


class CommitReceipt(Message, tag="claims.committed", frozen=True):
    commit_id: str
    unit_id: str
    claim_id: str
    body_sha256: str
    effective_characters: int
    delta_characters: int
    total_characters: int
    duplicate: bool
    context_sha256: str | None = None
    run_id: str | None = None  # VER-3 envelope: the run that produced the body


class ReleaseClaim(Message, tag="claims.release", frozen=True):
    delegation_id: str
    reason: str


class ReleaseConfirmed(Message, tag="claims.released", frozen=True):
    unit_id: str
    released: bool


class ReleaseUnit(Message, tag="claims.release-unit", frozen=True):
    """The driver gives up a stale claim it no longer drives (e.g. after a driver restart)."""

    novel_id: str
    unit_id: str
    reason: str


ClaimsRequest = ClaimUnit | BeginDispatch | ReleaseClaim | ReleaseUnit
CommitRequest = CommitUnit
