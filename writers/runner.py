"""Writer run loops (RUN-2..6): a fresh writer per dispatch unless a session is continued.

The writer-runner actor owns NATS, the database and the claim manager; it injects them here as
async callables (`read_tool`, `commit`). These loops decide only what goes to the model, what a
tool call may do, and when a dispatch has succeeded or failed — always with a recorded reason,
never silently degraded (RUN-4).

Every model call is measured as the service built it (USE-1): raw input characters and their
four-way split — pack, new tool results, re-sent history, prose echo — which add up exactly.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import BodyError, parse_draft_lenient
from novelbus.novel.text import estimate_tokens
from novelbus.writers.chat import (
    assistant_message,
    message_chars,
    system_message,
    tool_message,
    user_message,
)
from novelbus.writers.loop import (
    CommitFn,
    ReadTool,
    execute_tool_call,
    reply_output_chars,
    result_text,
)
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderError,
    Usage,
    complete,
    context_window,
    forced_tool_choice,
    measured_tool_tokens,
)
from novelbus.writers.record import record_args, record_tool_name
from novelbus.writers.sessions import SessionStore, closed_history, resume_history
from novelbus.writers.structured import unit_target_max
from novelbus.writers.tool_policy import (
    Research,
    RunState,
    next_choice,
    pack_blocks,
    pinned_parameters,
    research_target,
)
from novelbus.writers.tools import (
    COMMIT_TOOL,
    READ_TOOLS,
    TOOL_REGISTRY,
    openai_tool_definitions,
)

W1_INSTRUCTION = (
    "Write the unit described in [[unit]] now. Reply with one JSON object only, no Markdown "
    'fence: {"paragraphs": [...], "sceneCompletion": {"completed": ..., "basis": ..., '
    '"outstandingGoals": [...], "nextAnchor": ...}, "canonChanges": [...]}.'
)
W2_INSTRUCTION = (
    "Write the unit described in [[unit]] now. Research with the read tools first, then call "
    "novel_body_commit once with the unit id and the prose. The first successful commit ends "
    "the run; do not explain or report progress."
)



class ToolStart(msgspec.Struct, frozen=True):
    """A tool call about to run (RUN-6 `tool.started`): never prose, never a token."""

    seq: int
    tool: str
    args_truncated: str
    refused: bool  # outside the allow-list: it will not run (RUN-3)


ToolStartedFn = Callable[[ToolStart], Awaitable[None]]


class ToolRecord(msgspec.Struct, frozen=True):
    seq: int
    tool: str
    args_truncated: str  # JSON text ≤ 500 chars; paragraphs replaced by their count, never prose
    is_error: bool
    result_bytes: int
    error_code: str | None = None  # "tool-not-allowed", "tool-contract", or the commit's code
    refused: bool = False  # RUN-3 / REL-5: outside the allow-list, refused by the host
    forced: bool = False  # MODEL-3: the host forced this call by name (tool_choice)


class InputSplit(msgspec.Struct, frozen=True):
    """Where one call's raw input characters came from (USE-1); the four add up to the total."""

    pack_chars: int  # the system pack and the run instruction
    tool_result_chars: int  # tool results new since the previous call
    history_chars: int  # this run's earlier assistant and tool messages, re-sent
    prose_echo_chars: int  # commit paragraphs re-sent inside earlier assistant messages

    @property
    def total(self) -> int:
        return self.pack_chars + self.tool_result_chars + self.history_chars + self.prose_echo_chars


class CallUsage(msgspec.Struct, frozen=True):
    """One model call as the service built it (USE-1); provider tokens when reported."""

    input_chars: int  # raw: every message content and tool-call argument character sent
    output_chars: int  # text plus tool-call names and arguments received
    tool_result_chars: int  # new tool results (one part of the split)
    pack_chars: int
    history_chars: int
    prose_echo_chars: int
    est_input_tokens: int  # novel.text.estimate_tokens over the same input
    usage: Usage | None  # None when the provider reports none (USE-2: fail-open)
    forced: bool = False  # MODEL-3: made with a forced tool_choice
    tool_definition_tokens: int = 0  # MODEL-6: estimated tokens of the tool definitions sent

    @property
    def input_split(self) -> InputSplit:
        return InputSplit(
            pack_chars=self.pack_chars,
            tool_result_chars=self.tool_result_chars,
            history_chars=self.history_chars,
            prose_echo_chars=self.prose_echo_chars,
        )


