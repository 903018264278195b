"""`novelbus tools` (TOOL-1..5): the listing is what a W2 writer is offered; contract errors exit 2
before any server is contacted; the READ_TOOLS_NOT_ENABLED gate; real calls against a novel."""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.tools import SEARCH_ROW_CAP, W2_ALLOW_LIST, openai_tool_definitions
from tests.e2e.test_probe import _flags, novelbus

UNREACHABLE = {"NOVELBUS_NATS_URL": "nats://127.0.0.1:1", "NOVELBUS_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}


async def test_list_is_the_registry_and_equals_what_the_model_is_offered() -> None:
    """TOOL-1 / TOOL-3: `tools --list` prints the one registry; its name/description/parameters are
    exactly the function definitions a W2 writer is offered, in the same order."""
    code, out, err = await novelbus("tools", "--list")
    assert code == 0, err
    listing = json.loads(out)
    assert [t["name"] for t in listing] == list(W2_ALLOW_LIST)
    offered = openai_tool_definitions(W2_ALLOW_LIST)
    assert [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
            for t in listing] == offered
    kinds = {t["name"]: (t["kind"], t["tablesRead"]) for t in listing}
    assert kinds["novel_body_commit"] == ("write", [])
    assert kinds["memory_search"] == ("read", ["notes"])


@pytest.mark.parametrize(("args", "needle"), [
    (["no_such_tool", "--novel", "n-1"], "unknown tool 'no_such_tool'"),
    (["novel_body_read", "--novel", "n-1", "--args", "{not json"], "not valid JSON"),
    (["novel_body_read", "--novel", "n-1", "--args", "[1, 2]"], "must be a JSON object"),
    (["novel_body_read", "--novel", "n-1", "--args", '{"chapter": "c1"}'], "chapterId"),
    (["novel_lore_search", "--novel", "n-1", "--args", '{"query": ""}'], "query"),
    (["novel_body_commit", "--novel", "n-1", "--args", "{}"], "write tool"),
])
async def test_contract_errors_exit_2_before_any_server_is_contacted(args: list[str], needle: str) -> None:
    """TOOL-3"""
    code, out, err = await novelbus("tools", "call", *args, env=UNREACHABLE)
    assert code == 2 and out == ""
    assert "tool-contract" in err and needle in err and "--list" in err


async def test_gate_from_config() -> None:
    """TOOL-4: NOVELBUS_READ_TOOLS=0 (Settings.read_tools_enabled) fails closed; a bad value is named."""
    code, _, err = await novelbus("tools", "call", "novel_status_read", "--novel", "n-1",
                                  env={**UNREACHABLE, "NOVELBUS_READ_TOOLS": "0"})
    assert code == 1 and "READ_TOOLS_NOT_ENABLED" in err and "NOVELBUS_READ_TOOLS=1" in err
    code, _, err = await novelbus("tools", "call", "novel_status_read", "--novel", "n-1",
                                  env={**UNREACHABLE, "NOVELBUS_READ_TOOLS": "maybe"})
    assert code == 2 and "NOVELBUS_READ_TOOLS" in err


async def test_calls_read_one_novel_with_the_search_cap(stack: Runtime, nats_url: str) -> None:
    """TOOL-2 / TOOL-5 / memory tools: real calls against a novel in the store; searches stop at 50 rows
    and say so; unknown ids and unknown novels are clear errors with exit 2."""
    pool = stack.ctx.pool
    novel_id = await store.create_novel(pool, parse_novel_file(sample_novel_bytes()))
    for i in range(SEARCH_ROW_CAP + 10):
        await store.add_note(pool, novel_id, f"note-{i:03}", f"Wren hates the smell of paraffin ({i}).")
    flags = _flags(stack, nats_url)[:4]  # servers only: tools read the store, no subjects involved

    async def call(name: str, args: dict[str, Any], novel: str = novel_id) -> tuple[int, Any, str]:
        code, out, err = await novelbus("tools", "call", name, "--novel", novel, "--args", json.dumps(args), *flags)
        return code, (json.loads(out) if code == 0 else None), err

    code, found, err = await call("memory_search", {"query": "paraffin"})
    assert code == 0, err
    assert len(found["rows"]) == SEARCH_ROW_CAP and found["totalMatches"] == 60 and found["truncated"] is True
    code, note, _ = await call("memory_read", {"noteId": "note-007"})
    assert note == {"noteId": "note-007", "text": "Wren hates the smell of paraffin (7).", "truncated": False}
    code, status, _ = await call("novel_status_read", {})
    assert status["novelId"] == novel_id and status["commitCount"] == 0 and len(status["chapters"]) == 3

    code, _, err = await call("novel_body_read", {"chapterId": "no-such-chapter"})
    assert code == 2 and "unknown chapter 'no-such-chapter'" in err
    code, _, err = await call("novel_status_read", {}, novel="n-missing")
    assert code == 2 and "novel-not-found" in err
    assert await store.list_events(pool, novel_id) == []  # reading wrote nothing
