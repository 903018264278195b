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
    """QUAL-2 / HOUSE-6: the claim manager's check of a candidate before it becomes canon (a W1
    draft or a W2 commit): the content gate, then the semantic detector. The body's rules and the
    prose guard are the store's, at the commit."""

    novel_id: str
    unit_id: str
    body: CommitBody
    target_min: int | None = None  # the unit's targetMin from its pack (too-short)
    shape: str = "W1"
    # ROLE-2: what the semantic detector binds its record to: the context the candidate was
    # written in (its asOf and recalled evidence are found by this hash) and the claim.
    context_sha256: str | None = None
    claim_id: str | None = None
    # QUAL-3: the check's identity, the same when the request is retried (its reply lost): a
    # refusal is counted once per attempt and body. None: counted each time it is answered.
    attempt: str | None = None


class Verified(Message, tag="verify.result", frozen=True):
    ok: bool
    failure: str | None = None  # not-committed | wrong-claim | quality | detector
    # quality: the gate's code (novel.quality); `detail` then says what to change, for the writer
    code: str | None = None
    detail: str | None = None
    receipt: CommitReceipt | None = None
    scene_completed: bool | None = None


VerifyRequest = VerifyCommit | ValidateDraft
