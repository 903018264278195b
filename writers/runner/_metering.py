"""Per-call metering of a run (USE-1, MODEL-6): the input split, the tool definitions' tokens
and the recorded form of a call's arguments (RUN-6, REL-9)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from novelbus.novel.text import estimate_tokens
from novelbus.writers.chat import message_chars
from novelbus.writers.loop import reply_output_chars
from novelbus.writers.provider import ChatMessage, ModelProvider, ModelReply, measured_tool_tokens
from novelbus.writers.record import record_args
from novelbus.writers.runner._records import CallUsage, InputSplit
from novelbus.writers.tools import COMMIT_TOOL, TOOL_REGISTRY, openai_tool_definitions


def truncate_args(raw: str) -> str:
    """Recorded form of a call's arguments (RUN-6, REL-9): ids, numbers, booleans and enum values
    kept, every other string `{chars, sha256}` — never the writer's text (`writers.record`)."""
    return record_args(raw)


def _commit_prose_chars(call: dict[str, Any]) -> int:
    """Characters of commit paragraphs inside one assistant tool call (the prose echo)."""
    fn = call.get("function", {})
    if fn.get("name") != COMMIT_TOOL:
        return 0
    arguments = fn.get("arguments", "")
    try:
        value = json.loads(arguments, strict=False)
    except (json.JSONDecodeError, TypeError):
        return 0
    paragraphs = value.get("paragraphs") if isinstance(value, dict) else None
    if not isinstance(paragraphs, list):
        return 0
    # JSON escaping only lengthens text, so the echo never exceeds the arguments it sits in.
    return min(len(arguments), sum(len(p) for p in paragraphs if isinstance(p, str)))


def split_input(
    messages: list[ChatMessage], preamble: int, new_from: int, pack_from: int = 0
) -> InputSplit:
    """Attribute each message of one call: [pack_from, preamble) pack, [new_from, …) new tool
    results; everything else (including a continued session's history) is re-sent history."""
    pack = tool_results = history = echo = 0
    for i, message in enumerate(messages):
        chars = message_chars(message)
        if pack_from <= i < preamble:
            pack += chars
        elif i >= new_from and message.get("role") == "tool":
            tool_results += chars
        else:
            prose = sum(_commit_prose_chars(c) for c in message.get("tool_calls") or ())
            echo += prose
            history += chars - prose
    return InputSplit(pack, tool_results, history, echo)


def tool_definition_tokens(tools: list[dict[str, Any]] | None) -> int:
    """MODEL-6: the tool definitions go with every call; they are input like any message."""
    if not tools:
        return 0
    return estimate_tokens(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))


@functools.lru_cache(maxsize=64)
def _registry_tool_tokens(names: tuple[str, ...]) -> int:
    return tool_definition_tokens(openai_tool_definitions(names))


@functools.lru_cache(maxsize=64)
def _registry_definitions(names: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """The registry's definitions of exactly these names, in this order (None: not all known,
    or a name twice). Held for comparison only; never handed out."""
    if len(set(names)) != len(names) or not all(name in TOOL_REGISTRY for name in names):
        return None
    return openai_tool_definitions(names)


def known_tool_definition_tokens(tools: list[dict[str, Any]] | None) -> int:
    """`tool_definition_tokens(tools)`, without serialising `tools` when they are the registry's
    definitions of their names (PERF-2: a provider that estimates per run): equal to them → the
    estimate kept per list of names; anything else → the estimate of what was given."""
    if not tools:
        return 0
    names = tuple(
        t.get("function", {}).get("name", "") if isinstance(t, dict) else "" for t in tools
    )
    if tools == _registry_definitions(names):
        return _registry_tool_tokens(names)
    return tool_definition_tokens(tools)


async def run_tool_tokens(
    provider: ModelProvider,
    tools: list[dict[str, Any]] | None,
    names: tuple[str, ...] | None = None,
) -> int:
    """What the tool definitions cost every call of a run, resolved once per run: what the server
    puts in the prompt where the provider measures it (MODEL-5), else the estimate (MODEL-6).
    `names`: `tools` is exactly `openai_tool_definitions(names)`, whose estimate is computed once
    per list of names (PERF-2)."""
    measured = await measured_tool_tokens(provider, tools)
    if measured is not None:
        return measured
    return _registry_tool_tokens(names) if names is not None else tool_definition_tokens(tools)


def input_text(messages: Sequence[ChatMessage]) -> str:
    """The text a request sends: every message content and tool call (name and arguments)."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        for call in message.get("tool_calls") or ():
            fn = call.get("function", {})
            parts.append(fn.get("name", "") + fn.get("arguments", ""))
    return "".join(parts)


U = TypeVar("U", bound=CallUsage)


def call_usage(
    messages: Sequence[ChatMessage],
    split: InputSplit,
    reply: ModelReply | None,
    *,
    tools: list[dict[str, Any]] | None = None,
    forced: bool = False,
    tool_tokens: int | None = None,
    kind: type[U] = CallUsage,  # type: ignore[assignment]
    **extra: Any,
) -> U:
    """One model call as the service built it (USE-1), as `kind` (a CallUsage, or a subclass
    given its `extra` fields): `tool_tokens` as measured for the run, else the estimate of `tools`."""
    tool_tokens = tool_definition_tokens(tools) if tool_tokens is None else tool_tokens
    return kind(
        input_chars=split.total,
        output_chars=0 if reply is None else reply_output_chars(reply),
        tool_result_chars=split.tool_result_chars,
        pack_chars=split.pack_chars,
        history_chars=split.history_chars,
        prose_echo_chars=split.prose_echo_chars,
        est_input_tokens=estimate_tokens(input_text(messages)) + tool_tokens,
        usage=None if reply is None else reply.usage,
        forced=forced,
        tool_definition_tokens=tool_tokens,
        **extra,
    )


class Meter:
    """Per-call usage of one run."""

    def __init__(self) -> None:
        self.calls: list[CallUsage] = []

    def record(
        self,
        messages: list[ChatMessage],
        split: InputSplit,
        reply: ModelReply | None,
        *,
        tools: list[dict[str, Any]] | None = None,
        forced: bool = False,
        tool_tokens: int | None = None,
    ) -> None:
        self.calls.append(
            call_usage(messages, split, reply, tools=tools, forced=forced, tool_tokens=tool_tokens)
        )

    @property
    def output_chars(self) -> int:
        return sum(c.output_chars for c in self.calls)
