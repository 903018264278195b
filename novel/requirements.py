"""The requirements ledger's rules (PLAN-4, SPEC §16 Requirements ledger), as pure functions.

A requirement is a user directive, received once per source message id, in sequence order.
Statuses: `pending` → `applied` | `blocked` | `superseded`; `blocked` → `applied` | `superseded`
only with `resolvedBy {kind: clarification|withdrawal, messageId}` citing a message that exists
in the ledger, the old conflict kept as `resolvedConflict`. `applied` and `superseded` are final.
The watermark is the last sequence of the contiguous applied/superseded prefix.

The store applies what `plan_transitions` returns inside the revision's transaction; nothing
here reads a clock or a database.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

# The ledger's wire data is defined with the steering messages; the domain names it here too.
from novelbus.messages.requirements import RequirementUpdate as RequirementUpdate
from novelbus.messages.requirements import ResolutionKind as ResolutionKind
from novelbus.messages.requirements import ResolvedBy as ResolvedBy
from novelbus.messages.requirements import ResolvedConflict as ResolvedConflict
from novelbus.messages.requirements import TargetStatus as TargetStatus

RequirementStatus = Literal["pending", "applied", "blocked", "superseded"]

MESSAGE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"
_MESSAGE_ID_RE = re.compile(MESSAGE_ID_PATTERN)
MAX_TEXT_CHARS = 4_000
MAX_REASON_CHARS = 500


class RequirementError(ValueError):
    """A directive or a transition the ledger refuses; the message names the requirement and rule."""

    code = "requirement-refused"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class RequirementView(msgspec.Struct, frozen=True, rename="camel"):
    requirement_id: str
    sequence: int
    message_id: str
    status: RequirementStatus
    applied_revision: str | None = None
    blocked_reason: str | None = None
    superseded_by: str | None = None
    resolved_conflict: ResolvedConflict | None = None


class Transition(msgspec.Struct, frozen=True):
    """What the store writes for one requirement (applied_revision is filled in by the store)."""

    requirement_id: str
    before: RequirementStatus
    after: TargetStatus
    blocked_reason: str | None
    superseded_by: str | None
    resolved_conflict: ResolvedConflict | None


def requirement_id(sequence: int) -> str:
    return f"req-{sequence}"


def check_directive(text: str, message_id: str) -> str:
    """Validate a directive at the edge; return its text stripped. Errors never echo the text."""
    if not isinstance(message_id, str) or not _MESSAGE_ID_RE.match(message_id):
        raise RequirementError(
            f"messageId must match {MESSAGE_ID_PATTERN}", code="bad-directive")
    stripped = text.strip() if isinstance(text, str) else ""
    if not stripped:
        raise RequirementError("directive text must not be empty", code="bad-directive")
    if len(stripped) > MAX_TEXT_CHARS:
        raise RequirementError(
            f"directive text has {len(stripped)} characters; at most {MAX_TEXT_CHARS}",
            code="bad-directive")
    return stripped


def watermark(ledger: list[RequirementView]) -> int:
    """The last sequence of the contiguous applied/superseded prefix (0 when there is none)."""
    mark = 0
    for r in sorted(ledger, key=lambda r: r.sequence):
        if r.status not in ("applied", "superseded"):
            break
        mark = r.sequence
    return mark


def open_counts(ledger: list[RequirementView]) -> tuple[int, int]:
    """(pending, blocked)."""
    return (sum(1 for r in ledger if r.status == "pending"),
            sum(1 for r in ledger if r.status == "blocked"))


def plan_transitions(ledger: list[RequirementView], updates: list[RequirementUpdate]) -> list[Transition]:
    """Check every update against the ledger; all pass or the first failure raises (nothing half-done)."""
    by_id = {r.requirement_id: r for r in ledger}
    message_ids = {r.message_id for r in ledger}
    seen: set[str] = set()
    out: list[Transition] = []
    for i, u in enumerate(updates):
        where = f"requirements[{i}] ({u.requirement_id})"
        if u.requirement_id in seen:
            raise RequirementError(f"{where}: listed twice")
        seen.add(u.requirement_id)
        current = by_id.get(u.requirement_id)
        if current is None:
            raise RequirementError(f"{where}: no such requirement in the ledger", code="requirement-not-found")
        if current.status in ("applied", "superseded"):
            raise RequirementError(f"{where}: is already {current.status} (final)")
        if current.status == "blocked" and u.status == "blocked":
            raise RequirementError(f"{where}: is already blocked")
        if u.status == "blocked":
            if not u.blocked_reason or not u.blocked_reason.strip():
                raise RequirementError(f"{where}: blocked needs a non-empty blockedReason")
            if len(u.blocked_reason) > MAX_REASON_CHARS:
                raise RequirementError(f"{where}: blockedReason is longer than {MAX_REASON_CHARS} characters")
        elif u.blocked_reason is not None:
            raise RequirementError(f"{where}: blockedReason is only for status blocked")
        if u.status == "superseded":
            if not u.superseded_by:
                raise RequirementError(f"{where}: superseded needs supersededBy (a requirement id)")
            if u.superseded_by == u.requirement_id or u.superseded_by not in by_id:
                raise RequirementError(f"{where}: supersededBy must name another requirement of the ledger")
        elif u.superseded_by is not None:
            raise RequirementError(f"{where}: supersededBy is only for status superseded")
        resolved: ResolvedConflict | None = None
        if current.status == "blocked":
            # PLAN-4, SPEC §16: no resolution without citing a message of the ledger.
            if u.resolved_by is None:
                raise RequirementError(
                    f"{where}: is blocked; {u.status} needs resolvedBy {{kind, messageId}}",
                    code="blocked-resolution-citation")
            if u.resolved_by.message_id not in message_ids:
                raise RequirementError(
                    f"{where}: resolvedBy.messageId is not a message in the ledger",
                    code="blocked-resolution-citation")
            resolved = ResolvedConflict(reason=current.blocked_reason or "", resolved_by=u.resolved_by)
        elif u.resolved_by is not None:
            raise RequirementError(f"{where}: resolvedBy is only for a blocked requirement")
        out.append(Transition(requirement_id=u.requirement_id, before=current.status, after=u.status,
                              blocked_reason=u.blocked_reason.strip() if u.blocked_reason else None,
                              superseded_by=u.superseded_by, resolved_conflict=resolved))
    return out


def apply_transitions(ledger: list[RequirementView], transitions: list[Transition],
                      revision: str) -> list[RequirementView]:
    """The ledger after the transitions (what the store will hold): for the watermark and counts."""
    by_id = {t.requirement_id: t for t in transitions}
    out: list[RequirementView] = []
    for r in ledger:
        t = by_id.get(r.requirement_id)
        if t is None:
            out.append(r)
            continue
        out.append(msgspec.structs.replace(
            r, status=t.after,
            applied_revision=revision if t.after == "applied" else None,
            blocked_reason=t.blocked_reason if t.after == "blocked" else None,
            superseded_by=t.superseded_by if t.after == "superseded" else None,
            resolved_conflict=t.resolved_conflict or r.resolved_conflict))
    return out
