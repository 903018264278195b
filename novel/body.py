"""The commit body as the domain sees it: the wire contract's one schema (`messages.body`),
re-exported here so the pure core and its users name it where they work with it.

QUAL-1: the protocol text's field list is generated here from the same definition the W1 draft
schema and the commit tool's parameters are generated from, so the three never disagree.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec.inspect as mi

from novelbus.messages.body import CanonChange, CanonKind, CommitArgs, CommitBody, SceneCompletion

__all__ = ["CanonChange", "CanonKind", "CommitArgs", "CommitBody", "SceneCompletion", "body_field_guide",
           "body_shape"]


def _struct_of(t: mi.Type) -> mi.StructType | None:
    if isinstance(t, mi.StructType):
        return t
    if isinstance(t, mi.ListType):
        return _struct_of(t.item_type)
    return None


def _type_words(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        kinds = [_type_words(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(kinds) + (" or null" if any(isinstance(x, mi.NoneType) for x in t.types) else "")
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(sorted(str(v) for v in t.values))
    if isinstance(t, mi.ListType):
        item = _type_words(t.item_type)
        return f"list of {item}s" if isinstance(t.item_type, mi.StructType) else f"list of {item}"
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.StrType):
        return "text"
    if isinstance(t, mi.StructType):
        return "object"
    return type(t).__name__.removesuffix("Type").lower()


def _describe(field: mi.Field) -> str:
    t = field.type
    description = ""
    if isinstance(t, mi.Metadata):
        description = (t.extra_json_schema or {}).get("description", "").rstrip(".")
        t = t.type
    head = f"{field.encode_name} ({_type_words(t)}{', required' if field.required else ''})"
    return f"{head}: {description}" if description else head


def _fields(struct: mi.StructType) -> list[tuple[mi.Field, mi.StructType | None]]:
    out = []
    for f in struct.fields:
        t = f.type.type if isinstance(f.type, mi.Metadata) else f.type
        out.append((f, _struct_of(t)))
    return out


@functools.cache
def body_field_guide() -> tuple[str, ...]:
    """One line per top-level field of the commit body, its nested fields inside: name, type,
    whether required, and what it holds — generated from `CommitBody` (no placeholders a model
    could copy as prose)."""
    lines = []
    for field, nested in _fields(_body_type()):
        line = _describe(field)
        if nested is not None:
            line += ". Its fields: " + "; ".join(_describe(f) for f, _ in _fields(nested))
        lines.append(line + ".")
    return tuple(lines)


@functools.cache
def body_shape() -> str:
    """The body's field names in one line: `paragraphs, sceneCompletion {completed, …}, …`."""
    parts = []
    for field, nested in _fields(_body_type()):
        if nested is None:
            parts.append(field.encode_name)
            continue
        inner = ", ".join(f.encode_name for f, _ in _fields(nested))
        is_list = isinstance(_plain(field.type), mi.ListType)
        parts.append(f"{field.encode_name} [{{{inner}}}]" if is_list else f"{field.encode_name} {{{inner}}}")
    return ", ".join(parts)


def _plain(t: mi.Type) -> mi.Type:
    return t.type if isinstance(t, mi.Metadata) else t


def _body_type() -> mi.StructType:
    t: Any = mi.type_info(CommitBody)
    assert isinstance(t, mi.StructType)
    return t
