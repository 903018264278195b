"""Typed store errors with stable codes (the bus maps `.code` to error replies).

Messages name ids and fields only: never prose, tokens or token hashes (BUS-6, REL-4).
`novel.commitcheck.BodyError` and `novel.guard.ProseGuardError` pass through unchanged.
"""

from __future__ import annotations

from novelbus.messages.errors import (
    NOVEL_NOT_ACTIVE,
    REQUIREMENTS_OPEN,
    REVISION_CONFLICT,
    UNIT_IN_FLIGHT,
    UNIT_NOT_CLAIMABLE,
    WATERMARK_CONFLICT,
)


class StoreError(Exception):
    code: str = "store-error"


class NovelNotFound(StoreError):
    code = "novel-not-found"


class NovelExists(StoreError):
    code = "novel-exists"


class NovelNotActive(StoreError):
    code = NOVEL_NOT_ACTIVE


class UnitNotFound(StoreError):
    code = "unit-not-found"


class SceneNotFound(StoreError):
    """prepare_unit named a (chapter, scene) pair the current outline does not have."""

    code = "scene-not-found"


class UnitNotClaimable(StoreError):
    code = UNIT_NOT_CLAIMABLE


class UnitInFlight(StoreError):
    """Another unit of the novel is claimed (units of one novel are strictly sequential)."""

    code = UNIT_IN_FLIGHT


class UnitNotClaimed(StoreError):
    code = "unit-not-claimed"


class TokenMismatch(StoreError):
    code = "token-mismatch"


class CommitConflict(StoreError):
    code = "commit-conflict"


class RevisionConflict(StoreError):
    """Compare-and-set on the outline revision failed."""

    code = REVISION_CONFLICT


class RevisionRefused(StoreError):
    """An outline revision breaks committed history (a committed chapter removed or reordered)."""

    code = "revision-refused"


class ConfigInvalid(StoreError):
    """A config change names an unknown field or an invalid value (PLAN-5); never clamped."""

    code = "config-invalid"


class RequirementsOpen(StoreError):
    """A claim while a requirement is pending or blocked (SPEC §16 Claim, PLAN-4)."""

    code = REQUIREMENTS_OPEN


class WatermarkConflict(StoreError):
    """A claim carrying a requirement watermark that is not the ledger's (SPEC §16 Claim)."""

    code = WATERMARK_CONFLICT


class SupersedeRefused(StoreError):
    code = "supersede-refused"


class OutlineMissing(StoreError):
    code = "outline-missing"


class RunNotFound(StoreError):
    code = "run-not-found"


class UnsafePayload(StoreError):
    """An event payload carried a key reserved for prose, prompts or tokens (BUS-6)."""

    code = "unsafe-payload"


class ReadOnlyRequired(StoreError):
    """A read that must run read-only (TOOL-5, INFRA-4) was given a connection that is not."""

    code = "read-only-required"


class CommitNotVisible(StoreError):
    """A commit a read asked for by id is not there at or before the read's asOf (PERF-2: the
    read tools' prose read by pointer; commits are never removed, so this fails closed)."""

    code = "commit-not-visible"
