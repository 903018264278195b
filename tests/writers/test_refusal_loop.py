"""QUAL-3: a refusal teaches the next attempt, and repeated refusals pause the novel as `quality`."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.after_turn import NextUnit, Pause, Retry, after_turn
from novelbus.novel.body import CommitBody
from novelbus.novel.outline import Budgets
from novelbus.novel.quality import QUALITY_CODES, refusal_reason
from novelbus.writers.offline import ScriptedProvider
from novelbus.writers.provider import ModelReply, ToolCall
from novelbus.writers.runner import DraftRefusal, run_w1, run_w2
from novelbus.writers.tools import COMMIT_TOOL, W2_ALLOW_LIST

PACK = "[[protocol]]\n- prose only\n\n[[unit]]\nunitId: u-1\ntargetMin: 10\ntargetMax: 500\n"
JUNK = {"paragraphs": ["...", "..."], "sceneCompletion": {"completed": True, "basis": "done"},
        "canonChanges": []}
GOOD = {"paragraphs": ["The lamp was cold when Wren climbed the last stair.", "Nobody answered."],
        "sceneCompletion": {"completed": True, "basis": "Wren finds the lamp cold"}, "canonChanges": []}
ADVICE = "no-letters: paragraphs[0] has no letter or digit. Write the scene as prose paragraphs."


def text(value: dict[str, Any]) -> ModelReply:
    return ModelReply(text=json.dumps(value), tool_calls=[], usage=None, stop_reason="completed")


class Gate:
    """The claim manager's verdict on a commit as run_w1 hears it: junk (no letters) is refused."""

    def __init__(self) -> None:
        self.seen: list[CommitBody] = []

    async def __call__(self, body: CommitBody) -> DraftRefusal | None:
        self.seen.append(body)
        if any(not any(ch.isalnum() for ch in p) for p in body.paragraphs):
            return DraftRefusal(refusal_reason("no-letters"), ADVICE)
        return None


async def test_a_refused_w1_draft_gets_one_repair_turn_naming_the_check() -> None:
    """QUAL-3: the repair names the check and what to change, and the repaired draft wins."""
    provider = ScriptedProvider([text(JUNK), text(GOOD)])
    gate = Gate()
    outcome = await run_w1(provider, PACK, max_output_tokens=1000, commit=gate)
    assert outcome.ok and outcome.draft is not None
    assert outcome.draft.paragraphs == GOOD["paragraphs"]
    assert len(provider.calls) == 2 and len(gate.seen) == 2
    repair = provider.calls[1][0][-1]
    assert repair["role"] == "user"
    assert "no-letters" in repair["content"] and "Write the scene as prose" in repair["content"]


async def test_a_w1_draft_refused_again_fails_the_run_with_the_check_code() -> None:
    """QUAL-3: one repair turn only; refused again, the run fails with quality:<code>."""
    provider = ScriptedProvider([text(JUNK), text(JUNK), text(GOOD)])
    outcome = await run_w1(provider, PACK, max_output_tokens=1000, commit=Gate())
    assert not outcome.ok
    assert outcome.reason == "quality:no-letters"
    assert len(provider.calls) == 2


async def test_a_passing_w1_draft_is_checked_once_and_not_repaired() -> None:
    """QUAL-3: a draft the verifier accepts ends the run at once."""
    provider = ScriptedProvider([text(GOOD)])
    gate = Gate()
    outcome = await run_w1(provider, PACK, max_output_tokens=1000, commit=gate)
    assert outcome.ok and len(provider.calls) == 1 and len(gate.seen) == 1


async def test_a_refusal_without_a_repair_fails_the_run_at_once() -> None:
    """RUN-4 / HOUSE-6: a draft refused by a body rule (the store's verdict at its commit) fails
    the dispatch with that reason; no repair turn is asked for."""
    provider = ScriptedProvider([text(GOOD), text(GOOD)])
    seen: list[CommitBody] = []

    async def commit(body: CommitBody) -> DraftRefusal | None:
        seen.append(body)
        return DraftRefusal("verify:guard", "paragraph 0 violates prose rule 'heading'", repair=False)

    outcome = await run_w1(provider, PACK, max_output_tokens=1000, commit=commit)
    assert not outcome.ok and outcome.reason == "verify:guard"
    assert len(provider.calls) == 1 and len(seen) == 1


def _commit(call_id: str, body: dict[str, Any]) -> ModelReply:
    args = json.dumps({"unitId": "u-1", **body})
    return ModelReply(text=None, tool_calls=[ToolCall(id=call_id, name=COMMIT_TOOL, arguments=args)],
                      usage=None, stop_reason="tool_calls")


async def test_a_w2_commit_refused_twice_by_the_gate_fails_the_run() -> None:
    """QUAL-3: W2 hears the refusal as the tool result (code and advice); refused again, the
    unit fails its turn with quality:<code>."""
    commits: list[dict[str, Any]] = []

    async def commit(args: dict[str, Any]) -> dict[str, Any]:
        commits.append(args)
        return {"ok": False, "code": "quality:no-letters", "message": ADVICE}

    async def read_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"tool": name}

    provider = ScriptedProvider([_commit("c1", JUNK), _commit("c2", JUNK), _commit("c3", GOOD)])
    outcome = await run_w2(provider, PACK, allow_list=W2_ALLOW_LIST, read_tool=read_tool, commit=commit,
                           max_output_tokens=1000, unit_id="u-1")
    assert not outcome.ok and outcome.reason == "quality:no-letters"
    assert len(commits) == 2
    told = json.loads(provider.calls[1][0][-1]["content"])
    assert told == {"ok": False, "error": "quality:no-letters", "message": ADVICE}


budgets = st.builds(Budgets, stallThresholdTurns=st.integers(1, 8),
                    consecutiveFailureLimit=st.integers(1, 8))


@given(budgets, st.integers(0, 12), st.integers(0, 12), st.sampled_from(QUALITY_CODES))
def test_repeated_refusals_pause_the_novel_as_quality_naming_the_check(
        b: Budgets, stall: int, fails: int, code: str) -> None:
    """QUAL-3: at consecutiveFailureLimit (or the stall threshold) the pause is `quality` and its
    detail names the check; before it, a retry."""
    d = after_turn(unit_id="u-1", claim_id="c-1", ok=False, reason=refusal_reason(code), budgets=b,
                   stall_count=stall, consecutive_failures=fails, external_failures=0)
    if fails >= b.consecutiveFailureLimit or stall >= b.stallThresholdTurns:
        assert isinstance(d, Pause) and d.reason == "quality"
        assert d.detail.startswith(f"{code}:")
    else:
        assert isinstance(d, Retry)
    assert not isinstance(d, NextUnit)


def test_other_failures_still_pause_as_before() -> None:
    """QUAL-3: only the gate's refusals pause as quality."""
    d = after_turn(unit_id="u-1", claim_id="c-1", ok=False, reason="verify:guard", budgets=Budgets(),
                   stall_count=1, consecutive_failures=3, external_failures=0)
    assert isinstance(d, Pause) and d.reason == "recovery-required"
