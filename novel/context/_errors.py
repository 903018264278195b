"""Context errors: every failure is typed and carries its data as fields (PACK-4, CTX-1, CTX-4, CTX-5)."""

from __future__ import annotations

from novelbus.messages.errors import PACK_ERROR
from novelbus.novel.text import truncate

_MAX_REASON = 300  # keeps a WriterPackError message well inside a 500-character error reply


class ContextError(Exception):
    """Base of every context failure: the context cannot be trusted, so nothing runs on it."""

    code = "context-error"


class ContextInputError(ContextError, ValueError):
    """CTX-1: a bad request (unknown scenario/purpose/profile, bad ids, bad asOf)."""

    code = "context-input"


class WriterPackError(ContextError):
    """PACK-4: the writer's context cannot be built completely; no writer may start on it.

    Raised by the assembler (no outline revision, unknown unit, chapter or scene) and by the
    writer projection (a chapter with commits but no prose tail, an uncovered participant).
    Subclasses keep the code ``pack-error`` so the driver applies the same failure policy.
    """

    code = PACK_ERROR
    kind = "incomplete"

    def __init__(
        self, novel_id: str, unit_id: str, missing_blocks: list[str], reason: str = ""
    ) -> None:
        self.novel_id = novel_id
        self.unit_id = unit_id
        self.missing_blocks = missing_blocks
        self.reason = reason
        # The message ends with "missing: a, b" so a bus error reply can carry the block names;
        # the reason is capped so the whole message fits the reply.
        why = f" ({truncate(reason, _MAX_REASON)})" if reason else ""
        super().__init__(
            f"writer pack for unit {unit_id} of novel {novel_id} is broken{why}; "
            f"missing: {', '.join(missing_blocks)}"
        )


class ContextLeakError(WriterPackError):
    """CTX-4: a source is after asOf, or was not read back by pointer — fail closed."""

    kind = "leak"


class ContextBudgetError(WriterPackError):
    """CTX-5: L0 or the continuity baseline do not fit the profile budget — fail loud."""

    kind = "budget"