class RunOutcome(msgspec.Struct, frozen=True):
    ok: bool
    reason: str | None  # None when ok; else a RUN-4 failure reason
    draft: CommitBody | None = None  # W1: the draft to commit; W2: the committed body
    receipt: dict[str, Any] | None = None  # W2: the commit receipt from the claim manager
    tool_calls: list[ToolRecord] = []
    usage: list[CallUsage] = []
    output_chars: int = 0  # everything the model produced over the run: text + tool-call arguments
    detail: str | None = None  # a short, prose-free explanation of the failure
    session_continued: bool = False  # RUN-5: this run re-sent a stored session's history
    # MODEL-3: offered tools under auto, the model made no allowed call of its own in this run
    auto_declined: bool = False

    @property
    def dependencies(self) -> list[dict[str, Any]]:
        """The dependency manifest `[{seq, tool, args, isError}]` of RUN-6."""
        return [
            {"seq": r.seq, "tool": r.tool, "args": r.args_truncated, "isError": r.is_error}
            | ({"forced": True} if r.forced else {})
            for r in self.tool_calls
        ]


@dataclass(frozen=True)
class ExecutionPolicy:
    """RUN-5: a writer session to continue, named by id and store together or not at all.

    With a session, a W2 run that revises the same chapter continues the stored conversation
    and a rewrite starts a new one (`writers.sessions.resume_history`); the run's conversation
    is saved back under the same id. Without one, every run is a fresh writer.
    """

    session_id: str | None = None
    session_store: SessionStore | None = None

    def __post_init__(self) -> None:
        if (self.session_id is None) != (self.session_store is None):
            raise ValueError("session_id and session_store must be given together or not at all")

    @property
    def reuses_session(self) -> bool:
        return self.session_id is not None


# --- recording helpers --------------------------------------------------------------------------


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


def forced_commit_tools(
    tools: list[dict[str, Any]], unit_id: str | None, target_max: int | None = None
) -> list[dict[str, Any]]:
    """MODEL-3: the tools of a forced commit call. With the unit known, the commit's parameters
    become the bounded commit schema (`writers.structured.commit_schema`): `unitId` pinned to
    the delegated unit, prose and notes bounded by the unit's range, so a grammar-constrained
    server can neither invent another id nor run past max_tokens."""
    if unit_id is None:
        return tools
    from novelbus.writers.structured import commit_schema

    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function", {})
        if fn.get("name") == COMMIT_TOOL:
            params = commit_schema(unit_id, target_max=target_max)
            tool = {**tool, "function": {**fn, "parameters": params}}
        out.append(tool)
    return out


def forced_tools(
    tools: list[dict[str, Any]],
    name: str | None,
    unit_id: str | None,
    target_max: int | None = None,
    research: Research | None = None,
) -> list[dict[str, Any]]:
    """MODEL-3: the tools sent with a call forced to `name` (None: not forced, `tools` as they
    are): the commit bounded and pinned to the unit (`forced_commit_tools`), a forced read tool's
    parameters pinned to the unit's chapter (`tool_policy.pinned_parameters`)."""
    if name is None:
        return tools
    if name == COMMIT_TOOL:
        return forced_commit_tools(tools, unit_id, target_max)
    if research is None or research.tool != name:
        return tools
    params = pinned_parameters(research)
    return [{**t, "function": {**t["function"], "parameters": params}}
            if t.get("function", {}).get("name") == name else t for t in tools]


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
    names = tuple(t.get("function", {}).get("name", "") if isinstance(t, dict) else "" for t in tools)
    if tools == _registry_definitions(names):
        return _registry_tool_tokens(names)
    return tool_definition_tokens(tools)


async def run_tool_tokens(provider: ModelProvider, tools: list[dict[str, Any]] | None,
                          names: tuple[str, ...] | None = None) -> int:
    """What the tool definitions cost every call of a run, resolved once per run: what the server
    puts in the prompt where the provider measures it (MODEL-5), else the estimate (MODEL-6).
    `names`: `tools` is exactly `openai_tool_definitions(names)`, whose estimate is computed once
    per list of names (PERF-2)."""
    measured = await measured_tool_tokens(provider, tools)
    if measured is not None:
        return measured
    return _registry_tool_tokens(names) if names is not None else tool_definition_tokens(tools)


def _input_text(messages: list[ChatMessage]) -> str:
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        for call in message.get("tool_calls") or ():
            fn = call.get("function", {})
            parts.append(fn.get("name", "") + fn.get("arguments", ""))
    return "".join(parts)


