"""MODEL-3: the W2 tool-choice policy (writers.tool_policy), pure and through the W2 run loop."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from novelbus.writers.offline import ScriptedProvider
from novelbus.writers.provider import ModelReply, ToolCall
from novelbus.writers.runner import run_w2
from novelbus.writers.tool_policy import (
    BODY_READ,
    OUTLINE_READ,
    RESEARCH_ROOM_TOKENS,
    STATUS_READ,
    Research,
    RunState,
    next_choice,
    pack_blocks,
    research_target,
)
from novelbus.writers.tools import COMMIT_TOOL, READ_TOOLS, W2_ALLOW_LIST
from tests.writers.test_runner import COMMIT_ARGS, Host, call, text, tools

ALL = tuple(W2_ALLOW_LIST)
READS = sorted(READ_TOOLS)

allow_lists = st.lists(st.sampled_from([*READS, COMMIT_TOOL]), unique=True).map(tuple)
researches = st.one_of(st.none(), st.builds(Research, st.sampled_from([BODY_READ, OUTLINE_READ, STATUS_READ]),
                                            st.one_of(st.none(), st.just("ch1"))))
states = st.builds(RunState, rounds=st.integers(0, 10), max_tool_rounds=st.integers(1, 10),
                   researched=st.booleans(), answered_in_text=st.booleans(),
                   last_forced=st.one_of(st.none(), st.sampled_from([*READS, COMMIT_TOOL])),
                   auto_declined=st.booleans(), calls=st.integers(0, 10),
                   room=st.one_of(st.none(), st.integers(-100, 4000)))


@given(states, allow_lists, researches)
def test_policy_forces_only_allowed_tools_and_never_research_twice(
        state: RunState, allowed: tuple[str, ...], research: Research | None) -> None:
    """MODEL-3 / RUN-3: a forced tool is always on the allow-list; without the commit tool nothing
    is forced; the last round forces the commit; research is never forced once the run researched."""
    choice = next_choice(state, allowed, research)
    if COMMIT_TOOL not in allowed:
        assert choice.tool is None
        return
    assert choice.tool is None or choice.tool in allowed
    if state.rounds >= state.max_tool_rounds - 1:
        assert choice.tool == COMMIT_TOOL
    if choice.tool is not None and choice.tool != COMMIT_TOOL:
        assert not state.researched and research is not None and choice.tool == research.tool
        assert state.room is None or state.room >= RESEARCH_ROOM_TOKENS  # MODEL-5: it must fit
    if state.answered_in_text:
        assert choice.forced  # a text answer is never answered with auto again


def simulate(allowed: tuple[str, ...], research: Research | None, max_rounds: int, *,
             own_tools: bool, auto_declined: bool = False) -> list[str | None]:
    """Drive the policy with a model that calls tools under auto (`own_tools`: reads once, then
    commits) or never does, and that obeys every forced call; returns each call's choice."""
    state = RunState(rounds=0, max_tool_rounds=max_rounds, researched=False, answered_in_text=False,
                     auto_declined=auto_declined)
    choices: list[str | None] = []
    for _ in range(2 * max_rounds + 2):
        choice = next_choice(state, allowed, research)
        choices.append(choice.tool)
        made = choice.tool or (None if not own_tools else STATUS_READ if not state.researched else COMMIT_TOOL)
        if made == COMMIT_TOOL:
            return choices
        state = RunState(rounds=state.rounds + (made is not None), max_tool_rounds=max_rounds,
                         researched=state.researched or made in READ_TOOLS, answered_in_text=made is None,
                         last_forced=choice.tool, auto_declined=auto_declined, calls=state.calls + 1)
    raise AssertionError(f"the policy never reached a commit: {choices}")


@given(st.integers(3, 10), st.booleans())
def test_a_model_that_never_calls_tools_researches_then_commits(max_rounds: int, known: bool) -> None:
    """MODEL-3: text → one forced read → forced commit; known not to call tools under auto: the
    read is forced from the first call (no text answer to wait for)."""
    research = Research(OUTLINE_READ, "ch1")
    choices = simulate(ALL, research, max_rounds, own_tools=False, auto_declined=known)
    assert choices == ([OUTLINE_READ, COMMIT_TOOL] if known else [None, OUTLINE_READ, COMMIT_TOOL])


