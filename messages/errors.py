"""Error replies with stable codes (BUS-4). Messages name ids and fields, never prose or tokens."""

from novelbus.messages.base import Message

# Stable codes a caller can branch on.
BAD_MESSAGE = "bad-message"
UNKNOWN_TYPE = "unknown-type"
TOO_LARGE = "too-large"
INTERNAL = "internal"
DELEGATION_NOT_FOUND = "delegation-not-found"
SCOPE_VIOLATION = "scope-violation"
DISPATCH_LIMIT = "dispatch-limit"
BUS_UNAVAILABLE = "bus-unavailable"  # nobody answered in time; the request may be retried
PACK_ERROR = "pack-error"  # PACK-4: the writer pack cannot be built completely
UNIT_NOT_CLAIMABLE = "unit-not-claimable"
UNIT_IN_FLIGHT = "unit-in-flight"
NOVEL_NOT_ACTIVE = "novel-not-active"
REVISION_CONFLICT = "revision-conflict"  # the outline moved on since the decision (PLAN-1)
WATERMARK_CONFLICT = "watermark-conflict"  # a requirement directive since the decision (PLAN-4)
REQUIREMENTS_OPEN = "requirements-open"
CLAIM_LOST = "claim-lost"  # a flow's delegation ended under it (its claim-manager instance restarted)


class ErrorReply(Message, tag="error", frozen=True, omit_defaults=True):
    """`missing_blocks`: a `pack-error`'s missing pack blocks (PACK-4), as data, never parsed out of
    the message text."""

    code: str
    message: str
    missing_blocks: list[str] = []
