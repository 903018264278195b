"""The inline author session (DRV-2, AB-2, USE-1, RUN-5) as a pure loop: no bus, no database.

A tiny in-memory host stands in for the store and the claim manager: the read tools answer from
the current snapshot, a commit appends to it. The offline provider writes every unit.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from novelbus.novel.body import CommitBody
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import NovelFile
from novelbus.novel.pack import parse_pack, render_pack
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.writers.compaction import COMPACT_MARKER, SUMMARY_HEADER, offline_summary
from novelbus.writers.inline import (
    BRIEF_HEADER,
    ENV_COMPACT_TOKENS,
    InlineRun,
    compact_threshold,
    estimate_input_tokens,
    gate_tokens,
    run_inline_unit,
    session_preamble,
    unit_brief,
)
from novelbus.writers.offline import OfflineProvider, ScriptedProvider
from novelbus.writers.provider import ChatMessage, ModelReply, ProviderError, ToolCall
from novelbus.writers.runner import run_w2
from novelbus.writers.tools import COMMIT_TOOL, W2_ALLOW_LIST, call_read_tool
from tests.pure.sim import commit, prepare, set_state, snapshot_from_file

MAX_TOKENS = 8_192


class Book:
    """The novel being written: snapshot, the next unit's pack, tools and commit."""

    def __init__(self, nf: NovelFile) -> None:
        self.snapshot = snapshot_from_file(nf)
        self.unit_id = ""

    def next_pack(self) -> str | None:
        decision = next_work(self.snapshot)
        if not isinstance(decision, WriteUnit):
            return None
        self.snapshot, self.unit_id = prepare(self.snapshot, decision)
        self.snapshot = set_state(self.snapshot, self.unit_id, "claimed")
        return render_pack(self.snapshot, self.unit_id, "trimmed").text

    async def read_tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_read_tool(self.snapshot, name, args)

    async def commit(self, args: dict[str, Any]) -> dict[str, Any]:
        args = dict(args)
        unit_id = args.pop("unitId")
        if unit_id != self.unit_id:  # CLM-2: only the delegated unit
            return {"ok": False, "code": "scope-violation"}
        body = msgspec.convert(args, CommitBody)
        self.snapshot = commit(self.snapshot, unit_id, body)
        return {"ok": True, "receipt": {"commitId": self.snapshot.commits[-1].commit_id}}


async def write_inline(
    nf: NovelFile, provider: Any, *, compact_tokens: int = 100_000
) -> tuple[Book, list[InlineRun]]:
    book = Book(nf)
    history: list[ChatMessage] = []
    runs: list[InlineRun] = []
    while (pack := book.next_pack()) is not None:
        run = await run_inline_unit(
            provider,
            history,
            pack,
            allow_list=W2_ALLOW_LIST,
            read_tool=book.read_tool,
            commit=book.commit,
            compact_tokens=compact_tokens,
            max_output_tokens=MAX_TOKENS,
        )
        assert run.outcome.ok, run.outcome
        history = run.history
        runs.append(run)
        assert len(runs) < 100
    return book, runs


def test_brief_is_the_unit_tail_and_the_session_holds_protocol_and_story(
    sample_snapshot_with_prose: NovelSnapshot,
) -> None:
    """DRV-2: The brief carries chapter, scene and unit blocks (not the prose tail, which the session
    wrote itself); the system message carries protocol and story once per session."""
    snap = sample_snapshot_with_prose
    unit_id = next(u.unit_id for u in snap.units if u.state == "claimed")
    pack = render_pack(snap, unit_id, "trimmed")
    assert "prose-tail" in pack.blocks
    brief = unit_brief(pack.text)
    assert brief.startswith(BRIEF_HEADER)
    blocks = parse_pack(brief)
    assert set(blocks) == {"chapter", "scene", "unit"}
    assert blocks["unit"] == parse_pack(pack.text)["unit"]  # the unit block reads exactly as packed
    preamble = session_preamble(pack.text)
    assert set(parse_pack(preamble)) == {"protocol", "story"}
    assert "one long author session" in preamble
    with pytest.raises(ValueError, match=r"\[\[unit\]\]"):
        unit_brief("[[story]]\ntitle: x\n")


