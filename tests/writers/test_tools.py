"""The one tool registry (TOOL-1..5)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest

from novelbus.novel.body import CanonChange, CommitArgs, CommitBody
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from novelbus.writers.tools import (
    BODY_READ_CAP,
    COMMIT_TOOL,
    READ_TOOLS,
    READ_TOOLS_NOT_ENABLED,
    SEARCH_ROW_CAP,
    TOOL_REGISTRY,
    W2_ALLOW_LIST,
    WRITE_TOOLS,
    ToolContractError,
    ToolGateError,
    call_read_tool,
    check_read_tools_gate,
    commit_body_from_args,
    openai_tool_definitions,
    parse_tool_arguments,
    registry_listing,
    tool_parameters_schema,
    validate_tool_args,
)
from tests.writers.conftest import make_commit, snapshot_of

READ_TOOL_CALLS = [
    ("novel_status_read", {}),
    ("novel_outline_read", {}),
    ("novel_outline_read", {"chapterId": "ch2"}),
    ("novel_character_read", {"characterId": "wren"}),
    ("novel_lore_search", {"query": "Maidens reef"}),
    ("novel_body_read", {"chapterId": "ch1"}),
    ("novel_body_search", {"query": "lamp"}),
    ("novel_facts_read", {}),
    ("novel_facts_read", {"characterId": "wren"}),
    ("memory_search", {"query": "paraffin"}),
    ("memory_read", {"noteId": "n1"}),
]


def test_tool_registry_is_the_single_source_of_tool_definitions() -> None:
    """TOOL-1: definitions for exactly the W2 allow-list, generated from the registry."""
    definitions = openai_tool_definitions(W2_ALLOW_LIST)
    names = [d["function"]["name"] for d in definitions]
    assert names == list(W2_ALLOW_LIST) == list(TOOL_REGISTRY)
    assert set(READ_TOOLS) | set(WRITE_TOOLS) == set(W2_ALLOW_LIST)
    assert list(WRITE_TOOLS) == [COMMIT_TOOL]
    for d in definitions:
        assert d["type"] == "function"
        params = d["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert d["function"]["description"]
        assert "$ref" not in json.dumps(params) and "$defs" not in json.dumps(params)
    for spec in READ_TOOLS.values():
        assert spec.tables_read and spec.impl is not None
    assert [row["name"] for row in registry_listing()] == list(TOOL_REGISTRY)


def test_tool_definitions_are_a_fresh_copy_of_the_registry_schemas_each_call() -> None:
    """TOOL-1, PERF-2: built once per list of names, yet each call gets its own copy, equal to
    the registry's schemas; changing one copy changes neither the next nor the registry."""
    first = openai_tool_definitions([*W2_ALLOW_LIST, COMMIT_TOOL])  # a repeated name is offered once
    assert [d["function"] for d in first] == [
        {"name": n, "description": TOOL_REGISTRY[n].description, "parameters": tool_parameters_schema(n)}
        for n in W2_ALLOW_LIST]
    first[-1]["function"]["parameters"]["properties"].clear()
    first[-1]["function"]["name"] = "changed"
    second = openai_tool_definitions(W2_ALLOW_LIST)
    assert second[-1]["function"]["name"] == COMMIT_TOOL
    assert second[-1]["function"]["parameters"] == tool_parameters_schema(COMMIT_TOOL)
    assert second[-1]["function"]["parameters"]["properties"]
    assert second[-1] is not openai_tool_definitions(W2_ALLOW_LIST)[-1]


def test_tool_definitions_never_offer_claim_planning_or_completion_tools() -> None:
    """RUN-3: tools outside the registry cannot be offered at all."""
    for name in ("claim_unit", "novel_finish", "outline_revise", "novel_chapter_complete"):
        with pytest.raises(ToolContractError) as err:
            openai_tool_definitions([*W2_ALLOW_LIST, name])
        assert err.value.code == "tool-contract" and err.value.exit_code == 2


