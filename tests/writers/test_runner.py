"""W1/W2 run loops (RUN-2..5) driven by scripted replies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus.writers.chat import message_chars
from novelbus.writers.offline import ScriptedProvider
from novelbus.writers.provider import ModelReply, ProviderError, ToolCall, Usage
from novelbus.writers.record import ARGS_RECORD_CAP, digest
from novelbus.writers.runner import ExecutionPolicy, RunOutcome, run_w1, run_w2
from novelbus.writers.sessions import MemorySessionStore
from novelbus.writers.tools import COMMIT_TOOL, W2_ALLOW_LIST

PACK = "[[protocol]]\n- prose only\n\n[[unit]]\nunitId: u-1\ntargetMin: 10\ntargetMax: 500\n"
PROSE = ["The lamp was cold when Wren climbed the last stair.", "Nobody answered her call."]
BODY = {
    "paragraphs": PROSE,
    "sceneCompletion": {"completed": True, "basis": "Wren finds the lamp cold"},
    "canonChanges": [
        {"kind": "event", "summary": "the lamp is out", "sources": ["inline#0"]},
    ],
}
COMMIT_ARGS = {"unitId": "u-1", **BODY}


def call(name: str, args: Any, call_id: str | None = None) -> ToolCall:
    text = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=call_id or f"id-{name}-{len(text)}", name=name, arguments=text)


def tools(*calls: ToolCall, usage: Usage | None = None) -> ModelReply:
    return ModelReply(text=None, tool_calls=list(calls), usage=usage, stop_reason="tool_calls")


def text(value: str | None, stop: str = "completed") -> ModelReply:
    return ModelReply(text=value, tool_calls=[], usage=None, stop_reason=stop)  # type: ignore[arg-type]


class Host:
    """The injected I/O of a W2 run: read tools and a scripted claim manager."""

    def __init__(self, commit_results: list[dict[str, Any]] | None = None) -> None:
        self.reads: list[tuple[str, dict[str, Any]]] = []
        self.commits: list[dict[str, Any]] = []
        self.commit_results = commit_results or [{"ok": True, "receipt": {"commitId": "commit-9"}}]

    async def read_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.reads.append((name, args))
        return {"tool": name, "currentChapterId": "ch1", "text": "The tide was out."}

    async def commit(self, args: dict[str, Any]) -> dict[str, Any]:
        self.commits.append(args)
        return self.commit_results[min(len(self.commits), len(self.commit_results)) - 1]


async def w2(provider: ScriptedProvider, host: Host, **kw: Any) -> RunOutcome:
    return await run_w2(
        provider,
        PACK,
        allow_list=kw.pop("allow_list", W2_ALLOW_LIST),
        read_tool=host.read_tool,
        commit=host.commit,
        max_output_tokens=1000,
        **kw,
    )


def tool_results(provider: ScriptedProvider, call_index: int) -> list[dict[str, Any]]:
    messages, _ = provider.calls[call_index]
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


# --- W1 -----------------------------------------------------------------------------------------


async def test_w1_valid_draft_succeeds_without_tools() -> None:
    """RUN-2: no tools offered; the JSON reply is the draft."""
    provider = ScriptedProvider([text(json.dumps(BODY))])
    outcome = await run_w1(provider, PACK, max_output_tokens=1000)
    assert outcome.ok and outcome.reason is None
    assert outcome.draft is not None and outcome.draft.paragraphs == PROSE
    messages, offered = provider.calls[0]
    assert offered is None
    assert [m["role"] for m in messages] == ["system", "user"] and messages[0]["content"] == PACK
    assert outcome.output_chars == len(json.dumps(BODY))
    assert outcome.usage[0].input_chars == sum(message_chars(m) for m in messages)
    assert outcome.usage[0].pack_chars == outcome.usage[0].input_chars


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (text("Here is your scene: the lamp was cold."), "invalid-draft"),
        (text('{"paragraphs": ["x"]}'), "invalid-draft"),
        (text(""), "empty-output"),
        (text(None), "empty-output"),
        (text(json.dumps(BODY), stop="length"), "stop-reason:length"),
        (text(json.dumps(BODY), stop="refused"), "stop-reason:refused"),
        (ProviderError("provider-unavailable", "down"), "provider-error:provider-unavailable"),
    ],
)
async def test_w1_failures_are_recorded_with_their_reason(reply: Any, reason: str) -> None:
    """RUN-4: anything but a completed, valid draft is a failed dispatch, never degraded
    (MODEL-2: an invalid draft only after its one repair round)."""
    outcome = await run_w1(ScriptedProvider([reply, reply]), PACK, max_output_tokens=1000)
    assert not outcome.ok and outcome.reason == reason and outcome.draft is None
    assert len(outcome.usage) == (2 if reason == "invalid-draft" else 1)


# --- W2 -----------------------------------------------------------------------------------------


async def test_w2_research_then_commit() -> None:
    provider = ScriptedProvider(
        [
            tools(call("novel_status_read", {})),
            tools(call("novel_body_read", {"chapterId": "ch1"})),
            tools(call(COMMIT_TOOL, COMMIT_ARGS)),
        ]
    )
    host = Host()
    outcome = await w2(provider, host)
    assert outcome.ok and outcome.receipt == {"commitId": "commit-9"}
    assert outcome.draft is not None and outcome.draft.paragraphs == PROSE
    assert host.reads == [("novel_status_read", {}), ("novel_body_read", {"chapterId": "ch1"})]
    assert host.commits == [COMMIT_ARGS]
    assert [r.tool for r in outcome.tool_calls] == [
        "novel_status_read",
        "novel_body_read",
        COMMIT_TOOL,
    ]
    assert [r.seq for r in outcome.tool_calls] == [1, 2, 3]
    offered = [t["function"]["name"] for t in provider.calls[0][1] or []]
    assert offered == list(W2_ALLOW_LIST)
    assert outcome.dependencies[0] == {
        "seq": 1,
        "tool": "novel_status_read",
        "args": "{}",
        "isError": False,
    }


async def test_w2_tool_outside_the_allow_list_is_refused_and_recorded() -> None:
    """RUN-3 / REL-5 / PROBE P2: the host refuses, whatever the model calls."""
    provider = ScriptedProvider(
        [
            tools(call("claim_unit", {"unitId": "u-2"}), call("memory_read", {"noteId": "n1"})),
            tools(call(COMMIT_TOOL, COMMIT_ARGS)),
        ]
    )
    host = Host()
    allow = [n for n in W2_ALLOW_LIST if n != "memory_read"]
    outcome = await w2(provider, host, allow_list=allow)
    assert outcome.ok
    refused = outcome.tool_calls[:2]
    assert [r.tool for r in refused] == ["claim_unit", "memory_read"]
    assert all(r.refused and r.is_error and r.error_code == "tool-not-allowed" for r in refused)
    assert host.reads == []  # never reached the host's read path
    assert tool_results(provider, 1) == [
        {"error": "tool-not-allowed", "tool": "claim_unit"},
        {"error": "tool-not-allowed", "tool": "memory_read"},
    ]
    assert "memory_read" not in [t["function"]["name"] for t in provider.calls[0][1] or []]


async def test_w2_invalid_arguments_come_back_as_tool_errors() -> None:
    provider = ScriptedProvider(
        [
            tools(
                call("novel_body_read", "{not json", "a"),
                call("novel_body_read", {"chapter": "ch1"}, "b"),
                call(COMMIT_TOOL, {"unitId": "u-1", "paragraphs": PROSE}, "c"),
            ),
            tools(call(COMMIT_TOOL, COMMIT_ARGS)),
        ]
    )
    host = Host()
    outcome = await w2(provider, host)
    assert outcome.ok
    bad = outcome.tool_calls[:3]
    assert all(r.is_error and not r.refused and r.error_code == "tool-contract" for r in bad)
    results = tool_results(provider, 1)
    assert "not valid JSON" in results[0]["message"]
    assert "chapterId" in results[1]["message"]
    assert "sceneCompletion" in results[2]["message"]
    assert host.reads == [] and host.commits == [COMMIT_ARGS]
    assert json.loads(bad[0].args_truncated) == {"invalidJson": len("{not json")}


async def test_w2_failed_commit_is_returned_to_the_model_which_may_try_again() -> None:
    provider = ScriptedProvider(
        [
            tools(call(COMMIT_TOOL, {**COMMIT_ARGS, "unitId": "u-2"}, "first")),
            tools(call(COMMIT_TOOL, COMMIT_ARGS, "second")),
        ]
    )
    host = Host(
        [
            {"ok": False, "code": "scope-violation", "message": "unit u-2 is not delegated"},
            {"ok": True, "receipt": {"commitId": "commit-3", "bodyHash": "ab" * 32}},
        ]
    )
    outcome = await w2(provider, host)
    assert outcome.ok and len(host.commits) == 2
    first, second = outcome.tool_calls
    assert first.is_error and first.error_code == "scope-violation" and not first.refused
    assert not second.is_error
    assert tool_results(provider, 1) == [
        {"ok": False, "error": "scope-violation", "message": "unit u-2 is not delegated"}
    ]
    assert outcome.receipt == {"commitId": "commit-3", "bodyHash": "ab" * 32}


async def test_w2_stops_at_the_first_successful_commit() -> None:
    """RUN-3: later calls in the same reply are never executed; the model is not called again."""
    provider = ScriptedProvider(
        [
            tools(
                call(COMMIT_TOOL, COMMIT_ARGS, "one"),
                call(COMMIT_TOOL, {**COMMIT_ARGS, "paragraphs": ["Again."]}, "two"),
                call("novel_status_read", {}, "three"),
            ),
            tools(call(COMMIT_TOOL, COMMIT_ARGS, "never")),
        ]
    )
    host = Host()
    outcome = await w2(provider, host)
    assert outcome.ok
    assert host.commits == [COMMIT_ARGS] and host.reads == []
    assert [r.seq for r in outcome.tool_calls] == [1]
    assert len(provider.calls) == 1


@pytest.mark.parametrize(
    ("replies", "reason"),
    [
        # MODEL-3: a text answer gets one forced commit call; text again ends the run.
        ([text(""), text("")], "empty-output"),
        ([text(None), text(None)], "empty-output"),
        ([text("I would rather not write today."), text("No.")], "not-committed"),
        ([tools(call("novel_status_read", {})), text("Done!"), text("Done.")], "not-committed"),
        # A text answer cut at max_tokens is a text answer: forced; cut again, the run fails.
        ([text("partial", stop="length"), text("again", stop="length")], "stop-reason:length"),
        ([tools(call("novel_status_read", {})), text(None, stop="error")], "stop-reason:error"),
        (
            [
                ModelReply(
                    text=None,
                    tool_calls=[call(COMMIT_TOOL, COMMIT_ARGS)],
                    stop_reason="length",
                )
            ],
            "stop-reason:length",
        ),
        (
            [ProviderError("provider-rate-limited", "slow down")],
            "provider-error:provider-rate-limited",
        ),
    ],
)
async def test_w2_failures_are_recorded_with_their_reason(replies: list, reason: str) -> None:
    """RUN-4."""
    host = Host()
    outcome = await w2(ScriptedProvider(replies), host)
    assert not outcome.ok and outcome.reason == reason
    assert host.commits == [] and outcome.receipt is None
    assert len(outcome.usage) == len(replies)


async def test_w2_tool_round_limit() -> None:
    provider = ScriptedProvider([tools(call("novel_status_read", {}, f"r{i}")) for i in range(10)])
    host = Host()
    outcome = await w2(provider, host, max_tool_rounds=3)
    assert not outcome.ok and outcome.reason == "tool-round-limit"
    assert len(host.reads) == 3 and len(outcome.tool_calls) == 3
    assert len(provider.calls) == 4


async def test_w2_input_split_adds_up_to_the_raw_input_of_every_call() -> None:
    """USE-1: pack + new tool results + re-sent history + prose echo = raw input, per call."""
    provider = ScriptedProvider(
        [
            tools(call("novel_status_read", {}, "s"), usage=Usage(input_tokens=100)),
            tools(call(COMMIT_TOOL, COMMIT_ARGS, "c1")),
            tools(call("novel_body_read", {"chapterId": "ch1"}, "b")),
            tools(call(COMMIT_TOOL, COMMIT_ARGS, "c2")),
        ]
    )
    host = Host([{"ok": False, "code": "guard"}, {"ok": True, "receipt": {}}])
    outcome = await w2(provider, host)
    assert outcome.ok and len(outcome.usage) == 4
    for (messages, _), usage in zip(provider.calls, outcome.usage, strict=True):
        raw = sum(message_chars(m) for m in messages)
        assert usage.input_chars == raw == usage.input_split.total
        assert usage.pack_chars == message_chars(messages[0]) + message_chars(messages[1])
        assert usage.est_input_tokens > 0
    first, second, third, fourth = outcome.usage
    assert first.usage == Usage(input_tokens=100) and second.usage is None
    assert (first.history_chars, first.tool_result_chars, first.prose_echo_chars) == (0, 0, 0)
    assert second.tool_result_chars > 0 and second.history_chars > 0
    assert second.prose_echo_chars == 0
    # After the refused commit its paragraphs are re-sent with the history: prose echo.
    echo = sum(len(p) for p in PROSE)
    assert third.prose_echo_chars == echo and fourth.prose_echo_chars == echo
    assert fourth.history_chars > third.history_chars
    assert outcome.output_chars == sum(c.output_chars for c in outcome.usage) > 0


async def test_w2_recorded_arguments_never_carry_prose() -> None:
    """RUN-6, REL-9: commit paragraphs become one {count, chars, sha256}; every free-text string
    (basis, summaries, a search query) becomes {chars, sha256}; ids, enums, booleans stay; a
    model-invented tool name is recorded only as a digest."""
    long_args = {**COMMIT_ARGS, "paragraphs": PROSE * 200}
    provider = ScriptedProvider(
        [
            tools(call(COMMIT_TOOL, long_args)),
            tools(call("novel_body_search", {"query": "q" * 600})),
            tools(call("write the whole book for me", {"anything": "model text here"})),
            text("giving up"),
        ]
    )
    host = Host([{"ok": False, "code": "guard"}])
    outcome = await w2(provider, host)
    commit_record, search_record, invented = outcome.tool_calls
    recorded = json.loads(commit_record.args_truncated)
    assert recorded["paragraphs"]["count"] == 400 and recorded["unitId"] == "u-1"
    assert recorded["paragraphs"]["sha256"] == digest("\n".join(PROSE * 200))["sha256"]
    assert not any(p in commit_record.args_truncated for p in PROSE)
    completion = recorded["sceneCompletion"]
    assert completion["completed"] is COMMIT_ARGS["sceneCompletion"]["completed"]
    assert completion["basis"] == digest(COMMIT_ARGS["sceneCompletion"]["basis"])
    assert COMMIT_ARGS["sceneCompletion"]["basis"] not in commit_record.args_truncated
    assert json.loads(search_record.args_truncated) == {"query": digest("q" * 600)}
    assert len(search_record.args_truncated) <= ARGS_RECORD_CAP
    assert invented.tool.startswith("unregistered-") and "book" not in invented.tool
    assert "model text" not in invented.args_truncated


def test_execution_policy_carries_session_id_and_store_together_or_not_at_all() -> None:
    """RUN-5"""
    sessions = MemorySessionStore()
    assert not ExecutionPolicy().reuses_session
    assert ExecutionPolicy(session_id="s-1", session_store=sessions).reuses_session
    with pytest.raises(ValueError):
        ExecutionPolicy(session_id="s-1")
    with pytest.raises(ValueError):
        ExecutionPolicy(session_store=sessions)


async def test_w1_repair_round_sends_the_validation_error_then_accepts_the_fix() -> None:
    """MODEL-2: one repair round with the validation errors; the second reply is the draft."""
    provider = ScriptedProvider([text('{"paragraphs": ["x"]}'), text(json.dumps(BODY))])
    outcome = await run_w1(provider, PACK, max_output_tokens=1000, mechanism="json_object+schema")
    assert outcome.ok and outcome.draft is not None and outcome.draft.paragraphs == PROSE
    assert len(outcome.usage) == 2
    repair, _ = provider.calls[1]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert "sceneCompletion" in repair[-1]["content"]  # the validation error names the field
    fmt = provider.options[0]["response_format"]
    assert fmt["type"] == "json_object" and fmt["schema"]["required"] == [
        "paragraphs", "sceneCompletion", "canonChanges"]
    assert fmt["schema"]["properties"]["paragraphs"]["items"]["minLength"] == 1


async def test_raw_control_characters_inside_strings_are_parsed_leniently() -> None:
    """MODEL-2: a grammar-constrained reply may hold a raw control character inside a string;
    it is parsed leniently, then validated strictly."""
    broken = json.dumps(BODY).replace(PROSE[0], PROSE[0] + "\t\u0001end", 1)
    broken = broken.replace("\\t\\u0001", "\t\x01")
    assert "\x01" in broken and "\t" in broken
    outcome = await run_w1(ScriptedProvider([text(broken)]), PACK, max_output_tokens=1000)
    assert outcome.ok and outcome.draft is not None
    assert outcome.draft.paragraphs[0] == PROSE[0] + "\t\x01end"
    assert len(outcome.usage) == 1  # no repair round was needed


# --- MODEL-3: tool-choice policy --------------------------------------------------------------


FORCED = {"type": "function", "function": {"name": COMMIT_TOOL}}


async def test_a_text_answer_gets_a_forced_commit_recorded_as_forced() -> None:
    """MODEL-3: research with the server's default; after a text answer the commit is forced by
    name, and the forced call is marked in the manifest and in usage."""
    provider = ScriptedProvider([
        tools(call("novel_status_read", {}, "s")),
        text("The lamp was cold, I think I will write about it."),
        tools(call(COMMIT_TOOL, COMMIT_ARGS, "c")),
    ])
    host = Host()
    outcome = await w2(provider, host)
    assert outcome.ok and host.commits == [COMMIT_ARGS]
    assert provider.options[0] == {} and provider.options[1] == {}  # auto: never sent
    assert provider.options[2] == {"tool_choice": FORCED}
    assert [c.forced for c in outcome.usage] == [False, False, True]
    assert outcome.dependencies[-1] == {"seq": 2, "tool": COMMIT_TOOL,
                                        "args": outcome.tool_calls[-1].args_truncated,
                                        "isError": False, "forced": True}
    assert "forced" not in outcome.dependencies[0]


async def test_the_last_allowed_round_forces_the_commit() -> None:
    """MODEL-3"""
    provider = ScriptedProvider([tools(call("novel_status_read", {}, f"r{i}")) for i in range(2)]
                                + [tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    outcome = await w2(provider, Host(), max_tool_rounds=3)
    assert outcome.ok
    assert [o.get("tool_choice") for o in provider.options] == [None, None, FORCED]


async def test_max_tokens_fit_the_window_and_an_impossible_fit_is_never_sent() -> None:
    """MODEL-5: max_tokens is what the window leaves; a request the window cannot hold fails
    with window-exceeded before any model call."""
    from novelbus.writers.runner import request_tokens

    class Windowed(ScriptedProvider):
        context_window = 4096

    provider = Windowed([tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    seen: list[int] = []
    inner = provider.complete

    async def spy(messages: Any, tools_: Any, *, max_output_tokens: int, **o: Any) -> ModelReply:
        seen.append(max_output_tokens)
        return await inner(messages, tools_, max_output_tokens=max_output_tokens, **o)

    provider.complete = spy  # type: ignore[method-assign]
    outcome = await w2(provider, Host())
    assert outcome.ok
    messages, offered = provider.calls[0]
    assert seen == [min(1000, 4096 - request_tokens(messages, offered))]
    assert request_tokens(messages, offered) + seen[0] <= 4096

    class Tiny(ScriptedProvider):
        context_window = 600  # the ten tool definitions alone need more

    tiny = Tiny([])
    refused = await w2(tiny, Host())
    assert not refused.ok and refused.reason == "window-exceeded" and tiny.calls == []
    assert "600" in (refused.detail or "")