async def test_inline_writes_the_sample_with_the_same_prose_as_subagent(
    sample_file: NovelFile,
) -> None:
    """DRV-2: Same writer behaviour in both modes: the offline writer researches by the same rule and
    commits the same bodies, following the LATEST brief of an ever longer history. MODEL-6: it
    reads only what is not already in its context — the session committed the previous unit
    itself, so after the first unit it reads the status only (a fresh W2 writer reads the prose)."""
    provider = OfflineProvider()
    book, runs = await write_inline(sample_file, provider)
    assert len(book.snapshot.commits) == len(sample_file.outline.scenes)
    for i, run in enumerate(runs):
        tools = [r.tool for r in run.outcome.tool_calls]
        assert tools == (["novel_status_read", "novel_body_read", COMMIT_TOOL] if i == 0
                         else ["novel_status_read", COMMIT_TOOL])

    fresh = Book(sample_file)
    while (pack := fresh.next_pack()) is not None:
        outcome = await run_w2(
            provider,
            pack,
            allow_list=W2_ALLOW_LIST,
            read_tool=fresh.read_tool,
            commit=fresh.commit,
            max_output_tokens=MAX_TOKENS,
        )
        assert outcome.ok
    assert [c.paragraphs for c in book.snapshot.commits] == [
        c.paragraphs for c in fresh.snapshot.commits
    ]


async def test_history_grows_and_the_split_adds_up_for_every_call(
    sample_file: NovelFile,
) -> None:
    """AB-2, USE-1: Without compaction every unit re-sends all earlier units: the first call's input grows
    strictly, earlier commits come back as prose echo, and for every call the four-way split
    (history / new tool results / brief or pack / prose echo) adds up to its raw input."""
    _, runs = await write_inline(sample_file, OfflineProvider())
    firsts = [run.outcome.usage[0] for run in runs]
    assert all(b.input_chars > a.input_chars for a, b in zip(firsts, firsts[1:], strict=False))
    assert firsts[0].history_chars == 0 and firsts[0].prose_echo_chars == 0
    assert all(c.history_chars > 0 and c.prose_echo_chars > 0 for c in firsts[1:])
    for run in runs:
        for c in run.outcome.usage:
            split = c.pack_chars + c.tool_result_chars + c.history_chars + c.prose_echo_chars
            assert split == c.input_chars
            assert c.est_input_tokens > 0
        # new tool results arrive in the 2nd and 3rd call of a unit, never in its first
        assert run.outcome.usage[0].tool_result_chars == 0
        assert all(c.tool_result_chars > 0 for c in run.outcome.usage[1:])
    assert all(run.compactions == 0 for run in runs)


async def test_compaction_fires_at_the_threshold_and_the_summary_replaces_history(
    sample_file: NovelFile,
) -> None:
    """AB-2: Past the threshold one compaction call (flagged, input = the whole earlier history)
    replaces the history with a summary; the current unit continues verbatim; never earlier."""
    threshold = 6_000
    book, runs = await write_inline(sample_file, OfflineProvider(), compact_tokens=threshold)
    assert len(book.snapshot.commits) == len(sample_file.outline.scenes)
    compacted = [i for i, run in enumerate(runs) if run.compactions]
    assert compacted, "the history never passed the threshold"
    calls = [c for run in runs for c in run.outcome.usage]
    flags = [bool(getattr(c, "compaction", False)) for c in calls]
    first = flags.index(True)
    # nothing before the first compaction was over the threshold
    assert all(c.est_input_tokens <= threshold for c in calls[:first])
    assert calls[first].est_input_tokens > threshold * 0.5
    assert calls[first + 1].est_input_tokens < calls[first].est_input_tokens
    # the summary replaced history: system, summary, then the current unit only
    after = runs[compacted[0]].history
    assert after[0]["role"] == "system"
    assert after[1]["content"].startswith(SUMMARY_HEADER)
    assert after[2]["content"].startswith(BRIEF_HEADER)
    assert sum(1 for m in after if str(m.get("content") or "").startswith(BRIEF_HEADER)) == 1
    # the writer's output counts prose, not summaries
    for run in runs:
        assert run.outcome.output_chars == sum(
            c.output_chars for c in run.outcome.usage if not getattr(c, "compaction", False)
        )
    # without compaction the same book peaks higher
    _, plain = await write_inline(sample_file, OfflineProvider())
    plain_peak = max(c.est_input_tokens for run in plain for c in run.outcome.usage)
    assert (
        max(c.est_input_tokens for c in calls if not getattr(c, "compaction", False)) < plain_peak
    )


