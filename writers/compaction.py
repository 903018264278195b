"""Compacting an inline author session (RUN-5): the host's compaction request, and the offline
provider's deterministic answer to it. Shared by `writers.inline` (which asks) and
`writers.offline` (which answers), so neither imports the other."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from novelbus.novel.text import tail
from novelbus.writers.provider import ChatMessage
from novelbus.writers.tools import COMMIT_TOOL

SUMMARY_HEADER = "[[session-summary]]"
# The host's compaction request; a provider recognises it as the last user message of a call
# without tools (the offline provider answers it with `offline_summary`).
COMPACT_MARKER = "[[compact]]"
COMPACT_INSTRUCTION = (
    COMPACT_MARKER + "\nThe conversation is about to be compacted. Summarise it for yourself so "
    "you can continue writing the novel: units written (their ids), where the story stands, "
    "character states, open threads, and the last lines of prose. Reply with the summary only."
)
SUMMARY_TAIL_CHARS = 600
SUMMARY_RECENT_UNITS = 12


def is_compaction_request(messages: Sequence[ChatMessage]) -> bool:
    last = messages[-1] if messages else {}
    content = last.get("content")
    return (
        last.get("role") == "user"
        and isinstance(content, str)
        and content.startswith(COMPACT_MARKER)
    )


def _loads(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError:
        return None


def offline_summary(messages: Sequence[ChatMessage]) -> str:
    """A deterministic summary of a session history (the offline provider's compaction reply):
    how many units were committed, the latest unit ids, and the tail of the last committed prose.
    An earlier summary in the history is carried forward."""
    results = {
        m.get("tool_call_id"): _loads(m.get("content")) for m in messages if m.get("role") == "tool"
    }
    count = 0
    units: list[str] = []
    last_prose = ""
    for m in messages:
        content = m.get("content")
        if (
            m.get("role") == "user"
            and isinstance(content, str)
            and content.startswith(SUMMARY_HEADER)
        ):
            for line in content.split("\n"):
                key, _, value = line.partition(": ")
                if key == "unitsCommitted" and value.isdigit():
                    count = int(value)
                elif key == "recentUnits":
                    units = [u for u in value.split(", ") if u]
                elif key == "lastProse":
                    last_prose = value
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            result = results.get(call.get("id"))
            if fn.get("name") != COMMIT_TOOL or not (isinstance(result, dict) and result.get("ok")):
                continue
            args = _loads(fn.get("arguments"))
            if not isinstance(args, dict):
                continue
            count += 1
            units.append(str(args.get("unitId", "")))
            paragraphs = [p for p in args.get("paragraphs") or () if isinstance(p, str)]
            if paragraphs:
                last_prose = " ".join(paragraphs[-1].split())
    lines = [
        f"unitsCommitted: {count}",
        f"recentUnits: {', '.join(units[-SUMMARY_RECENT_UNITS:])}",
        f"lastProse: {tail(last_prose, SUMMARY_TAIL_CHARS)}" if last_prose else "lastProse: ",
    ]
    return "\n".join(lines)


def committed_in_context(messages: Sequence[ChatMessage]) -> set[str]:
    """MODEL-6: commit ids whose prose is in these messages — a successful novel_body_commit call
    (its arguments carry the paragraphs) answered with that commit id. One rule for the offline
    writer's research and the inline session's forced research: read only what is not held."""
    commit_calls = {c.get("id") for m in messages for c in m.get("tool_calls") or ()
                    if c.get("function", {}).get("name") == COMMIT_TOOL}
    out: set[str] = set()
    for m in messages:
        if m.get("role") == "tool" and m.get("tool_call_id") in commit_calls:
            result = _loads(m.get("content"))
            if isinstance(result, dict) and result.get("ok") is True and isinstance(result.get("commitId"), str):
                out.add(result["commitId"])
    return out