class _Meter:
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
        tool_tokens = tool_definition_tokens(tools) if tool_tokens is None else tool_tokens
        self.calls.append(
            CallUsage(
                input_chars=split.total,
                output_chars=0 if reply is None else reply_output_chars(reply),
                tool_result_chars=split.tool_result_chars,
                pack_chars=split.pack_chars,
                history_chars=split.history_chars,
                prose_echo_chars=split.prose_echo_chars,
                est_input_tokens=estimate_tokens(_input_text(messages)) + tool_tokens,
                usage=None if reply is None else reply.usage,
                forced=forced,
                tool_definition_tokens=tool_tokens,
            )
        )

    @property
    def output_chars(self) -> int:
        return sum(c.output_chars for c in self.calls)


# --- W1 -----------------------------------------------------------------------------------------


W1_REPAIR = (
    "That reply is not a valid draft: {error}. Reply again with the corrected JSON object only."
)


async def run_w1(
    provider: ModelProvider,
    pack_text: str,
    *,
    max_output_tokens: int,
    mechanism: str = "prompt",
    window: int | None = None,
) -> RunOutcome:
    """RUN-2: no tools; the reply must be a commit-schema JSON draft, else the dispatch fails.

    MODEL-2: the draft is requested through `mechanism` (P6's choice: json_schema,
    json_object+schema, json_object or prompt), parsed leniently, validated strictly; an invalid
    draft gets one repair round with the validation error before the dispatch fails.
    """
    from novelbus.writers.structured import draft_schema, response_format

    window = window if window is not None else context_window(provider)
    messages = [system_message(pack_text), user_message(W1_INSTRUCTION)]
    fmt = response_format(mechanism, draft_schema(target_max=unit_target_max(pack_text)))
    meter = _Meter()

    def fail(reason: str, detail: str | None = None) -> RunOutcome:
        return RunOutcome(
            ok=False,
            reason=reason,
            usage=meter.calls,
            output_chars=meter.output_chars,
            detail=detail,
        )

    mark: PromptMark | None = None
    for attempt in (1, 2):
        split = split_input(messages, preamble=2, new_from=2)
        try:
            max_tokens = fit_output_tokens(messages, None, max_output_tokens, window,
                                           prompt_tokens=projected_tokens(messages, None, mark))
        except WindowError as e:
            return fail("window-exceeded", str(e))
        try:
            reply = await complete(provider, messages, None, max_output_tokens=max_tokens,
                                   response_format=fmt)
        except ProviderError as e:
            meter.record(messages, split, None)
            return fail(f"provider-error:{e.code}", e.message)
        meter.record(messages, split, reply)
        mark = prompt_mark(messages, None, reply)
        if reply.stop_reason != "completed":
            return fail(f"stop-reason:{reply.stop_reason}")
        if not (reply.text or "").strip():
            return fail("empty-output")
        try:
            draft = parse_draft_lenient(reply.text or "")
        except BodyError as e:
            if attempt == 2:
                return fail("invalid-draft", str(e))
            messages = [*messages, assistant_message(reply),
                        user_message(W1_REPAIR.format(error=str(e)[:400]))]
            continue
        return RunOutcome(
            ok=True, reason=None, draft=draft, usage=meter.calls, output_chars=meter.output_chars
        )
    raise AssertionError("unreachable")


# --- windows (MODEL-5) --------------------------------------------------------------------------

WINDOW_MARGIN_TOKENS = 64  # chat-template tokens around the messages
MIN_OUTPUT_TOKENS = 32


class WindowError(Exception):
    """A request the provider's window cannot hold: never sent (MODEL-5)."""


def request_tokens(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None, tool_tokens: int | None = None
) -> int:
    """Estimated tokens of one request: every message and the tool definitions (MODEL-6) —
    `tool_tokens` when the provider measured what its server puts in the prompt for them."""
    tools_part = tool_definition_tokens(tools) if tool_tokens is None else tool_tokens
    return estimate_tokens(_input_text(messages)) + tools_part + WINDOW_MARGIN_TOKENS


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
    added = estimate_tokens(_input_text(messages[mark.messages:]))
    return mark.prompt_tokens + math.ceil(added * mark.ratio) + WINDOW_MARGIN_TOKENS


def fit_output_tokens(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    max_output_tokens: int,
    window: int | None,
    *,
    prompt_tokens: int | None = None,
    tool_tokens: int | None = None,
) -> int:
    """`max_tokens` for a request that fits `window`: what remains after the prompt, at most
    `max_output_tokens`. Raises WindowError when not even MIN_OUTPUT_TOKENS remain."""
    if window is None:
        return max_output_tokens
    prompt = (prompt_tokens if prompt_tokens is not None
              else request_tokens(messages, tools, tool_tokens))
    remaining = window - prompt
    if remaining < MIN_OUTPUT_TOKENS:
        raise WindowError(
            f"the request needs about {prompt:,} prompt tokens; the model's window is "
            f"{window:,} tokens, leaving {max(remaining, 0)} for the reply (at least "
            f"{MIN_OUTPUT_TOKENS} needed)")
    return min(max_output_tokens, remaining)


