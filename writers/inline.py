"""The inline author session (DRV-2, AB-2, RUN-5): the honest baseline bounded writers are measured against.

One persistent session per novel writes every unit. Per unit it receives a compact **brief** (the
W2 instruction, then the unit's `[[chapter]]`, `[[scene]]` and `[[unit]]` blocks of the trimmed
writer pack), researches with the same read tools a W2 writer has, and commits through the same
claim-manager path. Everything it sees and says stays in its history — briefs, tool calls, tool
results, assistant output and commit arguments — and the whole history is re-sent with every call.
The session's system message is the pack's `[[protocol]]` and `[[story]]` blocks, sent once per
session (not once per unit), as a host session has its instructions once.

The prose tail is NOT in the brief: the session wrote that prose itself, so it is already in its
history, and after a compaction the protocol's research step (`novel_body_read`) brings it back.
Leaving it out keeps the baseline as small as an inline session can honestly be, so the
subagent/inline ratio is not flattered by a padded baseline.

Host-style compaction (AB-2): before a call whose estimated input passes the threshold (default
100,000 estimated tokens), one model call summarises the history before the current brief and the
summary REPLACES that history; the current unit's messages stay verbatim. The compaction call is
measured like any other (its input is the whole history), flagged `compaction`. The offline
provider answers it deterministically (`offline_summary`); a real model writes the summary.

Like `writers.runner`, this module does no I/O: the writer-runner actor loads and saves the
history (`store.load_session` / `store.save_session`) and injects `read_tool` and `commit`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import msgspec

from novelbus.novel.pack import parse_pack
from novelbus.novel.quality import refused_code
from novelbus.novel.text import estimate_tokens
from novelbus.writers.chat import (
    assistant_message,
    message_chars,
    system_message,
    tool_message,
    user_message,
)
from novelbus.writers.compaction import COMPACT_INSTRUCTION, SUMMARY_HEADER
from novelbus.writers.loop import (
    CommitFn,
    ReadTool,
    execute_tool_call,
    result_text,
)
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderError,
    complete,
    context_window,
    forced_tool_choice,
)
from novelbus.writers.record import record_tool_name
from novelbus.writers.runner import (
    W2_INSTRUCTION,
    CallUsage,
    InputSplit,
    PromptMark,
    RunOutcome,
    ToolRecord,
    WindowError,
    call_usage,
    executed_call,
    expected_output_tokens,
    fit_output_tokens,
    forced_tools,
    input_text,
    projected_tokens,
    prompt_mark,
    run_tool_tokens,
    split_input,
    truncate_args,
)
from novelbus.writers.structured import unit_target_max
from novelbus.writers.tool_policy import (
    RunState,
    next_choice,
)
from novelbus.writers.tools import COMMIT_TOOL, READ_TOOLS, openai_tool_definitions

DEFAULT_COMPACT_TOKENS = 100_000
ENV_COMPACT_TOKENS = "NOVELBUS_INLINE_COMPACT_TOKENS"
COMPACT_OUTPUT_TOKENS = 4_096

SESSION_BLOCKS = ("protocol", "story")  # the session's system message, once per session
BRIEF_BLOCKS = ("chapter", "scene", "unit")  # each unit's brief (the prose tail is history)

SESSION_INSTRUCTION = (
    "- You are one long author session writing this whole novel unit by unit. Each user message "
    "that starts with [[brief]] is the next unit's work notice; write only the unit of the latest "
    "brief, then wait for the next one."
)
BRIEF_HEADER = "[[brief]]"


def session_id(novel_id: str) -> str:
    """RUN-5: the inline author session is one session per novel."""
    return f"inline-{novel_id}"


DEFAULT_USAGE_THRESHOLD_RATIO = 0.7  # SPEC §16 compaction gate


def gate_tokens(
    window: int | None, compact_tokens: int | None, ratio: float = DEFAULT_USAGE_THRESHOLD_RATIO
) -> int:
    """MODEL-5: the compaction threshold. An explicit threshold wins; else `ratio` of the
    provider's window (§16); else, with no known window, the legacy 100k estimated tokens."""
    if compact_tokens is not None:
        return compact_tokens
    if window is not None:
        if not 0 < ratio <= 1:
            raise ValueError(f"usageThresholdRatio must be in (0, 1], got {ratio}")
        return int(window * ratio)
    return DEFAULT_COMPACT_TOKENS


