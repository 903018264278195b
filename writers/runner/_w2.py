"""The W2 run (RUN-3..6, MODEL-3): read tools, then one commit; the first successful commit ends it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import msgspec

from novelbus.novel.quality import refused_code
from novelbus.writers.chat import assistant_message, system_message, tool_message, user_message
from novelbus.writers.loop import CommitFn, ReadTool, execute_tool_call, result_text
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ProviderError,
    complete,
    context_window,
    forced_tool_choice,
)
from novelbus.writers.record import record_tool_name
from novelbus.writers.runner._metering import Meter, run_tool_tokens, split_input, truncate_args
from novelbus.writers.runner._records import (
    ExecutionPolicy,
    RunOutcome,
    ToolRecord,
    ToolStart,
    ToolStartedFn,
    executed_call,
)
from novelbus.writers.runner._window import (
    PromptMark,
    WindowError,
    expected_output_tokens,
    fit_output_tokens,
    projected_tokens,
    prompt_mark,
)
from novelbus.writers.sessions import closed_history, resume_history
from novelbus.writers.structured import unit_target_max
from novelbus.writers.tool_policy import (
    Research,
    RunState,
    next_choice,
    pack_blocks,
    pinned_parameters,
    research_target,
)
from novelbus.writers.tools import COMMIT_TOOL, READ_TOOLS, openai_tool_definitions

W2_INSTRUCTION = (
    "Write the unit described in [[unit]] now. Research with the read tools first, then call "
    "novel_body_commit once with the unit id and the prose. The first successful commit ends "
    "the run; do not explain or report progress."
)


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
    return [
        {**t, "function": {**t["function"], "parameters": params}}
        if t.get("function", {}).get("name") == name
        else t
        for t in tools
    ]


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
    meter = Meter()
    records: list[ToolRecord] = []
    rounds = 0
    new_from = preamble

    auto_calls = own_calls = 0
    refused: list[str] = []  # QUAL-3: content-gate refusals of this run's commits

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
    reserve = expected_output_tokens(target_max, pack_text or "")  # QUAL-4: any call may commit
    state = RunState(
        rounds=0,
        max_tool_rounds=max_tool_rounds,
        researched=False,
        answered_in_text=False,
        auto_declined=auto_declined,
    )
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
            max_tokens = fit_output_tokens(
                messages, tools, max_output_tokens, window, prompt_tokens=prompt, reserve=reserve
            )
        except WindowError as e:
            return fail("window-exceeded", str(e))
        try:
            reply = await complete(
                provider,
                messages,
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
        state = replace(
            state, calls=state.calls + 1, last_forced=choice.tool, answered_in_text=not usable
        )
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
            records.append(executed_call(seq, tool_name, args_recorded, code, content, forced))
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
            if refused_code(code) is not None:
                refused.append(code or "")
        if len(refused) >= 2:  # QUAL-3: refused again by the content gate: the unit fails its turn
            return fail(refused[-1], "the commit was refused twice by the content gate")