def _commit_call(call_id: str, unit_id: str, text: str) -> ChatMessage:
    args = {"unitId": unit_id, "paragraphs": ["First.", text], "sceneCompletion": {}}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": COMMIT_TOOL, "arguments": json.dumps(args)},
            }
        ],
    }


def test_offline_summary_is_deterministic_and_carries_an_earlier_summary_forward() -> None:
    history: list[ChatMessage] = [
        {"role": "system", "content": "[[protocol]]\n- x"},
        _commit_call("c1", "u1", "The ferry left."),
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'},
        _commit_call("c2", "u2", "Refused prose."),
        {"role": "tool", "tool_call_id": "c2", "content": '{"ok":false,"error":"guard"}'},
        _commit_call("c3", "u2", "The lamp was lit."),
        {"role": "tool", "tool_call_id": "c3", "content": '{"ok":true}'},
    ]
    summary = offline_summary(history)
    assert summary == offline_summary(list(history))
    assert "unitsCommitted: 2" in summary
    assert "recentUnits: u1, u2" in summary
    assert summary.endswith("The lamp was lit.")
    later: list[ChatMessage] = [
        history[0],
        {"role": "user", "content": f"{SUMMARY_HEADER}\n{summary}"},
        _commit_call("c4", "u3", "Morning came."),
        {"role": "tool", "tool_call_id": "c4", "content": '{"ok":true}'},
    ]
    again = offline_summary(later)
    assert "unitsCommitted: 3" in again and "recentUnits: u1, u2, u3" in again
    assert "[[unit]]" not in again.split("\n")


async def test_offline_provider_answers_a_compaction_request_with_its_summary() -> None:
    history: list[ChatMessage] = [
        {"role": "system", "content": "[[protocol]]\n- x"},
        _commit_call("c1", "u1", "The ferry left."),
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'},
        {"role": "user", "content": f"{COMPACT_MARKER}\nsummarise"},
    ]
    reply = await OfflineProvider().complete(history, None, max_output_tokens=100)
    assert reply.text == offline_summary(history)
    assert reply.usage is not None and reply.usage.input_tokens
    assert reply.usage.input_tokens <= estimate_input_tokens(history)


async def test_a_failed_compaction_fails_the_dispatch_with_its_reason(
    sample_file: NovelFile,
) -> None:
    """RUN-4"""
    book = Book(sample_file)
    pack = book.next_pack()
    assert pack is not None
    big: list[ChatMessage] = [
        {"role": "system", "content": session_preamble(pack)},
        {"role": "user", "content": "x" * 4_000},
    ]
    provider = ScriptedProvider([ProviderError("provider-unavailable", "down")])
    run = await run_inline_unit(
        provider,
        big,
        pack,
        allow_list=W2_ALLOW_LIST,
        read_tool=book.read_tool,
        commit=book.commit,
        compact_tokens=500,
        max_output_tokens=MAX_TOKENS,
    )
    assert not run.outcome.ok
    assert run.outcome.reason == "compaction-failed:provider-unavailable"
    assert getattr(run.outcome.usage[0], "compaction", False)
    assert run.history[-1]["content"].startswith(BRIEF_HEADER)  # the attempt stays in history
    assert len(run.history) == 3


async def test_calls_after_the_commit_in_one_reply_are_answered_not_executed(
    sample_file: NovelFile,
) -> None:
    """RUN-3: The history stays valid for a chat server: every tool call id gets a tool message."""
    book = Book(sample_file)
    pack = book.next_pack()
    assert pack is not None
    body = json.loads(
        (
            await OfflineProvider().complete(
                [{"role": "user", "content": pack}], None, max_output_tokens=1
            )
        ).text
        or "{}"
    )
    reply = ModelReply(
        text=None,
        tool_calls=[
            ToolCall(
                id="a", name=COMMIT_TOOL, arguments=json.dumps({"unitId": book.unit_id, **body})
            ),
            ToolCall(id="b", name="novel_status_read", arguments="{}"),
        ],
        stop_reason="tool_calls",
    )
    run = await run_inline_unit(
        ScriptedProvider([reply]),
        [],
        pack,
        allow_list=W2_ALLOW_LIST,
        read_tool=book.read_tool,
        commit=book.commit,
        max_output_tokens=MAX_TOKENS,
    )
    assert run.outcome.ok
    answered = [m["tool_call_id"] for m in run.history if m["role"] == "tool"]
    assert answered == ["a", "b"]
    assert json.loads(run.history[-1]["content"]) == {"error": "not-executed"}
    assert [r.tool for r in run.outcome.tool_calls] == [COMMIT_TOOL]