# --- W2 -----------------------------------------------------------------------------------------


async def run_w2(
    provider: ModelProvider,
    pack_text: str,
    *,
    allow_list: Iterable[str],
    read_tool: ReadTool,
    commit: CommitFn,
    max_tool_rounds: int = 8,
    max_output_tokens: int,
    on_tool_started: ToolStartedFn | None = None,
    policy: ExecutionPolicy | None = None,
    chapter_id: str | None = None,
    rewrite: bool = False,
    window: int | None = None,
    unit_id: str | None = None,
    auto_declined: bool = False,
) -> RunOutcome:
    """RUN-3/4: a closed allow-list of read tools plus commit; stop at the first successful commit.

    `read_tool(name, args)` runs a registry read tool against the delegated novel and returns its
    JSON-able result (it may raise ToolContractError). `commit(args)` sends the commit arguments
    to the claim manager and returns `{"ok": bool, "code": str | None, "receipt": dict | None}`
    (plus an optional prose-free `message`). A reply that asks for tools after `max_tool_rounds`
    executed rounds fails with `tool-round-limit`. Any other exception from the injected
    callables is infrastructure trouble and propagates to the actor.

    `on_tool_started` hears of every call before it runs (RUN-6 `tool.started`, in real time).
    With a session `policy` (RUN-5) a revision of the same `chapter_id` continues the stored
    conversation, a `rewrite` starts fresh, and the conversation is saved back at the end.

    MODEL-3 (`writers.tool_policy`): a model that answers in text gets one read tool forced by
    name, then the commit; `auto_declined` (the model is known not to call tools under auto)
    forces the research from the first call, saving a text answer nobody uses.
    """
    history: list[ChatMessage] = []
    session = policy if policy is not None and policy.reuses_session else None
    if session is not None:
        assert session.session_store is not None and session.session_id is not None
        history = await resume_history(
            session.session_store, session.session_id, chapter_id, rewrite=rewrite
        )
    if history:
        # A continued session already opened with a system pack; the new pack comes as the
        # next user turn, so strict chat templates (system first, roles alternating) accept it.
        messages = [*history, user_message(f"{pack_text}\n\n{W2_INSTRUCTION}")]
    else:
        messages = [system_message(pack_text), user_message(W2_INSTRUCTION)]
    outcome = await _w2_loop(
        provider,
        messages,
        pack_from=len(history),
        allowed=tuple(dict.fromkeys(allow_list)),
        read_tool=read_tool,
        commit=commit,
        max_tool_rounds=max_tool_rounds,
        max_output_tokens=max_output_tokens,
        on_tool_started=on_tool_started,
        window=window,
        unit_id=unit_id,
        target_max=unit_target_max(pack_text),
        pack_text=pack_text,
        auto_declined=auto_declined,
    )
    if session is not None:
        assert session.session_store is not None and session.session_id is not None
        await session.session_store.save(session.session_id, chapter_id, closed_history(messages))
    if history:
        outcome = msgspec.structs.replace(outcome, session_continued=True)
    return outcome


