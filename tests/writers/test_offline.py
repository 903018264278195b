"""The offline writer (RUN-1): deterministic, guard-clean, in range, and it follows W1/W2."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import check_body, parse_draft, rewrite_sources
from novelbus.novel.guard import guard_prose
from novelbus.novel.length import book_band
from novelbus.novel.next_work import Blocked, Finish, WriteUnit, next_work
from novelbus.novel.pack import block_fields, parse_pack, render_pack
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import effective_characters, is_cjk
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.factory import make_provider
from novelbus.writers.offline import OFFLINE_LABEL, OfflineProvider, UnitBrief, compose_draft
from novelbus.writers.provider import ModelReply
from novelbus.writers.runner import run_w1, run_w2
from novelbus.writers.tools import W2_ALLOW_LIST, call_read_tool, openai_tool_definitions
from tests.writers.conftest import snapshot_of

MAX_TOKENS = 8192


def target_range(pack_text: str) -> tuple[int, int]:
    unit = block_fields(parse_pack(pack_text)["unit"])
    return int(unit["targetMin"]), int(unit["targetMax"])


def check_prose(paragraphs: list[str], pack_text: str) -> None:
    lo, hi = target_range(pack_text)
    total = sum(effective_characters(p) for p in paragraphs)
    assert lo <= total <= hi
    assert 3 <= len(paragraphs) <= 8
    assert all(p.strip() and "\n" not in p for p in paragraphs)
    guard_prose(paragraphs)


def fake_commit(receipts: list[dict[str, Any]]):
    async def commit(args: dict[str, Any]) -> dict[str, Any]:
        receipts.append(args)
        return {"ok": True, "receipt": {"commitId": f"commit-{len(receipts)}"}}

    return commit


def read_tool_for(snapshot: NovelSnapshot):
    async def read_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_read_tool(snapshot, name, args)

    return read_tool


def test_offline_provider_is_labelled_offline() -> None:
    provider = make_provider("offline")
    assert isinstance(provider, OfflineProvider)
    assert provider.label == OFFLINE_LABEL == "offline (no language model)"
    assert provider.name == "offline"


async def test_w1_offline_draft_is_deterministic_in_range_and_guard_clean(
    sample_snapshot: NovelSnapshot,
) -> None:
    """RUN-1/RUN-2: same pack → same bytes; the draft is a valid commit body."""
    pack = render_pack(sample_snapshot, "u-1", "full")
    provider = OfflineProvider()
    messages = [system_message(pack.text), user_message("write")]
    first = await provider.complete(messages, None, max_output_tokens=MAX_TOKENS)
    second = await OfflineProvider().complete(messages, None, max_output_tokens=MAX_TOKENS)
    assert first.text == second.text and first.text
    assert first.stop_reason == "completed" and not first.tool_calls
    draft = parse_draft(first.text)
    check_prose(draft.paragraphs, pack.text)
    assert draft.scene_completion.basis
    assert draft.canon_changes[0].sources == ["inline#0"]
    assert draft.canon_changes[0].character_ids == [
        sample_snapshot.outline.scenes[0].participants[0]
    ]

    outcome = await run_w1(provider, pack.text, max_output_tokens=MAX_TOKENS)
    assert outcome.ok and outcome.draft == draft


async def test_w1_offline_draft_for_every_scene_of_the_sample(sample_file) -> None:
    """Every scene of the sample yields an in-range, guard-clean draft that differs per scene."""

    seen: set[str] = set()
    for i, scene in enumerate(sample_file.outline.scenes):
        unit = UnitView(
            unit_id=f"u-{i + 1}",
            chapter_id=scene.chapterId,
            scene_id=scene.sceneId,
            fragment=1,
            state="claimed",
            attempt=1,
        )
        snap = snapshot_of(sample_file, units=[unit])
        pack = render_pack(snap, unit.unit_id, "full")
        draft = compose_draft(pack.text)
        check_prose(draft["paragraphs"], pack.text)
        seen.add(draft["paragraphs"][1])
    assert len(seen) == len(sample_file.outline.scenes)


async def test_w1_offline_writes_chinese_for_a_chinese_pack(chinese_file) -> None:

    snap = snapshot_of(chinese_file)
    pack = render_pack(snap, "u-1", "full")
    outcome = await run_w1(OfflineProvider(), pack.text, max_output_tokens=MAX_TOKENS)
    assert outcome.ok, outcome
    assert outcome.draft is not None
    paragraphs = outcome.draft.paragraphs
    check_prose(paragraphs, pack.text)
    text = "".join(paragraphs)
    letters = [ch for ch in text if effective_characters(ch)]
    assert sum(is_cjk(ch) for ch in letters) / len(letters) > 0.9
    assert "林雾" in text


def hand_pack(goal: str, lo: int, hi: int, participants: str = "Mara (mara), Ivo (ivo)") -> str:
    return (
        "[[protocol]]\n- prose only\n\n"
        f"[[scene]]\ngoal: {goal}\nparticipants: {participants}\n"
        "timeLocation: the harbour at night\nconflict: the tide is turning\n"
        "expectedChange: they trust each other\n\n"
        f"[[unit]]\nunitId: u-9\nfragment: 1\ntargetMin: {lo}\ntargetMax: {hi}\nstage: early\n"
    )


@pytest.mark.parametrize(
    ("lo", "hi"), [(120, 220), (300, 420), (700, 1300), (2000, 2200), (5000, 6000), (18000, 22000)]
)
@pytest.mark.parametrize(
    "goal", ["Mara finds the hidden map", "林雾在灯塔里发现日志被撕掉了一页"], ids=["en", "zh"]
)
def test_offline_prose_lands_inside_the_target_range(goal: str, lo: int, hi: int) -> None:
    draft = compose_draft(hand_pack(goal, lo, hi))
    total = sum(effective_characters(p) for p in draft["paragraphs"])
    assert lo <= total <= hi
    assert abs(total - (lo + hi) // 2) <= (hi - lo) // 2
    assert 3 <= len(draft["paragraphs"]) <= 8
    guard_prose(draft["paragraphs"])


@pytest.mark.parametrize(
    "goal",
    [
        "Reveal in chapter 3 what ch-001 hid",
        "## Mara opens scene 2-1 and unit-7",
        "第三章 林雾回到灯塔 未完待续",
        "THE END of the harbour war (to be continued)",
    ],
)
def test_offline_prose_never_carries_bookkeeping_from_the_outline(goal: str) -> None:
    """SPEC §16 guard: outline phrases with ids, headings or closing notes are cleaned."""
    draft = compose_draft(hand_pack(goal, 600, 900))
    guard_prose(draft["paragraphs"])
    assert 600 <= sum(effective_characters(p) for p in draft["paragraphs"]) <= 900


def test_offline_seed_depends_on_scene_and_unit_blocks_only() -> None:
    pack = hand_pack("Mara finds the hidden map", 600, 900)
    other_prefix = pack.replace("- prose only", "- something else entirely")
    assert compose_draft(pack) == compose_draft(other_prefix)
    assert compose_draft(pack) != compose_draft(pack.replace("unitId: u-9", "unitId: u-10"))
    assert UnitBrief.from_pack(pack).participants == (("Mara", "mara"), ("Ivo", "ivo"))


async def test_w2_offline_researches_then_commits(
    sample_snapshot_with_prose: NovelSnapshot,
) -> None:
    """RUN-3: research before narration (≥ 1 read tool), then exactly one commit."""
    snap = sample_snapshot_with_prose
    pack = render_pack(snap, "u-2", "trimmed")
    commits: list[dict[str, Any]] = []
    outcome = await run_w2(
        OfflineProvider(),
        pack.text,
        allow_list=W2_ALLOW_LIST,
        read_tool=read_tool_for(snap),
        commit=fake_commit(commits),
        max_output_tokens=MAX_TOKENS,
    )
    assert outcome.ok, outcome
    tools = [r.tool for r in outcome.tool_calls]
    assert tools == ["novel_status_read", "novel_body_read", "novel_body_commit"]
    assert not any(r.is_error for r in outcome.tool_calls)
    # it reads the scene it continues (the last commit's), a read that stays bounded
    assert json.loads(outcome.tool_calls[1].args_truncated) == {"chapterId": "ch1", "sceneId": "cold-lamp"}
    assert len(commits) == 1 and commits[0]["unitId"] == "u-2"
    check_prose(commits[0]["paragraphs"], pack.text)
    assert outcome.draft is not None and outcome.draft.paragraphs == commits[0]["paragraphs"]
    assert outcome.receipt == {"commitId": "commit-1"}
    # The second call re-sent the first round as history; the third echoed no prose yet.
    assert outcome.usage[1].history_chars > 0 and outcome.usage[1].tool_result_chars > 0
    assert all(c.prose_echo_chars == 0 for c in outcome.usage)
    assert all(c.usage is not None and c.usage.cached_tokens is None for c in outcome.usage)

    again: list[dict[str, Any]] = []
    await run_w2(
        OfflineProvider(),
        pack.text,
        allow_list=W2_ALLOW_LIST,
        read_tool=read_tool_for(snap),
        commit=fake_commit(again),
        max_output_tokens=MAX_TOKENS,
    )
    assert json.dumps(again) == json.dumps(commits)


async def test_w2_offline_retries_a_refused_commit_once_then_stops(
    sample_snapshot: NovelSnapshot,
) -> None:
    pack = render_pack(sample_snapshot, "u-1", "trimmed")
    attempts: list[dict[str, Any]] = []

    async def refuse(args: dict[str, Any]) -> dict[str, Any]:
        attempts.append(args)
        return {"ok": False, "code": "scope-violation"}

    outcome = await run_w2(
        OfflineProvider(),
        pack.text,
        allow_list=W2_ALLOW_LIST,
        read_tool=read_tool_for(sample_snapshot),
        commit=refuse,
        max_output_tokens=MAX_TOKENS,
    )
    assert not outcome.ok and outcome.reason == "not-committed"
    assert len(attempts) == 2
    # The refused commit's paragraphs came back to the model as prose echo.
    assert outcome.usage[-1].prose_echo_chars > 0


async def test_w2_offline_after_success_answers_with_a_short_final_text(
    sample_snapshot: NovelSnapshot,
) -> None:
    pack = render_pack(sample_snapshot, "u-1", "trimmed")
    messages = [
        system_message(pack.text),
        user_message("write"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "novel_body_commit", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'},
    ]

    reply = await OfflineProvider().complete(
        messages, openai_tool_definitions(W2_ALLOW_LIST), max_output_tokens=MAX_TOKENS
    )
    assert reply == ModelReply(
        text="Committed.", tool_calls=[], usage=reply.usage, stop_reason="completed"
    )


async def test_offline_usage_can_be_switched_off_for_the_fail_open_path(
    sample_snapshot: NovelSnapshot,
) -> None:
    """USE-2: missing provider usage lowers precision, never blocks the run."""
    pack = render_pack(sample_snapshot, "u-1", "full")
    on = await run_w1(OfflineProvider(), pack.text, max_output_tokens=MAX_TOKENS)
    off = await run_w1(OfflineProvider(report_usage=False), pack.text, max_output_tokens=MAX_TOKENS)
    assert on.ok and off.ok and on.draft == off.draft
    assert off.usage[0].usage is None
    usage = on.usage[0].usage
    assert usage is not None and usage.input_tokens and usage.output_tokens
    assert usage.cached_tokens is None and usage.cache_write_tokens is None


@pytest.mark.parametrize("shape", ["W1", "W2"])
async def test_offline_writes_the_whole_sample_novel_inside_the_book_band(
    sample_file, shape: str
) -> None:
    """Pure simulation of the pipeline: next_work → pack → offline writer → commit checks.

    Every unit passes the store's body checks and guard, and the finished book lands in the
    length band, so the offline writer can drive demos and benchmarks end to end.
    """
    units: list[UnitView] = []
    commits: list[CommitView] = []
    provider = OfflineProvider()
    for _ in range(50):
        snap = snapshot_of(sample_file, units=units, commits=commits)
        decision = next_work(snap)
        # The writer pays off scheduled foreshadowing itself (foreshadowingDue), so the book
        # must end in Finish, never Blocked.
        assert not isinstance(decision, Blocked), decision.violations
        if isinstance(decision, Finish):
            break
        assert isinstance(decision, WriteUnit), decision
        unit = UnitView(
            unit_id=f"u-{len(units) + 1}",
            chapter_id=decision.chapter_id,
            scene_id=decision.scene_id,
            fragment=decision.fragment,
            state="claimed",
            attempt=1,
        )
        units = [*units, unit]
        snap = snapshot_of(sample_file, units=units, commits=commits)
        if shape == "W1":
            pack = render_pack(snap, unit.unit_id, "full")
            outcome = await run_w1(provider, pack.text, max_output_tokens=MAX_TOKENS)
            body = outcome.draft
        else:
            pack = render_pack(snap, unit.unit_id, "trimmed")
            sent: list[dict[str, Any]] = []
            outcome = await run_w2(
                provider,
                pack.text,
                allow_list=W2_ALLOW_LIST,
                read_tool=read_tool_for(snap),
                commit=fake_commit(sent),
                max_output_tokens=MAX_TOKENS,
            )
            body = outcome.draft
            assert sent[0]["unitId"] == unit.unit_id
        assert outcome.ok and body is not None, outcome
        assert isinstance(body, CommitBody)
        check_body(
            body,
            known_commits={c.commit_id: len(c.paragraphs) for c in commits},
            hard_max_remaining=None,
        )
        seq = len(commits) + 1
        commits = [
            *commits,
            CommitView(
                commit_id=f"commit-{seq}",
                seq=seq,
                unit_id=unit.unit_id,
                chapter_id=unit.chapter_id,
                scene_id=unit.scene_id,
                paragraphs=body.paragraphs,
                scene_completion=body.scene_completion,
                canon_changes=rewrite_sources(body, f"commit-{seq}"),
                effective_characters=sum(effective_characters(p) for p in body.paragraphs),
                body_hash="0" * 64,
                paragraph_count=len(body.paragraphs),
            ),
        ]
        units = [msgspec.structs.replace(u, state="committed") if u is unit else u for u in units]
    else:
        pytest.fail("the novel did not finish")
    assert len(commits) == len(sample_file.outline.scenes)
    band = book_band(sample_file.config.length)
    assert band is not None
    total = sum(c.effective_characters for c in commits)
    assert band[0] <= total <= band[1]


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (0, 5), (1, 30)])
def test_offline_never_writes_an_empty_body_even_for_a_tiny_range(lo: int, hi: int) -> None:
    draft = compose_draft(hand_pack("Mara finds the hidden map", lo, hi))
    assert draft["paragraphs"] and all(p.strip() for p in draft["paragraphs"])
    guard_prose(draft["paragraphs"])
