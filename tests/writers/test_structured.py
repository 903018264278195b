"""Structured W1 drafts and forced commits (MODEL-2/3): the schemas carry the draft's constraints."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.body import CommitBody
from novelbus.writers.structured import (
    MAX_PARAGRAPH_CHARS,
    commit_schema,
    draft_schema,
    response_format,
    unit_target_max,
)


def test_response_formats_per_mechanism() -> None:
    """MODEL-2"""
    schema = draft_schema(target_max=900)
    assert response_format("json_schema", schema) == {
        "type": "json_schema", "json_schema": {"name": "draft", "schema": schema, "strict": False}}
    assert response_format("json_object+schema", schema) == {"type": "json_object", "schema": schema}
    assert response_format("json_object", schema) == {"type": "json_object"}
    assert response_format("prompt", schema) is None
    with pytest.raises(ValueError, match="mechanism"):
        response_format("xml", schema)


def test_the_unit_range_bounds_the_paragraphs() -> None:
    """MODEL-2"""
    pack = "[[unit]]\nunitId: u-1\nfragment: 1\ntargetMin: 300\ntargetMax: 1300\nstage: early\n"
    assert unit_target_max(pack) == 1300 and unit_target_max("[[story]]\ntitle: x\n") is None
    paragraphs = draft_schema(target_max=1300)["properties"]["paragraphs"]
    assert paragraphs["items"]["maxLength"] == MAX_PARAGRAPH_CHARS and paragraphs["maxItems"] == 3
    assert "maxLength" not in draft_schema()["properties"]["paragraphs"]["items"]
    forced = commit_schema("u-1", target_max=1300)
    assert forced["properties"]["unitId"] == {"type": "string", "enum": ["u-1"]}
    assert forced["required"][0] == "unitId"


@given(st.integers(min_value=1, max_value=10**6))
def test_grammar_servers_can_take_the_schema_for_any_unit_size(target_max: int) -> None:
    """MODEL-2: llama.cpp refuses a grammar of more than ~2,000 rules (its server then dies); a string
    bounded at N characters costs N rules. Whatever the unit's range, the bounded strings of the
    forced commit schema (every string of the body bounded, QUAL-1) stay far below that."""
    schema = commit_schema("u-1", target_max=target_max)
    bounded: list[int] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("maxLength"), int):
                bounded.append(node["maxLength"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert bounded and sum(bounded) <= 1_400


def test_a_draft_valid_under_the_schema_is_a_commit_body() -> None:
    """MODEL-2"""
    draft = {"paragraphs": ["The bell rang."], "sceneCompletion": {"completed": True, "basis": "rang"},
             "canonChanges": [{"kind": "event", "summary": "bell", "sources": ["inline#0"]}]}
    assert set(draft_schema()["required"]) == set(draft)
    assert msgspec.json.decode(json.dumps(draft), type=CommitBody).paragraphs == ["The bell rang."]




def test_a_draft_cites_only_its_own_paragraphs_or_the_commits_its_pack_shows() -> None:
    """MODEL-2, STORE-3: the grammar holds canon sources to what the store can resolve."""
    import re

    from novelbus.writers.structured import pack_commit_ids

    pack = ("[[canon]]\n- commit-3 relation [Mara]: the bell\n- commit-12 lore []: the quay\n"
            "- commit-3 character-state [Mara]: tired\n")
    assert pack_commit_ids(pack) == ["commit-3", "commit-12"]
    def pattern(schema: dict) -> str:
        return schema["properties"]["canonChanges"]["items"]["properties"]["sources"]["items"]["pattern"]
    shown = pattern(draft_schema(target_max=900, shown_commits=pack_commit_ids(pack)))
    assert [s for s in ("inline", "inline#2", "commit-3", "commit-12#1", "commit-1", "commit-123", "commit-99")
            if re.match(shown, s)] == ["inline", "inline#2", "commit-3", "commit-12#1"]
    none_shown = pattern(draft_schema(target_max=900, shown_commits=[]))
    assert re.match(none_shown, "inline#0") and not re.match(none_shown, "commit-1")
    assert not re.match(pattern(commit_schema("u-1", target_max=900)), "commit-3")
    unbounded = pattern(draft_schema(target_max=900))  # no pack: any well-formed source, digits bounded
    assert re.match(unbounded, "commit-7#2") and not re.match(unbounded, "commit-" + "9" * 12)
