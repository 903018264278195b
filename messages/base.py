"""Base Struct for every wire message."""

import msgspec


class Message(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True, rename="camel"):
    """A wire message: frozen, tagged by `type`, camelCase on the wire, unknown fields refused."""