def test_commit_schema_matches_the_commit_body() -> None:
    """The commit tool's parameters are CommitBody plus unitId, spelled as on the wire."""
    body_fields = set(msgspec.json.decode(msgspec.json.encode(_body()), type=dict))
    params = openai_tool_definitions([COMMIT_TOOL])[0]["function"]["parameters"]
    assert set(params["properties"]) == body_fields | {"unitId"}
    assert set(params["required"]) == {"unitId", "paragraphs", "sceneCompletion"}
    args = {"unitId": "u-1", **msgspec.to_builtins(_body())}
    validated = validate_tool_args(COMMIT_TOOL, args)
    assert isinstance(validated, CommitArgs)
    assert commit_body_from_args(validated) == _body()


def _body() -> CommitBody:
    return msgspec.convert(
        {
            "paragraphs": ["The lamp was cold."],
            "sceneCompletion": {
                "completed": False,
                "basis": "Wren has not yet searched the room",
                "outstandingGoals": ["search the room"],
                "nextAnchor": "Wren turns to the desk",
            },
            "canonChanges": [
                {
                    "kind": "event",
                    "summary": "The lamp went out",
                    "sources": ["inline#0"],
                    "detail": "overnight",
                    "characterIds": ["wren"],
                }
            ],
        },
        CommitBody,
    )


@pytest.mark.parametrize(("name", "args"), READ_TOOL_CALLS)
def test_read_tools_return_creative_content_without_hashes_or_tokens(
    sample_snapshot_with_prose: NovelSnapshot, name: str, args: dict
) -> None:
    """TOOL-5 / CTX-8: results are JSON-able and carry no hashes, revisions or claim data."""
    result = call_read_tool(sample_snapshot_with_prose, name, args)
    text = json.dumps(result, ensure_ascii=False)
    assert sample_snapshot_with_prose.outline_revision not in text
    assert "f" * 64 not in text  # the commit's body hash
    assert not re.search(r"token|claimId|runId|delegation|hash", text, re.IGNORECASE)


def test_status_names_the_unit_being_written(sample_snapshot_with_prose: NovelSnapshot) -> None:
    status = call_read_tool(sample_snapshot_with_prose, "novel_status_read", {})
    assert status["currentChapterId"] == "ch1"
    assert status["currentUnit"]["unitId"] == "u-2"
    assert status["commitCount"] == 1
    assert status["chapters"][0]["scenesFinished"] == 1


def test_outline_read_is_chapter_windowed(sample_snapshot_with_prose: NovelSnapshot) -> None:
    result = call_read_tool(sample_snapshot_with_prose, "novel_outline_read", {"chapterId": "ch2"})
    assert result["chapter"]["chapterId"] == "ch2"
    assert {s["chapterId"] for s in result["scenes"]} == {"ch2"}
    assert result["previousChapter"]["chapterId"] == "ch1"
    assert result["nextChapter"]["chapterId"] == "ch3"
    default = call_read_tool(sample_snapshot_with_prose, "novel_outline_read", {})
    assert default["chapter"]["chapterId"] == "ch1" and default["previousChapter"] is None


def test_body_read_truncates_at_30000_characters_with_a_marker(sample_file) -> None:
    """TOOL-2: chapter reads cut at 30,000 characters and say how much was left out."""
    paragraphs = ["x" * 999 for _ in range(45)]
    snap = snapshot_of(sample_file, commits=[make_commit(1, "u-1", "ch1", "cold-lamp", paragraphs)])
    result = call_read_tool(snap, "novel_body_read", {"chapterId": "ch1"})
    full = "\n\n".join(f"[commit-1#{i}] {p}" for i, p in enumerate(paragraphs))
    assert result["truncated"] is True
    head, marker = result["text"].rsplit("\n", 1)
    assert head == full[:BODY_READ_CAP] and len(head) == 30_000
    assert marker == f"[truncated: {len(full) - 30_000} more characters]"


def test_body_read_short_chapter_is_whole_and_cites_sources(
    sample_snapshot_with_prose: NovelSnapshot,
) -> None:
    result = call_read_tool(sample_snapshot_with_prose, "novel_body_read", {"chapterId": "ch1"})
    assert result["truncated"] is False
    assert result["text"].startswith("[commit-1#0] Wren rowed out")
    assert "[truncated" not in result["text"]
    scene_only = call_read_tool(
        sample_snapshot_with_prose, "novel_body_read", {"chapterId": "ch1", "sceneId": "nope"}
    )
    assert scene_only["text"] == "" and scene_only["commitIds"] == []