async def _w2_loop(
    provider: ModelProvider,
    messages: list[ChatMessage],
    *,
    pack_from: int,
    allowed: tuple[str, ...],
    read_tool: ReadTool,
    commit: CommitFn,
    max_tool_rounds: int,
    max_output_tokens: int,
    on_tool_started: ToolStartedFn | None,
    window: int | None = None,
    unit_id: str | None = None,
    target_max: int | None = None,
    pack_text: str | None = None,
    auto_declined: bool = False,
) -> RunOutcome:
    """One W2 run over `messages`, which it extends with the conversation as it happens."""
    tools = openai_tool_definitions(allowed)
    preamble = len(messages)
    meter = _Meter()
    records: list[ToolRecord] = []
    rounds = 0
    new_from = preamble

    auto_calls = own_calls = 0

    def fail(reason: str, detail: str | None = None) -> RunOutcome:
        return RunOutcome(
            ok=False,
            reason=reason,
            tool_calls=records,
            usage=meter.calls,
            output_chars=meter.output_chars,
            detail=detail,
            auto_declined=auto_calls > 0 and own_calls == 0,
        )

    window = window if window is not None else context_window(provider)
    tool_tokens = await run_tool_tokens(provider, tools, allowed)
    research = research_target(pack_blocks(pack_text), allowed) if pack_text is not None else None
    state = RunState(rounds=0, max_tool_rounds=max_tool_rounds, researched=False,
                     answered_in_text=False, auto_declined=auto_declined)
    mark: PromptMark | None = None
    while True:
        split = split_input(messages, preamble=preamble, new_from=new_from, pack_from=pack_from)
        # MODEL-3: research with the server's default (auto; never sent, since some servers
        # refuse an explicit "auto"); the policy forces one read tool, then the commit, by name
        # when the model answers in text (writers.tool_policy).
        prompt = projected_tokens(messages, tools, mark, tool_tokens)
        state = replace(state, room=None if window is None else window - prompt)
        choice = next_choice(state, allowed, research)
        forced = choice.forced
        try:
            max_tokens = fit_output_tokens(messages, tools, max_output_tokens, window, prompt_tokens=prompt)
        except WindowError as e:
            return fail("window-exceeded", str(e))
        try:
            reply = await complete(
                provider, messages,
                forced_tools(tools, choice.tool, unit_id, target_max, research),
                max_output_tokens=max_tokens,
                tool_choice=forced_tool_choice(choice.tool) if choice.tool is not None else None,
            )
        except ProviderError as e:
            meter.record(messages, split, None, tools=tools, forced=forced, tool_tokens=tool_tokens)
            return fail(f"provider-error:{e.code}", e.message)
        meter.record(messages, split, reply, tools=tools, forced=forced, tool_tokens=tool_tokens)
        mark = prompt_mark(messages, tools, reply, tool_tokens)
        # A reply whose every call is outside the allow-list made no progress: a text answer
        # for the policy (it is still executed below, i.e. refused and recorded, RUN-3).
        usable = [c for c in reply.tool_calls if c.name in allowed]
        state = replace(state, calls=state.calls + 1, last_forced=choice.tool,
                        answered_in_text=not usable)
        if not forced:
            auto_calls += 1
            own_calls += len(usable)
            if not usable:  # declined auto: not offered it again in this run (MODEL-3)
                state = replace(state, auto_declined=True)

        rambled = reply.stop_reason == "length" and not reply.tool_calls and not forced
        if reply.stop_reason not in ("completed", "tool_calls") and not rambled:
            return fail(f"stop-reason:{reply.stop_reason}")
        if not reply.tool_calls:
            if reply.text:
                messages.append(assistant_message(reply))
            if not forced and COMMIT_TOOL in allowed and rounds < max_tool_rounds:
                continue  # MODEL-3: a text answer (also one cut at max_tokens): the policy forces
            if reply.stop_reason != "completed":
                return fail(f"stop-reason:{reply.stop_reason}")
            if not (reply.text or "").strip():
                return fail("empty-output")
            return fail("not-committed", "the writer stopped without a successful commit")
        if rounds >= max_tool_rounds:
            return fail("tool-round-limit", f"more than {max_tool_rounds} tool rounds")
        rounds += 1
        state = replace(state, rounds=rounds)

        messages.append(assistant_message(reply))
        new_from = len(messages)
        for call in reply.tool_calls:
            seq = len(records) + 1
            args_recorded = truncate_args(call.arguments)
            tool_name = record_tool_name(call.name)
            if on_tool_started is not None:
                await on_tool_started(
                    ToolStart(
                        seq=seq,
                        tool=tool_name,
                        args_truncated=args_recorded,
                        refused=call.name not in allowed,
                    )
                )
            result, code, committed = await execute_tool_call(call, allowed, read_tool, commit)
            content = result_text(result)
            records.append(
                ToolRecord(
                    seq=seq,
                    tool=tool_name,
                    args_truncated=args_recorded,
                    is_error=code is not None,
                    result_bytes=len(content.encode()),
                    error_code=code,
                    refused=code == "tool-not-allowed",
                    forced=forced,
                )
            )
            if call.name in READ_TOOLS and code != "tool-not-allowed":
                state = replace(state, researched=True)
            messages.append(tool_message(call.id, content))
            if committed is not None:
                # RUN-3: the first successful commit ends the run; later calls are never executed.
                draft, receipt = committed
                return RunOutcome(
                    ok=True,
                    reason=None,
                    draft=draft,
                    receipt=receipt,
                    tool_calls=records,
                    usage=meter.calls,
                    output_chars=meter.output_chars,
                    auto_declined=auto_calls > 0 and own_calls == 0,
                )
