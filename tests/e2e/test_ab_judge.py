"""`novelbus bench ab` with its quality half (JUDGE-1..3) as a user runs it: the same generated
novel in both modes, consistency figures per arm from the store, the blind position-swapped
judge (offline, and a model judge behind the OpenAI wire format) and the W3 verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from novelbus.bench import ab as bench_ab
from novelbus.novel.judge import CRITERIA
from tests.e2e.test_usage_bench import novelbus
from tests.writers.chat_server import ChatServer, Response, completion

SHARES = ("foreshadowing_resolved", "scenes_completed", "length_adherence", "repetition")


def _check_quality(report: dict[str, Any], pairs: int) -> None:
    quality = report["quality"]
    for arm in ("inline", "subagent"):
        figures = quality["consistency"][arm]
        for name in SHARES:
            assert figures[name] is not None and 0.0 <= figures[name] <= 1.0, (arm, name)
        # the offline detector runs on the bench's novels (ROLE-5) and finds nothing to contradict
        # in the offline writer's prose; without a detector the figure is null
        checked = report["roles"][arm]["detector"]["checksPerUnit"] > 0
        assert figures["contradictions_per_10k"] == (0.0 if checked else None), arm
        assert figures["canon_changes_per_unit"] is not None and figures["canon_changes_per_unit"] >= 0
    judged = quality["judge"]
    assert judged["pairs"] + judged["failed_pairs"] == pairs
    assert 0.0 <= judged["position_consistency"] <= 1.0
    for name in CRITERIA:
        row = judged["criteria"][name]
        assert row["subagent_wins"] + row["inline_wins"] + row["ties"] == judged["pairs"], name
    low, high = judged["not_worse_interval"]
    assert 0.0 <= low <= judged["not_worse_share"] <= high <= 1.0


async def test_bench_ab_judge_json_reports_both_halves_and_the_w3_verdict(
    nats_url: str, new_database: Any, tmp_path: Path
) -> None:
    """JUDGE-1/2/3: `bench ab --judge --json` (offline judge): consistency figures per arm in
    range, every scene both arms wrote judged twice with position consistency, the interval, and
    `w3` from the cost ratio and the interval's lower bound."""
    dsn = await new_database()
    out = novelbus("bench", "ab", "--chapters", "2", "--scenes", "3", "--unit-chars", "500", "--judge",
                   "--json", "--nats-url", nats_url, "--database-url", dsn, "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_quality(report, pairs=6)
    judged = report["quality"]["judge"]
    assert judged["judge"] == "offline" and judged["failed_pairs"] == 0
    # The offline writer writes the same scene the same way in both modes: the offline judge,
    # blind to the arms, finds nothing between them, in both positions.
    assert judged["position_consistency"] == 1.0 and judged["not_worse_share"] == 1.0
    w3 = report["w3"]
    cost = report["provider_ratio"] if report["provider_ratio"] is not None else report["ratio"]
    assert w3["cost_ratio"] == round(cost, 4) and w3["cost_ok"] is (cost <= 0.40)
    assert w3["quality_ok"] is (judged["not_worse_interval"][0] >= 0.5)
    assert w3["verdict"] == ("subagent" if w3["cost_ok"] and w3["quality_ok"] else "inline")


async def test_bench_ab_without_judge_still_gives_consistency_and_an_undecided_quality_half(
    nats_url: str, new_database: Any, tmp_path: Path
) -> None:
    """JUDGE-1/3: without --judge the figures are there, quality_ok is null (not measured). The
    subagent arm here drafts (W1): one call per unit, no tools."""
    dsn = await new_database()
    report = await bench_ab.bench(chapters=2, scenes=2, unit_chars=500, seed=7, cjk=False, model="offline",
                                  compact_tokens=5000, check_flat=False, out=tmp_path, timeout=120,
                                  as_json=True, home=None, nats_url=nats_url, database_url=dsn,
                                  quality_gate=False, measure_paused=True, subagent_shape="W1")
    assert report["inline_units_committed"] == report["subagent_units_committed"] == 4
    assert report["subagent_shape"] == "W1" and report["subagent_calls"] == 4
    assert "judge" not in report["quality"] and set(report["quality"]["consistency"]) == {"inline", "subagent"}
    assert report["w3"]["quality_ok"] is None and report["w3"]["verdict"] in ("undecided", "inline")


def test_a_subagent_shape_other_than_w1_or_w2_exits_2_naming_the_option() -> None:
    out = novelbus("bench", "ab", "--subagent-shape", "W3", "--json", timeout=60)
    assert out.returncode == 2 and "--subagent-shape must be W1 or W2, got 'W3'" in out.stderr and not out.stdout


@pytest.mark.parametrize("spec", ["bogus", "claude:opus", "openai:"])
def test_a_judge_model_naming_an_unknown_provider_exits_2_before_anything_starts(spec: str) -> None:
    """JUDGE-2: `--judge-model` naming an unknown provider is an error naming it, exit 2, no
    servers started (no database or NATS options given: it would fail differently)."""
    out = novelbus("bench", "ab", "--judge-model", spec, "--json", timeout=60)
    assert out.returncode == 2 and "--judge-model" in out.stderr and not out.stdout
    assert (spec.split(":")[0] in out.stderr) if spec != "openai:" else "no model named" in out.stderr


def test_a_judge_model_without_a_configured_server_exits_2_before_anything_starts() -> None:
    """JUDGE-2: `--judge-model openai:<model>` with no server or key configured is refused up
    front, naming what to set, not after both novels are written."""
    out = novelbus("bench", "ab", "--judge-model", "openai:judge", "--json", timeout=60)
    assert out.returncode == 2 and "--judge-model openai:judge" in out.stderr and not out.stdout
    assert "NOVELBUS_MODEL_BASE_URL" in out.stderr


async def test_a_model_judge_is_blind_position_swapped_and_its_bad_replies_are_failed_pairs(
    nats_url: str, new_database: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JUDGE-2: a model judge behind the OpenAI wire format. Each scene is asked twice with the
    positions swapped; a judge that always prefers "A" on one criterion (pure position bias) gets
    ties there and a position consistency of 3/4; a reply that is not JSON is a failed pair,
    reported, not a tie; every call's usage is recorded under the mode `judge`; what the model
    got names no arm, id or title, and asked for structured output."""
    calls: list[dict[str, Any]] = []

    def answer(request: dict[str, Any]) -> Response:
        calls.append(request)
        if len(calls) == 3:  # the second pair's first judgment
            return completion(content="I prefer the first text.", usage={"prompt_tokens": 50,
                                                                          "completion_tokens": 5})
        verdicts = dict.fromkeys(CRITERIA, "tie") | {"character_state": "A"}
        return completion(content=json.dumps(verdicts), usage={"prompt_tokens": 100, "completion_tokens": 20})

    dsn = await new_database()
    async with ChatServer([], responder=answer) as server:
        monkeypatch.setenv("NOVELBUS_MODEL_BASE_URL", server.base_url)
        report = await bench_ab.bench(chapters=2, scenes=2, unit_chars=500, seed=7, cjk=False, model="offline",
                                      compact_tokens=5000, check_flat=False, out=tmp_path, timeout=120,
                                      as_json=True, home=None, nats_url=nats_url, database_url=dsn,
                                      judge="openai:judge-test")
    _check_quality(report, pairs=4)
    judged = report["quality"]["judge"]
    assert judged["pairs"] == 3 and judged["failed_pairs"] == 1
    assert judged["failures"][0]["scene"] == 2 and "not JSON" in judged["failures"][0]["reason"]
    assert judged["criteria"]["character_state"] == {"subagent_wins": 0, "inline_wins": 0, "ties": 3,
                                                     "position_inconsistent": 3}
    assert judged["position_consistency"] == 0.75
    assert len(calls) == 7 and judged["usage"]["calls"] == 7
    assert judged["usage"]["inputTokens"] == 6 * 100 + 50
    first = calls[0]
    assert first["response_format"]["type"] == "json_schema"
    assert first["response_format"]["json_schema"]["schema"]["required"] == list(CRITERIA)
    for request in calls:
        text = json.dumps(request["messages"], ensure_ascii=False)
        for banned in ("inline", "subagent", "W2", "bench ab", "commit-", "hash"):
            assert banned not in text, banned
        assert not re.search(r"\bch\d{3}", text)  # generated chapter, scene and unit ids
        assert set(json.loads(request["messages"][1]["content"])["candidates"]) == {"A", "B"}


async def test_novel_create_says_why_the_default_writer_mode_is_not_subagent(
    nats_url: str, new_database: Any, tmp_path: Path
) -> None:
    """JUDGE-3: when the default writerMode is not subagent, `novel create` of a file that leaves
    writerMode to the default prints why; a file that sets writerMode gets no note."""
    from novelbus.novel import w3
    from novelbus.novel.sample import sample_novel_bytes

    dsn = await new_database()
    data = json.loads(sample_novel_bytes())
    del data["config"]["writerMode"]
    data["config"].pop("writerShape", None)  # a named shape asks for subagent: the file is silent on both
    bare, chosen = tmp_path / "bare.json", tmp_path / "chosen.json"
    bare.write_text(json.dumps(data))
    chosen.write_text(sample_novel_bytes().decode())
    servers = ("--no-start", "--nats-url", nats_url, "--database-url", dsn)
    out = novelbus("novel", "create", str(bare), *servers)
    assert out.returncode == 0, out.stderr
    reason = w3.default_reason()
    assert (reason is None) == (w3.DEFAULT_WRITER_MODE == "subagent")
    if reason is not None:
        assert "writerMode defaults to inline" in out.stderr and "docs/studies.md" in out.stderr
    out = novelbus("novel", "create", str(chosen), *servers)
    assert out.returncode == 0 and "writerMode defaults" not in out.stderr