def test_searches_return_at_most_50_rows(sample_file) -> None:
    """TOOL-2: searches are capped at 50 rows and report the total."""
    paragraphs = [f"The lamp burned low on night {i}." for i in range(120)]
    notes = [(f"note{i}", "lamp oil again") for i in range(70)]
    snap = snapshot_of(
        sample_file, commits=[make_commit(1, "u-1", "ch1", "cold-lamp", paragraphs)], notes=notes
    )
    for name in ("novel_body_search", "memory_search"):
        result = call_read_tool(snap, name, {"query": "lamp"})
        assert len(result["rows"]) == SEARCH_ROW_CAP
        assert result["truncated"] is True and result["totalMatches"] > SEARCH_ROW_CAP
    body = call_read_tool(snap, "novel_body_search", {"query": "lamp"})
    assert body["rows"][0]["source"] == "commit-1#0"
    facts_commit = make_commit(
        2,
        "u-2",
        "ch1",
        "torn-page",
        ["x"],
        canon=[
            CanonChange(kind="event", summary=f"fact {i}", sources=["inline"]) for i in range(60)
        ],
    )
    facts = call_read_tool(snapshot_of(sample_file, commits=[facts_commit]), "novel_facts_read", {})
    assert len(facts["rows"]) == SEARCH_ROW_CAP and facts["rows"][-1]["summary"] == "fact 59"


def test_lore_search_is_cjk_aware(chinese_file) -> None:
    snap = snapshot_of(chinese_file)
    result = call_read_tool(snap, "novel_lore_search", {"query": "灯塔的煤油"})
    assert [r["entryId"] for r in result["rows"]] == ["lamp"]
    assert (
        call_read_tool(snap, "novel_lore_search", {"query": "暗礁"})["rows"][0]["entryId"] == "reef"
    )


def test_facts_read_filters_by_character_and_names_commits(
    sample_snapshot_with_prose: NovelSnapshot,
) -> None:
    mine = call_read_tool(sample_snapshot_with_prose, "novel_facts_read", {"characterId": "wren"})
    assert [f["commitId"] for f in mine["rows"]] == ["commit-1"]
    other = call_read_tool(
        sample_snapshot_with_prose, "novel_facts_read", {"characterId": "corwin"}
    )
    assert other["rows"] == []


def test_tools_see_only_live_commits(sample_file) -> None:
    """A superseded unit's commit is not part of the novel any more."""
    units = [
        UnitView(
            unit_id="u-old",
            chapter_id="ch1",
            scene_id="cold-lamp",
            fragment=1,
            state="superseded",
            attempt=1,
        )
    ]
    snap = snapshot_of(
        sample_file, units=units, commits=[make_commit(1, "u-old", "ch1", "cold-lamp", ["lamp"])]
    )
    assert call_read_tool(snap, "novel_body_search", {"query": "lamp"})["rows"] == []
    assert call_read_tool(snap, "novel_status_read", {})["commitCount"] == 0


@pytest.mark.parametrize(
    ("name", "args", "field"),
    [
        ("novel_body_read", {}, "chapterId"),
        ("novel_body_read", {"chapterId": "ch1", "limit": 5}, "limit"),
        ("novel_character_read", {"characterId": 7}, "characterId"),
        ("novel_lore_search", {"query": ""}, "query"),
        ("novel_character_read", {"characterId": "nobody"}, "characterId"),
        ("novel_body_read", {"chapterId": "ch99"}, "chapterId"),
        ("memory_read", {"noteId": "missing"}, "noteId"),
    ],
)
def test_invalid_arguments_are_a_contract_error_naming_the_field(
    sample_snapshot_with_prose: NovelSnapshot, name: str, args: dict, field: str
) -> None:
    """TOOL-3."""
    with pytest.raises(ToolContractError) as err:
        call_read_tool(sample_snapshot_with_prose, name, args)
    assert err.value.code == "tool-contract"
    assert field in str(err.value)


