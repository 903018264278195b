"""Pack renderer commands (PACK-1..5)."""

from typing import Literal

from messages.base import Message

PackShape = Literal["full", "trimmed"]
ContinuityProfile = Literal["bounded", "wide"]


class RenderPack(Message, tag="packs.render", frozen=True):
    novel_id: str
    unit_id: str
    shape: PackShape
    profile: ContinuityProfile = "bounded"


class PackRendered(Message, tag="packs.rendered", frozen=True):
    unit_id: str
    shape: PackShape
    text: str
    prefix_sha256: str
    sha256: str
    chars: int
    est_tokens: int
    blocks: list[str]
    context_sha256: str | None = None


PacksRequest = RenderPack
