"""Pack renderer commands (PACK-1..5, CTX-1..9).

The reply's hashes are for the orchestrator and the commit receipt (CTX-9); the writer only
ever gets `text`.
"""

from typing import Literal

from novelbus.messages.base import Message

PackShape = Literal["full", "trimmed"]
ContinuityProfile = Literal["bounded", "wide"]


class RenderPack(Message, tag="packs.render", frozen=True):
    novel_id: str
    unit_id: str
    shape: PackShape
    profile: ContinuityProfile = "bounded"
    # The last commit seq the context may see; None = the latest commit (or, for a committed
    # unit, the one before its own commit). A later value than the latest commit is refused.
    as_of_seq: int | None = None
    # ROLE-2: evidence recalled for a detector's gaps (`character:<id>`): a fresh writer's context
    # adds those characters' cards, canon states and pointed prose.
    evidence: list[str] = []


class PackReady(Message, tag="packs.rendered", frozen=True):
    unit_id: str
    shape: PackShape
    text: str
    prefix_sha256: str
    sha256: str
    chars: int
    est_tokens: int
    blocks: list[str]
    context_sha256: str | None = None
    manifest_sha256: str | None = None  # the persisted freeze (CTX-6)
    profile: ContinuityProfile = "bounded"
    as_of_seq: int | None = None


PacksRequest = RenderPack
