"""Window fitting (MODEL-5): a request's projected prompt tokens and the reply it leaves room for;
a request the window cannot hold is never sent."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from novelbus.novel.text import cjk_count, estimate_tokens
from novelbus.writers.provider import ChatMessage, ModelReply
from novelbus.writers.runner._metering import input_text, tool_definition_tokens

WINDOW_MARGIN_TOKENS = 64  # chat-template tokens around the messages
MIN_OUTPUT_TOKENS = 32
REPLY_ENVELOPE_TOKENS = 96  # the draft's JSON keys and notes, or the commit call around the prose
_LETTER_RE = re.compile(r"[^\W\d_]")  # a letter: a word character that is no digit or underscore


class WindowError(Exception):
    """A request the provider's window cannot hold: never sent (MODEL-5)."""


def request_tokens(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None, tool_tokens: int | None = None
) -> int:
    """Estimated tokens of one request: every message and the tool definitions (MODEL-6) —
    `tool_tokens` when the provider measured what its server puts in the prompt for them."""
    tools_part = tool_definition_tokens(tools) if tool_tokens is None else tool_tokens
    return estimate_tokens(input_text(messages)) + tools_part + WINDOW_MARGIN_TOKENS


class PromptMark(msgspec.Struct, frozen=True):
    """The provider-reported prompt tokens of the last call, how many messages that call sent,
    and reported ÷ estimated for it: the base the §16 gate and the window fit project from."""

    prompt_tokens: int
    messages: int
    ratio: float = 1.0


def reported_prompt_tokens(reply: ModelReply) -> int | None:
    """§16: input + cache read + cache write. OpenAI-style `prompt_tokens` already include the
    cached reads; a separately reported cache write is added."""
    usage = reply.usage
    if usage is None or usage.input_tokens is None:
        return None
    return usage.input_tokens + (usage.cache_write_tokens or 0)


def prompt_mark(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    reply: ModelReply,
    tool_tokens: int | None = None,
) -> PromptMark | None:
    reported = reported_prompt_tokens(reply)
    if reported is None:
        return None
    estimated = max(1, request_tokens(messages, tools, tool_tokens) - WINDOW_MARGIN_TOKENS)
    return PromptMark(reported, len(messages), max(1.0, reported / estimated))


def projected_tokens(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    mark: PromptMark | None,
    tool_tokens: int | None = None,
) -> int:
    """The next request's prompt tokens (MODEL-5): the last reported figure plus what was added
    since, estimated and scaled by how much the estimate under-counted that last call; the
    estimate alone only where no usage was reported (§16: never trust an estimate where usage is
    reported)."""
    if mark is None:
        return request_tokens(messages, tools, tool_tokens)
    if mark.messages > len(messages):  # another prefix (a compaction request): scale the estimate
        return math.ceil(request_tokens(messages, tools, tool_tokens) * mark.ratio)
    added = estimate_tokens(input_text(messages[mark.messages :]))
    return mark.prompt_tokens + math.ceil(added * mark.ratio) + WINDOW_MARGIN_TOKENS


def expected_output_tokens(target_max: int | None, story_text: str = "") -> int:
    """QUAL-4: the reply a unit is expected to need — its targetMax characters in tokens, counted
    in the story's script (`story_text`'s share of CJK among its letters: one token each, other
    text a quarter), plus the reply's envelope; MIN_OUTPUT_TOKENS when there is no targetMax."""
    if target_max is None:
        return MIN_OUTPUT_TOKENS
    letters = len(_LETTER_RE.findall(story_text))  # in C: this runs on every writer call (PERF-2)
    share = min(1.0, cjk_count(story_text) / letters) if letters else 0.0
    return math.ceil(target_max * (share + (1 - share) / 4)) + REPLY_ENVELOPE_TOKENS


def fit_output_tokens(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    max_output_tokens: int,
    window: int | None,
    *,
    prompt_tokens: int | None = None,
    tool_tokens: int | None = None,
    reserve: int = MIN_OUTPUT_TOKENS,
) -> int:
    """`max_tokens` for a request that fits `window`: what remains after the prompt, at most
    `max_output_tokens`. Raises WindowError when less than `reserve` remains (the unit's
    expected output, `expected_output_tokens`, never more than `max_output_tokens`)."""
    if window is None:
        return max_output_tokens
    prompt = (
        prompt_tokens if prompt_tokens is not None else request_tokens(messages, tools, tool_tokens)
    )
    need = max(1, min(reserve, max_output_tokens))
    remaining = window - prompt
    if remaining < need:
        raise WindowError(
            f"the request needs about {prompt:,} prompt tokens; the model's window is "
            f"{window:,} tokens, leaving {max(remaining, 0):,} for the reply (at least "
            f"{need:,} needed: the unit's expected output)"
        )
    return min(max_output_tokens, remaining)
