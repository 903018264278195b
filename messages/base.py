"""Base Struct for every wire message.

Names: a reply is named for what the caller gets (`ClaimGranted`, `PackReady`, `WriterResult`,
`ReleaseConfirmed`), an event for what happened (`UnitClaimed`, `PackRendered`, …); no reply
shares a class name with an event. A message's `type` tag is declared once, on its class, and
read from there (`tag_of`), never spelled again as a string literal.
"""

import msgspec


class Message(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True, rename="camel"):
    """A wire message: frozen, tagged by `type`, camelCase on the wire, unknown fields refused."""


def tag_of(cls: type[Message]) -> str:
    """The wire `type` tag of a message class (e.g. `tag_of(NovelPaused) == "novel.paused"`)."""
    return str(cls.__struct_config__.tag)
