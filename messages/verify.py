"""Commit verifier commands (VER-1..4)."""

from novelbus.messages.base import Message
from novelbus.messages.body import CommitBody
from novelbus.messages.claims import CommitReceipt


class VerifyCommit(Message, tag="verify.commit", frozen=True):
    novel_id: str
    unit_id: str
    claim_id: str
    run_id: str


class ValidateDraft(Message, tag="verify.draft", frozen=True):
    novel_id: str
    unit_id: str
    body: CommitBody


class Verified(Message, tag="verify.result", frozen=True):
    ok: bool
    failure: str | None = None  # not-committed | wrong-claim | guard | schema
    detail: str | None = None
    receipt: CommitReceipt | None = None
    scene_completed: bool | None = None


VerifyRequest = VerifyCommit | ValidateDraft