def test_compaction_threshold_is_configurable_and_bad_values_are_named() -> None:
    """AB-2 / MODEL-5: explicit threshold (argument, env) wins; else 0.7 of the window; else the
    legacy 100k estimated tokens where no window is known."""
    assert compact_threshold(None, env={}) is None
    assert gate_tokens(None, None) == 100_000
    assert gate_tokens(8192, None) == 5734
    assert gate_tokens(2048, None, 0.5) == 1024
    assert gate_tokens(8192, 3000) == 3000
    with pytest.raises(ValueError, match="usageThresholdRatio"):
        gate_tokens(8192, None, 1.5)
    assert compact_threshold(None, env={ENV_COMPACT_TOKENS: "2500"}) == 2_500
    assert compact_threshold(7, env={ENV_COMPACT_TOKENS: "2500"}) == 7
    with pytest.raises(ValueError, match=ENV_COMPACT_TOKENS):
        compact_threshold(None, env={ENV_COMPACT_TOKENS: "lots"})
    with pytest.raises(ValueError, match="> 0"):
        compact_threshold(0)


async def test_a_real_model_writes_the_summary_through_a_model_call(
    sample_file: NovelFile,
) -> None:
    """AB-2: A non-offline provider gets the compaction request as a model call without tools; its
    reply text becomes the summary that replaces the history."""
    book = Book(sample_file)
    pack = book.next_pack()
    assert pack is not None
    old: list[ChatMessage] = [
        {"role": "system", "content": session_preamble(pack)},
        {"role": "user", "content": "an old brief " * 400},
        {"role": "assistant", "content": "an old answer"},
    ]
    draft = json.loads(
        (
            await OfflineProvider().complete(
                [{"role": "user", "content": pack}], None, max_output_tokens=1
            )
        ).text
        or "{}"
    )
    seen: list[tuple[list[ChatMessage], Any]] = []

    def summarise(messages: list[ChatMessage], tools: Any) -> ModelReply:
        seen.append((messages, tools))
        return ModelReply(text="Units so far: one. The lamp is out.", stop_reason="completed")

    commit_reply = ModelReply(
        text=None,
        tool_calls=[
            ToolCall(
                id="k", name=COMMIT_TOOL, arguments=json.dumps({"unitId": book.unit_id, **draft})
            )
        ],
        stop_reason="tool_calls",
    )
    run = await run_inline_unit(
        ScriptedProvider([summarise, commit_reply]),
        old,
        pack,
        allow_list=W2_ALLOW_LIST,
        read_tool=book.read_tool,
        commit=book.commit,
        compact_tokens=800,
        max_output_tokens=MAX_TOKENS,
    )
    assert run.outcome.ok and run.compactions == 1
    messages, tools = seen[0]
    assert tools is None and messages[-1]["content"].startswith(COMPACT_MARKER)
    assert messages[1]["content"].startswith("an old brief")  # it read the whole old history
    assert run.history[1]["content"] == f"{SUMMARY_HEADER}\nUnits so far: one. The lamp is out."
    assert all("an old" not in str(m.get("content")) for m in run.history)