@given(st.integers(3, 10))
def test_a_model_that_calls_tools_itself_is_never_forced(max_rounds: int) -> None:
    """MODEL-3"""
    assert simulate(ALL, Research(BODY_READ, "ch1"), max_rounds, own_tools=True) == [None, None]


def test_research_target_is_what_the_unit_needs() -> None:
    """MODEL-3: The chapter's prose when it has some, else the chapter's outline, else the novel's status."""
    with_prose = "[[chapter]]\nchapterId: ch1\ntitle: T\n\n[[prose-tail]]\nShe ran.\n\n[[unit]]\nunitId: u-1\n"
    first = "[[chapter]]\nchapterId: ch1\ntitle: T\n\n[[unit]]\nunitId: u-1\n"
    assert research_target(pack_blocks(with_prose), ALL) == Research(BODY_READ, "ch1")
    assert research_target(pack_blocks(first), ALL) == Research(OUTLINE_READ, "ch1")
    assert research_target(pack_blocks("[[unit]]\nunitId: u-1\n"), ALL) == Research(STATUS_READ, None)
    assert research_target(pack_blocks(with_prose), (STATUS_READ, COMMIT_TOOL)) == Research(STATUS_READ, None)
    assert research_target(pack_blocks(first), (COMMIT_TOOL,)) is None


PACK = ("[[protocol]]\n- prose only\n\n[[chapter]]\nchapterId: ch1\ntitle: The Lamp\n\n"
        "[[unit]]\nunitId: u-1\ntargetMin: 10\ntargetMax: 500\n")


def forced(name: str) -> dict[str, Any]:
    return {"tool_choice": {"type": "function", "function": {"name": name}}}


async def test_a_text_answer_gets_one_forced_read_then_a_forced_commit() -> None:
    """MODEL-3 / RUN-3 / RUN-6: the model answers in text; the runner forces the chapter's
    outline read (parameters pinned to the unit's chapter), runs it through the host's read
    tool, then forces the commit; both forced calls are marked in the manifest and in usage."""
    provider = ScriptedProvider([
        text("I will write about the lamp."),
        tools(call(OUTLINE_READ, {"chapterId": "ch1"}, "r")),
        tools(call(COMMIT_TOOL, COMMIT_ARGS, "c")),
    ])
    host = Host()
    outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert outcome.ok and host.reads == [(OUTLINE_READ, {"chapterId": "ch1"})] and host.commits == [COMMIT_ARGS]
    assert provider.options == [{}, forced(OUTLINE_READ), forced(COMMIT_TOOL)]
    sent = {t["function"]["name"]: t["function"]["parameters"] for t in provider.calls[1][1]}
    assert sent[OUTLINE_READ]["properties"] == {"chapterId": {"type": "string", "enum": ["ch1"]}}
    assert [c.forced for c in outcome.usage] == [False, True, True]
    assert [d.get("forced") for d in outcome.dependencies] == [True, True]
    assert outcome.auto_declined


