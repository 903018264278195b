"""Writer run loops (RUN-2..6): a fresh writer per dispatch unless a session is continued.

The writer-runner actor owns NATS, the database and the claim manager; it injects them here as
async callables (`read_tool`, `commit`). These loops decide only what goes to the model, what a
tool call may do, and when a dispatch has succeeded or failed — always with a recorded reason,
never silently degraded (RUN-4).

Every model call is measured as the service built it (USE-1): raw input characters and their
four-way split — pack, new tool results, re-sent history, prose echo — which add up exactly.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import BodyError, parse_draft
from novelbus.novel.text import estimate_tokens
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderError,
    ToolCall,
    Usage,
    assistant_message,
    message_chars,
    system_message,
    tool_message,
    user_message,
)
from novelbus.writers.record import record_args, record_tool_name
from novelbus.writers.sessions import SessionStore, closed_history, resume_history
from novelbus.writers.tools import (
    COMMIT_TOOL,
    BodyCommitParams,
    ToolContractError,
    commit_body_from_args,
    openai_tool_definitions,
    parse_tool_arguments,
    validate_tool_args,
)

TOOL_NAME_RECORD_CAP = 64  # a model-invented tool name is recorded, but not at any length
# CTX-8: what the writer is told about its own commit; never hashes or claim ids.
_RECEIPT_FIELDS_FOR_MODEL = (
    "commitId",
    "unitId",
    "effectiveCharacters",
    "totalCharacters",
    "duplicate",
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

ReadTool = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
CommitFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


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

    @property
    def dependencies(self) -> list[dict[str, Any]]:
        """The dependency manifest `[{seq, tool, args, isError}]` of RUN-6."""
        return [
            {"seq": r.seq, "tool": r.tool, "args": r.args_truncated, "isError": r.is_error}
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


def _reply_output_chars(reply: ModelReply) -> int:
    return len(reply.text or "") + sum(len(c.name) + len(c.arguments) for c in reply.tool_calls)


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
        value = json.loads(arguments)
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
        self, messages: list[ChatMessage], split: InputSplit, reply: ModelReply | None
    ) -> None:
        self.calls.append(
            CallUsage(
                input_chars=split.total,
                output_chars=0 if reply is None else _reply_output_chars(reply),
                tool_result_chars=split.tool_result_chars,
                pack_chars=split.pack_chars,
                history_chars=split.history_chars,
                prose_echo_chars=split.prose_echo_chars,
                est_input_tokens=estimate_tokens(_input_text(messages)),
                usage=None if reply is None else reply.usage,
            )
        )

    @property
    def output_chars(self) -> int:
        return sum(c.output_chars for c in self.calls)


# --- W1 -----------------------------------------------------------------------------------------


async def run_w1(provider: ModelProvider, pack_text: str, *, max_output_tokens: int) -> RunOutcome:
    """RUN-2: no tools; the reply must be a commit-schema JSON draft, else the dispatch fails."""
    messages = [system_message(pack_text), user_message(W1_INSTRUCTION)]
    meter = _Meter()
    split = split_input(messages, preamble=2, new_from=2)

    def fail(reason: str, detail: str | None = None) -> RunOutcome:
        return RunOutcome(
            ok=False,
            reason=reason,
            usage=meter.calls,
            output_chars=meter.output_chars,
            detail=detail,
        )

    try:
        reply = await provider.complete(messages, None, max_output_tokens=max_output_tokens)
    except ProviderError as e:
        meter.record(messages, split, None)
        return fail(f"provider-error:{e.code}", e.message)
    meter.record(messages, split, reply)
    if reply.stop_reason != "completed":
        return fail(f"stop-reason:{reply.stop_reason}")
    if not (reply.text or "").strip():
        return fail("empty-output")
    try:
        draft = parse_draft(reply.text or "")
    except BodyError as e:
        return fail("invalid-draft", str(e))
    return RunOutcome(
        ok=True, reason=None, draft=draft, usage=meter.calls, output_chars=meter.output_chars
    )


# --- W2 -----------------------------------------------------------------------------------------


def _result_text(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


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
) -> RunOutcome:
    """One W2 run over `messages`, which it extends with the conversation as it happens."""
    tools = openai_tool_definitions(allowed)
    preamble = len(messages)
    meter = _Meter()
    records: list[ToolRecord] = []
    rounds = 0
    new_from = preamble

    def fail(reason: str, detail: str | None = None) -> RunOutcome:
        return RunOutcome(
            ok=False,
            reason=reason,
            tool_calls=records,
            usage=meter.calls,
            output_chars=meter.output_chars,
            detail=detail,
        )

    while True:
        split = split_input(messages, preamble=preamble, new_from=new_from, pack_from=pack_from)
        try:
            reply = await provider.complete(messages, tools, max_output_tokens=max_output_tokens)
        except ProviderError as e:
            meter.record(messages, split, None)
            return fail(f"provider-error:{e.code}", e.message)
        meter.record(messages, split, reply)

        if reply.stop_reason not in ("completed", "tool_calls"):
            return fail(f"stop-reason:{reply.stop_reason}")
        if not reply.tool_calls:
            if reply.text:
                messages.append(assistant_message(reply))
            if reply.stop_reason != "completed":
                return fail(f"stop-reason:{reply.stop_reason}")
            if not (reply.text or "").strip():
                return fail("empty-output")
            return fail("not-committed", "the writer stopped without a successful commit")
        if rounds >= max_tool_rounds:
            return fail("tool-round-limit", f"more than {max_tool_rounds} tool rounds")
        rounds += 1

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
            result, code, committed = await _execute(call, allowed, read_tool, commit)
            content = _result_text(result)
            records.append(
                ToolRecord(
                    seq=seq,
                    tool=tool_name,
                    args_truncated=args_recorded,
                    is_error=code is not None,
                    result_bytes=len(content.encode()),
                    error_code=code,
                    refused=code == "tool-not-allowed",
                )
            )
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
                )


async def _execute(
    call: ToolCall, allowed: tuple[str, ...], read_tool: ReadTool, commit: CommitFn
) -> tuple[dict[str, Any], str | None, tuple[CommitBody, dict[str, Any]] | None]:
    """Run one tool call: (result for the model, error code or None, committed body+receipt)."""
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
        assert isinstance(params, BodyCommitParams)
        outcome = await commit(args)
        if outcome.get("ok"):
            receipt = outcome.get("receipt") or {}
            seen = {k: receipt[k] for k in _RECEIPT_FIELDS_FOR_MODEL if k in receipt}
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
