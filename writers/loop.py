"""The tool-call loop's shared steps, used by every writer loop (W2 in `writers.runner`, the inline
author session in `writers.inline`): one tool-call policy, one way to count a reply and to
render a tool result."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from novelbus.novel.body import CommitArgs, CommitBody
from novelbus.writers.provider import ModelReply, ToolCall
from novelbus.writers.tools import (
    COMMIT_TOOL,
    ToolContractError,
    commit_body_from_args,
    parse_tool_arguments,
    validate_tool_args,
)

TOOL_NAME_RECORD_CAP = 64  # a model-invented tool name is recorded, but not at any length
# CTX-8: what the writer is told about its own commit; never hashes or claim ids.
RECEIPT_FIELDS_FOR_MODEL = (
    "commitId",
    "unitId",
    "effectiveCharacters",
    "totalCharacters",
    "duplicate",
)

ReadTool = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
CommitFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def reply_output_chars(reply: ModelReply) -> int:
    """Characters a model reply produced: its text plus tool-call names and arguments."""
    return len(reply.text or "") + sum(len(c.name) + len(c.arguments) for c in reply.tool_calls)


def result_text(result: dict[str, Any]) -> str:
    """A tool result as the model sees it: compact JSON, non-ASCII kept."""
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


async def execute_tool_call(
    call: ToolCall, allowed: tuple[str, ...], read_tool: ReadTool, commit: CommitFn
) -> tuple[dict[str, Any], str | None, tuple[CommitBody, dict[str, Any]] | None]:
    """Run one tool call under the W2 policy (RUN-3): (result for the model, error code or None,
    committed body + receipt). A name outside `allowed` is refused by the host, whatever the
    model believes it may call; bad arguments are a contract error the model sees."""
    if call.name not in allowed:
        # RUN-3 / PROBE P2: refused by the host, whatever the model believes it may call.
        refused = {"error": "tool-not-allowed", "tool": call.name[:TOOL_NAME_RECORD_CAP]}
        return refused, "tool-not-allowed", None
    try:
        args = parse_tool_arguments(call.arguments)
        params = validate_tool_args(call.name, args)
    except ToolContractError as e:
        return {"error": e.code, "message": str(e)}, e.code, None
    if call.name == COMMIT_TOOL:
        assert isinstance(params, CommitArgs)
        outcome = await commit(args)
        if outcome.get("ok"):
            receipt = outcome.get("receipt") or {}
            seen = {k: receipt[k] for k in RECEIPT_FIELDS_FOR_MODEL if k in receipt}
            return {"ok": True, **seen}, None, (commit_body_from_args(params), receipt)
        code = str(outcome.get("code") or "commit-failed")
        result = {"ok": False, "error": code}
        if outcome.get("message"):
            result["message"] = str(outcome["message"])
        return result, code, None
    try:
        return await read_tool(call.name, args), None, None
    except ToolContractError as e:
        return {"error": e.code, "message": str(e)}, e.code, None