def test_unknown_tool_and_write_tool_are_not_read_tools(sample_snapshot: NovelSnapshot) -> None:
    with pytest.raises(ToolContractError, match="unknown tool"):
        call_read_tool(sample_snapshot, "novel_delete_everything", {})
    with pytest.raises(ToolContractError, match="not a read tool"):
        call_read_tool(sample_snapshot, COMMIT_TOOL, {})


def test_arguments_must_be_a_json_object() -> None:
    assert parse_tool_arguments("") == {}
    assert parse_tool_arguments('{"a": 1}') == {"a": 1}
    for raw in ("{nope", "[1, 2]", '"text"'):
        with pytest.raises(ToolContractError):
            parse_tool_arguments(raw)


def test_read_tools_gate_fails_closed() -> None:
    """TOOL-4: an allow-list naming read tools while they are disabled is refused before the run."""
    with pytest.raises(ToolGateError) as err:
        check_read_tools_gate(W2_ALLOW_LIST, read_tools_enabled=False)
    assert err.value.code == READ_TOOLS_NOT_ENABLED
    check_read_tools_gate(W2_ALLOW_LIST, read_tools_enabled=True)
    check_read_tools_gate([COMMIT_TOOL], read_tools_enabled=False)
    check_read_tools_gate([], read_tools_enabled=False)
    with pytest.raises(ToolContractError):
        check_read_tools_gate(["claim_unit"], read_tools_enabled=True)


def _sample_with_goal(goal: str) -> Any:
    from novelbus.novel.outline import parse_novel_file
    from novelbus.novel.sample import sample_novel_bytes

    data = json.loads(sample_novel_bytes())
    for scene in data["outline"]["scenes"]:
        scene["goal"] = goal
    return parse_novel_file(json.dumps(data).encode())


def test_w2_request_bound_counts_pack_tools_and_reserve() -> None:
    """MODEL-5: the creation-time bound of the first W2 request holds the trimmed pack, the W2
    tool definitions and the reply reserve; a longer scene field raises it; `w2_fit_error`
    names the window, the figure and the scene only when it does not fit."""
    from novelbus.app.window_fit import w2_fit_error, w2_request_bound
    from novelbus.writers.runner import MIN_OUTPUT_TOKENS, tool_definition_tokens

    short, long = _sample_with_goal("Find the bell."), _sample_with_goal("Find the bell. " * 19)
    a, b = w2_request_bound(short), w2_request_bound(long)
    assert a is not None and b is not None
    assert a.tool_tokens == tool_definition_tokens(openai_tool_definitions(W2_ALLOW_LIST)) > 0
    assert a.tokens > a.tool_tokens + MIN_OUTPUT_TOKENS
    assert b.tokens > a.tokens + 40
    scene = b.scene_id
    assert scene in {s.sceneId for s in long.outline.scenes}
    assert w2_fit_error(long, b.tokens) is None
    error = w2_fit_error(long, b.tokens - 1)
    assert error is not None
    assert f"{b.tokens - 1:,} tokens" in error and f"about {b.tokens:,}" in error and scene in error