def compact_threshold(value: int | None = None, env: dict[str, str] | None = None) -> int | None:
    """An explicit compaction threshold in tokens: the argument, else the environment, else None
    (then `gate_tokens` uses the window)."""
    if value is not None:
        if value <= 0:
            raise ValueError(f"inline compaction threshold must be > 0 tokens, got {value}")
        return value
    raw = (os.environ if env is None else env).get(ENV_COMPACT_TOKENS, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{ENV_COMPACT_TOKENS} must be a positive whole number of tokens, got {raw!r}")
    return int(raw)


# --- what the session is told ----------------------------------------------------------------------


def _blocks_text(blocks: dict[str, list[str]], names: Iterable[str]) -> str:
    return "\n\n".join(
        f"[[{name}]]\n" + "\n".join(blocks[name]) for name in names if blocks.get(name)
    )


def session_preamble(pack_text: str) -> str:
    """The system message: the pack's protocol and story blocks, plus what an inline session is."""
    blocks = parse_pack(pack_text)
    protocol = blocks.get("protocol", [])
    blocks = dict(blocks, protocol=[*protocol, SESSION_INSTRUCTION])
    return _blocks_text(blocks, SESSION_BLOCKS) + "\n"


def unit_brief(pack_text: str) -> str:
    """One unit's work notice: the W2 instruction, then the pack's chapter, scene and unit blocks."""
    blocks = parse_pack(pack_text)
    if not blocks.get("unit"):
        raise ValueError("the writer pack has no [[unit]] block; an inline brief needs one")
    # The instruction comes first so the blocks, unit last, read exactly as in the pack.
    return f"{BRIEF_HEADER}\n{W2_INSTRUCTION}\n\n{_blocks_text(blocks, BRIEF_BLOCKS)}\n"


# --- measuring ----------------------------------------------------------------------------------


class InlineCallUsage(CallUsage, frozen=True):
    """A call of the inline session; `compaction` marks a host compaction call."""

    compaction: bool = False


def estimate_input_tokens(messages: Sequence[ChatMessage]) -> int:
    return estimate_tokens(input_text(messages))


def inline_split(messages: list[ChatMessage], brief_at: int, new_from: int) -> InputSplit:
    """USE-1 for a session call: system message and current brief are the brief/pack part; tool
    results since the previous call are new; every other message is re-sent history (commit
    paragraphs in it counted apart as prose echo). The four add up to the raw input."""
    base = split_input(messages, preamble=1, new_from=new_from)
    brief = message_chars(messages[brief_at]) if 0 < brief_at < len(messages) else 0
    return InputSplit(
        pack_chars=base.pack_chars + brief,
        tool_result_chars=base.tool_result_chars,
        history_chars=base.history_chars - brief,
        prose_echo_chars=base.prose_echo_chars,
    )


def _fit_compaction(
    request: list[ChatMessage], window: int | None, mark: PromptMark | None
) -> list[ChatMessage]:
    """Drop the oldest history messages (never the system message or the compaction request)
    until the summary request leaves room for a summary in the window."""
    if window is None:
        return request
    budget = window - MIN_SUMMARY_TOKENS
    while projected_tokens(request, None, mark) > budget and len(request) > 2:
        del request[1]
        mark = None if mark is None else msgspec.structs.replace(mark, messages=len(request) + 1)
    if projected_tokens(request, None, mark) > budget:
        raise WindowError(f"the session's system message alone exceeds the model's window "
                          f"of {window:,} tokens")
    return request


MIN_SUMMARY_TOKENS = 256


def _call_usage(messages: list[ChatMessage], split: InputSplit, reply: ModelReply | None, *,
                compaction: bool, **options: Any) -> InlineCallUsage:
    """`call_usage` of a call of the inline session (`tools`, `forced`, `tool_tokens` as there)."""
    return call_usage(messages, split, reply, kind=InlineCallUsage, compaction=compaction, **options)


# --- compaction ---------------------------------------------------------------------------------


def _compactable(messages: list[ChatMessage], brief_at: int) -> bool:
    """Something before the current brief besides the system message and one earlier summary."""
    earlier = messages[1:brief_at]
    if not earlier:
        return False
    only = earlier[0].get("content") if len(earlier) == 1 else None
    return not (isinstance(only, str) and only.startswith(SUMMARY_HEADER))


# --- the session loop ---------------------------------------------------------------------------


class InlineRun(msgspec.Struct, frozen=True):
    """One unit handled by the session: the run outcome and the history to persist."""

    outcome: RunOutcome
    history: list[ChatMessage]
    compactions: int = 0
    mark: PromptMark | None = None


async def run_inline_unit(
    provider: ModelProvider,
    history: list[ChatMessage],
    pack_text: str,
    *,
    allow_list: Iterable[str],
    read_tool: ReadTool,
    commit: CommitFn,
    compact_tokens: int | None = None,
    max_tool_rounds: int = 8,
    max_output_tokens: int,
    mark: PromptMark | None = None,
    usage_threshold_ratio: float = DEFAULT_USAGE_THRESHOLD_RATIO,
    window: int | None = None,
    unit_id: str | None = None,
    auto_declined: bool = False,
) -> InlineRun:
    """Continue the session with one unit: brief → research → commit, re-sending all history.

    The tool policy is the W2 one (`writers.loop.execute_tool_call`): closed allow-list, refusals
    recorded, the first successful commit ends the unit's turn, `tool-round-limit` after
    `max_tool_rounds` executed rounds. Failures carry a RUN-4 reason; the history is returned
    either way, since a host session keeps a failed attempt too.

    MODEL-3: the tool choice is W2's policy (`writers.tool_policy.next_choice`, with the same
    learned `auto_declined`: a model known not to call tools under auto is forced from its first
    call, a text answer is followed by a forced call) — except that the inline session is never
    forced to research: it holds the prose it wrote and its brief carries the chapter, scene and
    unit blocks, and a forced read would pad the baseline (and, with a small window, leave no room
    for the commit). A model that researches on its own still may.
    """
    allowed = tuple(dict.fromkeys(allow_list))
    tools = openai_tool_definitions(allowed)
    window = window if window is not None else context_window(provider)
    threshold = gate_tokens(window, compact_tokens, usage_threshold_ratio)
    tool_tokens = await run_tool_tokens(provider, tools, allowed)
    target_max = unit_target_max(pack_text)
    reserve = expected_output_tokens(target_max, pack_text)  # QUAL-4: room for the whole unit
    preamble = session_preamble(pack_text)
    messages: list[ChatMessage] = [dict(m) for m in history]
    if not messages or messages[0].get("role") != "system":
        messages.insert(0, system_message(preamble))
    elif messages[0].get("content") != preamble:
        messages[0] = system_message(preamble)  # the story or protocol changed (outline revision)
        mark = None
    messages.append(user_message(unit_brief(pack_text)))
    brief_at = len(messages) - 1
    new_from = len(messages)
    calls: list[CallUsage] = []
    records: list[ToolRecord] = []
    rounds = 0
    compactions = 0

    def done(
        ok: bool, reason: str | None = None, detail: str | None = None, **kw: Any
    ) -> InlineRun:
        outcome = RunOutcome(
            ok=ok,
            reason=reason,
            tool_calls=records,
            usage=calls,
            output_chars=sum(c.output_chars for c in calls if not getattr(c, "compaction", False)),
            detail=detail,
            auto_declined=auto_calls > 0 and own_calls == 0,
            **kw,
        )
        return InlineRun(outcome=outcome, history=messages, compactions=compactions, mark=mark)

    research = None  # never forced in the inline session (see the docstring)
    state = RunState(rounds=0, max_tool_rounds=max_tool_rounds, researched=True,
                     answered_in_text=False, auto_declined=auto_declined)
    auto_calls = own_calls = 0
    refused: list[str] = []  # QUAL-3: content-gate refusals of this run's commits
    while True:
        if (projected_tokens(messages, tools, mark, tool_tokens) > threshold
                and _compactable(messages, brief_at)):
            request = [*messages[:brief_at], user_message(COMPACT_INSTRUCTION)]
            try:
                # The history before the brief may itself be too large: the summary request
                # keeps only what the window holds (oldest messages dropped first).
                request = _fit_compaction(request, window, mark)
                compact_max = fit_output_tokens(request, None, COMPACT_OUTPUT_TOKENS, window,
                                                prompt_tokens=projected_tokens(request, None, mark))
            except WindowError as e:
                return done(False, "window-exceeded", str(e))
            # Measured on what is sent: the fitted request, not the history it was cut from.
            split = inline_split(request, len(request) - 1, len(request))
            try:
                reply = await complete(provider, request, None, max_output_tokens=compact_max)
            except ProviderError as e:
                calls.append(_call_usage(request, split, None, compaction=True))
                return done(False, f"compaction-failed:{e.code}", e.message)
            calls.append(_call_usage(request, split, reply, compaction=True))
            summary = (reply.text or "").strip()
            if not summary:
                return done(False, "compaction-failed:empty-output")
            # The summary replaces the history before the brief; the current unit stays verbatim.
            kept = messages[brief_at:]
            messages = [messages[0], user_message(f"{SUMMARY_HEADER}\n{summary}"), *kept]
            new_from -= brief_at - 2
            brief_at = 2
            compactions += 1
            mark = None  # the history changed: estimate until the next reported figure

        split = inline_split(messages, brief_at, new_from)
        prompt = projected_tokens(messages, tools, mark, tool_tokens)
        state = replace(state, room=None if window is None else window - prompt)  # MODEL-5
        choice = next_choice(state, allowed, research)  # MODEL-3: W2's policy, the same rules
        forced = choice.forced
        try:
            max_tokens = fit_output_tokens(messages, tools, max_output_tokens, window, prompt_tokens=prompt,
                                           reserve=reserve)
        except WindowError as e:
            return done(False, "window-exceeded", str(e))
        try:
            reply = await complete(provider, messages,
                                   forced_tools(tools, choice.tool, unit_id, target_max, research),
                                   max_output_tokens=max_tokens,
                                   tool_choice=forced_tool_choice(choice.tool) if choice.tool is not None else None)
        except ProviderError as e:
            calls.append(_call_usage(messages, split, None, compaction=False, tools=tools,
                                     forced=forced, tool_tokens=tool_tokens))
            return done(False, f"provider-error:{e.code}", e.message)
        calls.append(_call_usage(messages, split, reply, compaction=False, tools=tools,
                                 forced=forced, tool_tokens=tool_tokens))
        mark = prompt_mark(messages, tools, reply, tool_tokens)
        usable = [c for c in reply.tool_calls if c.name in allowed]
        state = replace(state, calls=state.calls + 1, last_forced=choice.tool, answered_in_text=not usable)
        if not forced:
            auto_calls += 1
            own_calls += len(usable)

        rambled = reply.stop_reason == "length" and not reply.tool_calls and not forced
        if reply.stop_reason not in ("completed", "tool_calls") and not rambled:
            return done(False, f"stop-reason:{reply.stop_reason}")
        if not reply.tool_calls:
            messages.append(assistant_message(reply))  # what the author said stays in the session
            if not forced and COMMIT_TOOL in allowed and rounds < max_tool_rounds:
                continue  # MODEL-3: a text answer (also one cut at max_tokens): the policy forces
            if reply.stop_reason != "completed":
                return done(False, f"stop-reason:{reply.stop_reason}")
            if not (reply.text or "").strip():
                return done(False, "empty-output")
            return done(False, "not-committed", "the writer stopped without a successful commit")
        if rounds >= max_tool_rounds:
            return done(False, "tool-round-limit", f"more than {max_tool_rounds} tool rounds")
        rounds += 1
        state = replace(state, rounds=rounds)

        messages.append(assistant_message(reply))
        new_from = len(messages)
        for call in reply.tool_calls:
            result, code, committed = await execute_tool_call(call, allowed, read_tool, commit)
            content = result_text(result)
            records.append(executed_call(len(records) + 1, record_tool_name(call.name),
                                         truncate_args(call.arguments), code, content, forced))
            if call.name in READ_TOOLS and code != "tool-not-allowed":
                state = replace(state, researched=True)
            messages.append(tool_message(call.id, content))
            if committed is not None:
                # RUN-3, as in W2: the first successful commit ends the unit's turn. Later calls
                # of the same reply are not executed, but the history must answer every call id.
                later = reply.tool_calls[reply.tool_calls.index(call) + 1 :]
                for skipped in later:
                    messages.append(
                        tool_message(skipped.id, result_text({"error": "not-executed"}))
                    )
                draft, receipt = committed
                return done(True, draft=draft, receipt=receipt)
            if refused_code(code) is not None:
                refused.append(code or "")
        if len(refused) >= 2:  # QUAL-3: refused again by the content gate: the unit fails its turn
            return done(False, refused[-1], "the commit was refused twice by the content gate")
