"""QUAL-1: the W1 draft schema, the forced commit's and the tool's parameters, the commit body type and
the protocol text come from one definition; every field the protocol asks for is in the schema, and back."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from novelbus.novel.body import CommitArgs, CommitBody, body_field_guide, body_shape
from novelbus.novel.pack import PROTOCOL_W1, PROTOCOL_W2
from novelbus.writers.runner import W1_INSTRUCTION, W1_REFUSED, W1_REPAIR
from novelbus.writers.structured import (
    MAX_PARAGRAPH_CHARS,
    P6_SYSTEM,
    RAW_PER_EFFECTIVE,
    commit_schema,
    draft_schema,
)
from novelbus.writers.tools import COMMIT_TOOL, openai_tool_definitions

_TYPE_WORDS = r"\((?:list of|text|object|true or false|one of)"


def schema_names(schema: dict[str, Any]) -> set[str]:
    """Every property name of a JSON Schema, at any depth."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                names.add(name)
                walk(sub)
            for key in ("items", "anyOf"):
                walk(node.get(key))
        elif isinstance(node, list):
            for sub in node:
                walk(sub)

    walk(schema)
    return names


def struct_names(t: Any) -> set[str]:
    """Every field name (as encoded) of a msgspec Struct, nested Structs included."""
    import msgspec.inspect as mi

    names: set[str] = set()

    def walk(info: Any) -> None:
        if isinstance(info, mi.Metadata):
            walk(info.type)
        elif isinstance(info, mi.StructType):
            for f in info.fields:
                names.add(f.encode_name)
                walk(f.type)
        elif isinstance(info, (mi.ListType, mi.UnionType)):
            for sub in ([info.item_type] if isinstance(info, mi.ListType) else info.types):
                walk(sub)

    walk(mi.type_info(t))
    return names


def protocol_w1_names() -> set[str]:
    text = "\n".join(PROTOCOL_W1)
    return set(re.findall(r"(\w+) " + _TYPE_WORDS, text))


def test_every_field_the_w1_protocol_asks_for_is_in_the_draft_schema_and_back() -> None:
    """QUAL-1: protocol text ⇔ draft schema ⇔ the body type."""
    schema = draft_schema(target_max=2_000)
    assert protocol_w1_names() == schema_names(schema) == struct_names(CommitBody)
    assert {"nextAnchor", "foreshadowingId", "foreshadowingStatus", "characterIds", "detail"} <= schema_names(schema)


def test_the_forced_commit_the_tool_and_the_w2_protocol_list_the_same_fields() -> None:
    """QUAL-1: the commit tool's parameters (generated from CommitArgs), the forced commit's and the
    W2 protocol's body are the draft's fields plus the unit id."""
    body = struct_names(CommitBody)
    assert schema_names(commit_schema("u-1", target_max=900)) == body | {"unitId"} == struct_names(CommitArgs)
    tool = next(t for t in openai_tool_definitions([COMMIT_TOOL]) if t["function"]["name"] == COMMIT_TOOL)
    assert schema_names(tool["function"]["parameters"]) == body | {"unitId"}
    w2 = next(line for line in PROTOCOL_W2 if line.startswith("Then call novel_body_commit"))
    assert body_shape() in w2
    assert set(re.findall(r"[A-Za-z]+", body_shape())) == body
    assert all(name in W1_INSTRUCTION for name in body)


def test_templates_show_no_placeholder_a_model_could_copy_as_prose() -> None:
    """QUAL-1: no '...' (or '…') in any text a writer is shown about the reply's shape."""
    for text in (*PROTOCOL_W1, *PROTOCOL_W2, W1_INSTRUCTION, W1_REPAIR, W1_REFUSED, P6_SYSTEM, *body_field_guide()):
        assert "..." not in text and "…" not in text and "[...]" not in text, text


@pytest.mark.parametrize("target_max", [300, 1_300, 6_000, 20_000, 40_000])
def test_long_units_get_more_paragraphs_not_an_impossible_cap(target_max: int) -> None:
    """QUAL-1: the paragraph bound grows with the unit: the schema can hold targetMax's prose."""
    paragraphs = draft_schema(target_max=target_max)["properties"]["paragraphs"]
    room = paragraphs["maxItems"] * paragraphs["items"]["maxLength"]
    assert paragraphs["items"]["maxLength"] <= MAX_PARAGRAPH_CHARS
    assert room >= target_max * RAW_PER_EFFECTIVE


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """What a server honouring `schema` could emit of `value`: unknown properties dropped,
    strings and lists cut at their bounds (a grammar can produce nothing else)."""
    if "anyOf" in schema:
        branch = next((b for b in schema["anyOf"] if (b.get("type") == "null") == (value is None)), schema["anyOf"][0])
        return prune(value, branch)
    if isinstance(value, dict) and "properties" in schema:
        return {k: prune(v, schema["properties"][k]) for k, v in value.items() if k in schema["properties"]}
    if isinstance(value, list):
        items = value[: schema.get("maxItems", len(value))]
        return [prune(v, schema.get("items", {})) for v in items]
    if isinstance(value, str) and "maxLength" in schema:
        return value[: schema["maxLength"]]
    return value


def test_a_schema_honouring_server_can_resolve_a_foreshadowing_item() -> None:
    """QUAL-1: a foreshadowing change survives the draft schema whole; without foreshadowingId in
    the schema (as before) it could not (the check fails on such a schema)."""
    change = {"kind": "foreshadowing", "summary": "the torn page is found", "sources": ["inline#0"],
              "foreshadowingId": "torn-log-page", "foreshadowingStatus": "resolved", "characterIds": ["mara"]}
    draft = {"paragraphs": ["Mara found the torn page at last."],
             "sceneCompletion": {"completed": True, "basis": "found", "nextAnchor": None},
             "canonChanges": [change]}
    schema = draft_schema(target_max=900)
    assert prune(draft, schema) == draft
    body = msgspec.convert(prune(draft, schema), CommitBody)
    assert body.canon_changes[0].foreshadowing_id == "torn-log-page"
    old = draft_schema(target_max=900)
    del old["properties"]["canonChanges"]["items"]["properties"]["foreshadowingId"]
    assert "foreshadowingId" not in prune(draft, old)["canonChanges"][0]