async def test_known_decliner_is_forced_from_the_first_call_and_a_strong_model_is_not() -> None:
    """MODEL-3"""
    provider = ScriptedProvider([tools(call(OUTLINE_READ, {"chapterId": "ch1"}, "r")),
                                 tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    host = Host()
    outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1", auto_declined=True)
    assert outcome.ok and provider.options == [forced(OUTLINE_READ), forced(COMMIT_TOOL)]
    assert not outcome.auto_declined  # it was never offered auto in this run

    strong = ScriptedProvider([tools(call(BODY_READ, {"chapterId": "ch1"}, "r")),
                               tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    outcome = await run_w2(strong, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert outcome.ok and strong.options == [{}, {}] and not outcome.auto_declined
    assert not any(d.get("forced") for d in outcome.dependencies)


async def test_forced_research_still_meets_the_allow_list() -> None:
    """MODEL-3, RUN-3: a forced call is executed by the same host checks: a call outside the allow-list
    in the forced reply is refused and recorded, never run; a server that ignores the forced
    choice and answers in text again ends the run as not-committed (no loop)."""
    claim = ToolCall(id="x", name="novel_claim_unit", arguments="{}")
    provider = ScriptedProvider([
        text("Let me think."),
        ModelReply(text=None, tool_calls=[claim, call(OUTLINE_READ, {"chapterId": "ch1"}, "r")],
                   stop_reason="tool_calls"),
        tools(call(COMMIT_TOOL, COMMIT_ARGS, "c")),
    ])
    host = Host()
    outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert outcome.ok and [r.tool for r in outcome.tool_calls] == ["novel_claim_unit", OUTLINE_READ, COMMIT_TOOL]
    assert outcome.tool_calls[0].refused and host.reads == [(OUTLINE_READ, {"chapterId": "ch1"})]

    deaf = ScriptedProvider([text("No."), text("Still no.")])
    outcome = await run_w2(deaf, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert not outcome.ok and outcome.reason == "not-committed" and len(deaf.options) == 2
    assert json.dumps(deaf.options[1]).count(OUTLINE_READ) == 1


async def test_a_refused_forced_commit_is_forced_again_not_offered_auto() -> None:
    """MODEL-3: once the model declined `auto` in a run, a commit the claim manager refused is
    followed by another forced commit (no second text answer nobody uses)."""
    provider = ScriptedProvider([
        text("I will write about the lamp."),
        tools(call(OUTLINE_READ, {"chapterId": "ch1"}, "r")),
        tools(call(COMMIT_TOOL, COMMIT_ARGS, "c1")),
        tools(call(COMMIT_TOOL, COMMIT_ARGS, "c2")),
    ])
    host = Host(commit_results=[{"ok": False, "code": "prose-guard"}, {"ok": True, "receipt": {"commitId": "c"}}])
    outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert outcome.ok and len(host.commits) == 2
    assert provider.options == [{}, forced(OUTLINE_READ), forced(COMMIT_TOOL), forced(COMMIT_TOOL)]


async def test_no_forced_research_when_the_window_cannot_hold_it() -> None:
    """MODEL-3 / MODEL-5: with a window that leaves less than RESEARCH_ROOM_TOKENS after the
    prompt, a text answer gets the commit forced straight away (a read result there would make
    the commit request overflow); with a roomy window the same run researches first."""
    answer = "The lamp was cold. " * 100  # ~500 tokens of text nobody asked for
    for window in (None, 8192):  # no window known / a roomy one: research first
        provider = ScriptedProvider([text(answer), tools(call(OUTLINE_READ, {"chapterId": "ch1"}, "r")),
                                     tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
        host = Host()
        outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                               commit=host.commit, max_output_tokens=100, unit_id="u-1", window=window)
        assert outcome.ok and provider.options == [{}, forced(OUTLINE_READ), forced(COMMIT_TOOL)]

    # 2,150: the W2 tool definitions (~1,500 est.) and the text answer leave less than the room
    tight = ScriptedProvider([text(answer), tools(call(COMMIT_TOOL, COMMIT_ARGS, "c"))])
    host = Host()
    outcome = await run_w2(tight, PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                           commit=host.commit, max_output_tokens=100, unit_id="u-1", window=2150)
    assert outcome.ok and tight.options == [{}, forced(COMMIT_TOOL)] and host.reads == []


@given(states, researches, st.integers(-100, RESEARCH_ROOM_TOKENS - 1))
def test_policy_never_forces_research_the_window_cannot_hold(
        state: RunState, research: Research | None, room: int) -> None:
    """MODEL-5: less than RESEARCH_ROOM_TOKENS left → never a forced read (the commit or auto)."""
    from dataclasses import replace

    choice = next_choice(replace(state, room=room), ALL, research)
    assert choice.tool is None or choice.tool == COMMIT_TOOL

