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


class ErrorReply(Message, tag="error", frozen=True):
    code: str
    message: str
