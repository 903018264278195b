"""Steering commands on `novelbus.cmd.steer` (PLAN-1..5), served by the driver.

A person (the CLI), a panel or an external planner sends these; each has one reply type, or an
ErrorReply with a stable code (`revision-conflict` naming the current revision, `unit-in-flight`,
`revision-refused`, `config-invalid`, `requirement-refused`, `blocked-resolution-citation`, …).
Replies to the caller may carry the outline and directive texts; events never do.
"""

from typing import Any

from novelbus.messages.base import Message
from novelbus.messages.requirements import RequirementUpdate, ResolvedConflict

# --- outline (PLAN-1) -----------------------------------------------------------------------


class GetOutline(Message, tag="steer.outline", frozen=True):
    novel_id: str


class OutlineState(Message, tag="steer.outline-state", frozen=True):
    """The current revision and outline, with what a planner needs to decide (PLAN-2)."""

    novel_id: str
    revision: str | None
    seq: int  # the revision's position in the novel's history (1 = as created)
    outline: dict[str, Any] | None
    status: str
    pause_reason: str | None
    planned_chapters: int | None
    requirement_watermark: int
    requirements_pending: int
    requirements_blocked: int
    # what planning the novel needs now (the `why` of outline.requested), or null
    awaiting: str | None = None
    next_chapter_order: int = 1


class ReviseOutline(Message, tag="steer.revise", frozen=True):
    """Compare-and-set: `layers` replaces the named outline layers (story, chapters, scenes,
    characters, lore, foreshadowing); omitted layers are carried forward. `expectedRevision` must
    be the current revision. `requirements` applies/blocks/supersedes ledger entries with this
    revision. While a unit is claimed the revision is held up to `holdMs` for the claim to settle,
    then refused with `unit-in-flight`."""

    novel_id: str
    expected_revision: str | None
    reason: str
    layers: dict[str, Any] = {}
    requirements: list[RequirementUpdate] = []
    hold_ms: int = 10_000


class RevisionApplied(Message, tag="steer.revised", frozen=True):
    novel_id: str
    revision: str
    parent: str | None
    seq: int
    chapters: int
    scenes: int
    superseded_units: list[str]
    applied: list[str]
    blocked: list[str]
    superseded: list[str]
    requirement_watermark: int
    warnings: list[str]  # preflight (PLAN-5)
    resumed: bool  # the revision resolved an awaiting-outline / requirement-conflict pause (PLAN-2)
    held_ms: int = 0  # how long it waited for a claim to settle


class ListRevisions(Message, tag="steer.revisions", frozen=True):
    novel_id: str


class RevisionEntry(Message, tag="steer.revision", frozen=True):
    seq: int
    revision: str
    parent: str | None
    reason: str
    created_at: str
    chapters: int
    scenes: int


class Revisions(Message, tag="steer.revisions-list", frozen=True):
    novel_id: str
    current: str | None
    revisions: list[RevisionEntry]


# --- configuration (PLAN-5) -----------------------------------------------------------------


class ConfigureNovel(Message, tag="steer.config", frozen=True):
    """Set config fields by dotted path, e.g. {"budgets.maxTurns": 400}; empty reads the config."""

    novel_id: str
    set: dict[str, Any] = {}


class NovelConfigured(Message, tag="steer.configured", frozen=True):
    novel_id: str
    config: dict[str, Any]
    changed: list[str]
    warnings: list[str]
    resumed: bool  # a budget pause the new budgets allow again was lifted


# --- requirements ledger (PLAN-4) -----------------------------------------------------------


class DirectNovel(Message, tag="steer.direct", frozen=True):
    """A user directive; receiving is idempotent on `messageId`."""

    novel_id: str
    text: str
    message_id: str


class DirectiveReceived(Message, tag="steer.directed", frozen=True):
    novel_id: str
    requirement_id: str
    sequence: int
    status: str
    duplicate: bool


class ListRequirements(Message, tag="steer.requirements", frozen=True):
    novel_id: str


class RequirementEntry(Message, tag="steer.requirement", frozen=True):
    requirement_id: str
    sequence: int
    message_id: str
    text: str
    received_at: str
    status: str
    applied_revision: str | None
    blocked_reason: str | None
    superseded_by: str | None
    resolved_conflict: ResolvedConflict | None


class RequirementsState(Message, tag="steer.requirements-state", frozen=True):
    novel_id: str
    watermark: int
    requirements: list[RequirementEntry]


# --- the planner's projection (ROLE-4) -------------------------------------------------------


class GetPlanningView(Message, tag="steer.planning", frozen=True):
    novel_id: str


class PlanningView(Message, tag="steer.planning-view", frozen=True):
    """What an external planner reads (ROLE-4): `projection` is the planner role's projection
    (`novelbus pack … --role planner --json` prints the same object for a unit) as of the latest
    commit — the story, cast, every chapter and scene with its state, foreshadowing, recent canon
    summaries; never prose, nothing after `as_of`. The other fields are the handles a planner needs
    to act (the revision for compare-and-set, what the novel waits for), not model input."""

    novel_id: str
    revision: str | None
    status: str
    as_of: int
    projection: dict[str, Any]
    awaiting: str | None = None
    next_chapter_order: int = 1


SteerRequest = (GetOutline | ReviseOutline | ListRevisions | ConfigureNovel | DirectNovel | ListRequirements
                | GetPlanningView)