def test_first_request_bound_of_w1_and_inline_is_what_their_runs_send() -> None:
    """MODEL-5: the creation-time bound covers every shape — W1 the full pack and its instruction
    with no tools, inline the session preamble and the first unit's brief with the W2 tools — each
    equal to the estimate of the opening request those runs build (writers.runner /
    writers.inline), plus the reply reserve — the unit's targetMax in tokens (QUAL-4), as the runs
    reserve it; `fit_error` names the shape when it does not fit."""
    from novelbus.actors.writer import MAX_OUTPUT_TOKENS
    from novelbus.app.window_fit import first_request_bound, fit_error
    from novelbus.novel.outline import outline_revision
    from novelbus.novel.pack import render_pack
    from novelbus.novel.snapshot import NovelSnapshot, UnitView
    from novelbus.writers.chat import system_message, user_message
    from novelbus.writers.inline import session_preamble, unit_brief
    from novelbus.writers.runner import W1_INSTRUCTION, expected_output_tokens, request_tokens
    from novelbus.writers.structured import unit_target_max

    def reserve(pack: str) -> int:
        return min(expected_output_tokens(unit_target_max(pack), pack), MAX_OUTPUT_TOKENS)

    nf = _sample_with_goal("Find the bell.")
    w1, w2, inline = (first_request_bound(nf, s) for s in ("W1", "W2", "inline"))
    assert w1 is not None and w2 is not None and inline is not None
    assert w1.tool_tokens == 0 and inline.tool_tokens == w2.tool_tokens > 0
    assert nf.outline is not None
    tools = openai_tool_definitions(W2_ALLOW_LIST)
    expected = {"W1": 0, "inline": 0}
    for scene in nf.outline.scenes:
        unit = UnitView(unit_id="u-fit", chapter_id=scene.chapterId, scene_id=scene.sceneId, fragment=1,
                        state="prepared", attempt=0, continuation_anchor=scene.continuationAnchor)
        snap = NovelSnapshot(novel_id="n-fit", title=nf.title, status="active", pause_reason=None,
                             config=nf.config, outline=nf.outline,
                             outline_revision=outline_revision(None, "create", nf.outline),
                             units=[unit], commits=[], as_of_seq=0)
        full, trimmed = render_pack(snap, "u-fit", "full").text, render_pack(snap, "u-fit", "trimmed").text
        expected["W1"] = max(expected["W1"], request_tokens(
            [system_message(full), user_message(W1_INSTRUCTION)], None) + reserve(full))
        expected["inline"] = max(expected["inline"], request_tokens(
            [system_message(session_preamble(trimmed)), user_message(unit_brief(trimmed))], tools)
            + reserve(trimmed))
    assert (w1.tokens, inline.tokens) == (expected["W1"], expected["inline"])
    assert fit_error(nf, w1.tokens, "W1") is None and fit_error(nf, inline.tokens, "inline") is None
    error = fit_error(nf, w1.tokens - 1, "W1")
    assert error is not None and "first W1 request" in error and "tool definitions" not in error
    error = fit_error(nf, inline.tokens - 1, "inline")
    assert error is not None and "first inline request" in error and "of tool definitions" in error


async def test_a_runs_tool_estimate_from_names_equals_the_estimate_of_its_definitions() -> None:
    """MODEL-6, PERF-2: the estimate kept per list of names is the estimate of the definitions
    those names give, for every allow-list shape; a provider that measures still wins."""
    from novelbus.writers.offline import OfflineProvider
    from novelbus.writers.runner import run_tool_tokens, tool_definition_tokens

    provider = OfflineProvider()
    for names in (tuple(W2_ALLOW_LIST), (COMMIT_TOOL,), tuple(reversed(W2_ALLOW_LIST)), tuple(W2_ALLOW_LIST)[1:3]):
        tools = openai_tool_definitions(names)
        expected = tool_definition_tokens(tools)
        assert await run_tool_tokens(provider, tools, names) == expected == await run_tool_tokens(provider, tools)
        assert expected > 0


def test_known_definitions_are_estimated_as_what_was_sent() -> None:
    """MODEL-6, PERF-2: the offline provider's per-call estimate skips serialising the registry's
    own definitions, and equals the estimate of exactly what was sent — also when a caller edited
    its copy, repeated a tool, reordered them or named one the registry does not know."""
    from novelbus.writers.runner import known_tool_definition_tokens, tool_definition_tokens

    names = tuple(W2_ALLOW_LIST)
    edited = openai_tool_definitions(names)
    edited[0]["function"]["description"] += " Read it twice, and slowly, before anything else."
    unknown = [*openai_tool_definitions(names[:1]),
               {"type": "function", "function": {"name": "no_such_tool", "parameters": {}}}]
    for tools in (openai_tool_definitions(names), openai_tool_definitions(names[::-1]), edited,
                  openai_tool_definitions(names) + openai_tool_definitions(names[:1]), unknown, [{}]):
        assert known_tool_definition_tokens(tools) == tool_definition_tokens(tools) > 0
    assert known_tool_definition_tokens(edited) > known_tool_definition_tokens(openai_tool_definitions(names))
    assert known_tool_definition_tokens(None) == known_tool_definition_tokens([]) == 0
