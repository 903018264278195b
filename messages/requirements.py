"""Requirement ledger data carried by steering commands (PLAN-3..5): the transitions a revision
asks for and how a blocked requirement was resolved. Data only; the rules live in
`novel.requirements` (which re-exports these names)."""

from __future__ import annotations

from typing import Literal

import msgspec

TargetStatus = Literal["applied", "blocked", "superseded"]
ResolutionKind = Literal["clarification", "withdrawal"]


class ResolvedBy(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """What resolved a blocked requirement: a clarification or a withdrawal, by its message id."""

    kind: ResolutionKind
    message_id: str


class ResolvedConflict(msgspec.Struct, frozen=True, rename="camel"):
    """The conflict a blocked requirement had, kept when it is resolved."""

    reason: str
    resolved_by: ResolvedBy


class RequirementUpdate(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """One transition a revision asks for. `blockedReason` only with `blocked`, `supersededBy`
    (another requirement of the ledger) only with `superseded`, `resolvedBy` only (and always)
    when the requirement is blocked now."""

    requirement_id: str
    status: TargetStatus
    blocked_reason: str | None = None
    superseded_by: str | None = None
    resolved_by: ResolvedBy | None = None