async def test_the_gate_fires_on_reported_prompt_tokens_at_0_7_of_the_window(
    sample_file: NovelFile,
) -> None:
    """MODEL-5 / §16: the same small history compacts when the provider last REPORTED a prompt
    near 0.7 of the window, and does not when only the (small) estimate is known or the reported
    figure is well below it."""
    from novelbus.writers.runner import PromptMark, request_tokens

    book = Book(sample_file)
    pack = book.next_pack()
    assert pack is not None
    old: list[ChatMessage] = [
        {"role": "system", "content": session_preamble(pack)},
        {"role": "user", "content": "an old brief"},
        {"role": "assistant", "content": "an old answer"},
    ]
    draft = json.loads((await OfflineProvider().complete(
        [{"role": "user", "content": pack}], None, max_output_tokens=1)).text or "{}")
    window = 10_000

    class Windowed(ScriptedProvider):
        context_window = window

    def commit_reply() -> ModelReply:
        return ModelReply(text=None, stop_reason="tool_calls", tool_calls=[ToolCall(
            id="k", name=COMMIT_TOOL, arguments=json.dumps({"unitId": book.unit_id, **draft}))])

    summary = ModelReply(text="Units so far: none.", stop_reason="completed")
    results = {}
    for reported in (None, 5_000, 7_100):
        provider = Windowed([summary, commit_reply()] if reported == 7_100 else [commit_reply()])
        mark = None if reported is None else PromptMark(reported, len(old))
        run = await run_inline_unit(provider, [dict(m) for m in old], pack, allow_list=W2_ALLOW_LIST,
                                    read_tool=book.read_tool, commit=lambda a: _ok(), mark=mark,
                                    max_output_tokens=9_000)
        assert run.outcome.ok, run.outcome
        results[reported] = run.compactions
        for messages, tools in provider.calls:
            assert request_tokens(messages, tools) < window
    # threshold 7,000 = 0.7 × 10,000; the projection adds the new brief (a few hundred tokens)
    assert results == {None: 0, 5_000: 0, 7_100: 1}


async def _ok() -> dict[str, Any]:
    return {"ok": True, "receipt": {"commitId": "commit-1"}}


# --- MODEL-3/6: W2's tool-choice policy in the inline session -----------------------------------

POLICY_PACK = ("[[protocol]]\n- prose only\n\n[[story]]\ntitle: T\n\n[[chapter]]\nchapterId: ch1\ntitle: The Lamp\n\n"
               "[[unit]]\nunitId: u-1\ntargetMin: 10\ntargetMax: 500\n")
POLICY_PACK_WITH_PROSE = POLICY_PACK.replace("[[unit]]", "[[prose-tail]]\nThe tide was out.\n\n[[unit]]")


def _forced(name: str) -> dict[str, Any]:
    return {"tool_choice": {"type": "function", "function": {"name": name}}}


async def test_inline_applies_the_w2_policy_without_forced_research() -> None:
    """MODEL-3, AB-2: the inline session follows W2's tool-choice policy — a text answer is
    followed by the forced commit; a model known not to call tools under auto (`auto_declined`,
    learned per process) is forced from its first call, so no text answer is paid for — but it is
    never forced to research: it holds what it wrote, and a forced read would pad the baseline."""
    from tests.writers.test_runner import COMMIT_ARGS, Host, call, text, tools

    host = Host()
    weak = ScriptedProvider([text("I will write about the lamp."), tools(call(COMMIT_TOOL, COMMIT_ARGS, "c1"))])
    first = await run_inline_unit(weak, [], POLICY_PACK, allow_list=W2_ALLOW_LIST, read_tool=host.read_tool,
                                  commit=host.commit, max_output_tokens=1000, unit_id="u-1")
    assert first.outcome.ok and first.outcome.auto_declined
    assert weak.options == [{}, _forced(COMMIT_TOOL)]
    assert [c.forced for c in first.outcome.usage] == [False, True]

    known = ScriptedProvider([tools(call(COMMIT_TOOL, COMMIT_ARGS, "c2"))])
    second = await run_inline_unit(known, first.history, POLICY_PACK_WITH_PROSE, allow_list=W2_ALLOW_LIST,
                                   read_tool=host.read_tool, commit=host.commit, max_output_tokens=1000,
                                   unit_id="u-1", auto_declined=True)
    assert second.outcome.ok and known.options == [_forced(COMMIT_TOOL)] and not second.outcome.auto_declined

    # A model that researches on its own is not stopped, and not forced.
    strong = ScriptedProvider([tools(call("novel_body_read", {"chapterId": "ch1"}, "r3")),
                               tools(call(COMMIT_TOOL, COMMIT_ARGS, "c3"))])
    third = await run_inline_unit(strong, second.history, POLICY_PACK_WITH_PROSE, allow_list=W2_ALLOW_LIST,
                                  read_tool=host.read_tool, commit=host.commit, max_output_tokens=1000,
                                  unit_id="u-1")
    assert third.outcome.ok and strong.options == [{}, {}] and not third.outcome.auto_declined
    assert host.reads == [("novel_body_read", {"chapterId": "ch1"})]
