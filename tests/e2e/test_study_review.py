"""A study as people run it (STUDY-1..8): two offline arms of the sample novel written by the
actors, two reviewers voting blind through `novelbus review`, a model judge, the report, the
decision and its adoption, and every bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.app import studies
from novelbus.bus.events import EventFollower
from novelbus.messages import events as ev
from novelbus.novel import w3
from novelbus.novel.roles.judge import CRITERIA as JUDGE_CRITERIA
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.study import parse_study_file
from novelbus.store import studies as db
from tests.writers.chat_server import ChatServer, Response, completion

HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
STUDY: dict[str, Any] = {
    "title": "Bounded writers against one session, sample novel", "novel": "sample.json",
    "variable": "writerMode", "compare": ["subagent", "inline"],
    "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent", "writerShape": "W2"}},
    "rule": {"notWorseMargin": 0.1, "minPairs": 6, "minReviewersPerPair": 2, "judgeKappa": 0.4},
    "criteria": ["scene_continuity", "style"],
}


async def novelbus(*args: str, timeout: float = 90) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def flags(stack: Runtime, nats_url: str) -> list[str]:
    dsn = stack.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    return ["--nats-url", nats_url, "--database-url", dsn, "--namespace", stack.ctx.subjects.namespace]


def study_file(tmp_path: Path, **over: Any) -> Path:
    (tmp_path / "sample.json").write_bytes(sample_novel_bytes())
    path = tmp_path / "study.json"
    path.write_text(json.dumps({**STUDY, **over}))
    return path


async def finished(stack: Runtime, novel_id: str, timeout: float = 120.0) -> None:
    """Wait (replaying the novel's events) until it finishes."""
    async def follow() -> None:
        async with EventFollower(stack.ctx.nc, stack.ctx.subjects, novel_id=novel_id, js=stack.ctx.js,
                                 replay=True) as events:
            async for event in events:
                if isinstance(event, ev.NovelFinished):
                    return
                assert not isinstance(event, ev.NovelPaused), f"{novel_id} paused: {event}"

    try:
        await asyncio.wait_for(follow(), timeout)
    except TimeoutError:
        pytest.fail(f"arm novel {novel_id} did not finish within {timeout:.0f} s")


def kappa(x: list[str], y: list[str]) -> float:
    """Cohen's κ, written out again here: p_o against the chance agreement of the two marginals."""
    n = len(x)
    p_o = sum(a == b for a, b in zip(x, y, strict=True)) / n
    p_e = sum((x.count(label) / n) * (y.count(label) / n) for label in set(x) | set(y))
    return (p_o - p_e) / (1 - p_e)


async def test_two_reviewers_review_a_study_blind_and_its_decision_becomes_the_default(
        stack: Runtime, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STUDY-1, STUDY-3, STUDY-4, STUDY-6: create → arms written → undecided before any vote →
    two invited reviewers vote on every pair through `novelbus review` (one always A) → the
    report's position bias, κ and intervals → `decide` follows the rule → `adopt` changes what
    `novel create` names."""
    f = flags(stack, nats_url)
    pool = stack.ctx.pool
    code, out, err = await novelbus("study", "create", str(study_file(tmp_path)), "--json", *f)
    assert code == 0, err
    study_id = json.loads(out)["studyId"]
    row = await db.get_study(pool, study_id)
    assert row.registration_hash is not None and set(row.arms) == {"inline", "subagent"}
    for novel_id in row.arms.values():
        await finished(stack, novel_id)
    # STUDY-1: the frozen registration cannot change
    with pytest.raises(Exception, match="append-only"):
        await pool.execute("UPDATE study_registrations SET registration_hash = 'x' WHERE study_id = $1", study_id)

    code, out, err = await novelbus("study", "status", study_id, "--json", *f)
    status = json.loads(out)
    assert code == 0, err
    assert {a: (s["status"], s["commits"]) for a, s in status["arms"].items()} == {
        "inline": ("finished", 9), "subagent": ("finished", 9)}
    assert status["pairs"] == 9 and status["excluded"] == []  # STUDY-2: every scene passes the check
    code, out, _ = await novelbus("study", "report", study_id, "--json", *f)
    before = json.loads(out)
    assert code == 0 and before["verdict"] == "undecided"

    tokens = []
    for name in ("Alice Reviewer", "Bob Reviewer"):
        if not tokens:
            code, out, err = await novelbus("study", "invite", study_id, "--reviewer", name, "--json", *f)
            assert code == 0, err
            invite = json.loads(out)
        else:  # the service the command calls
            invite = await studies.invite(stack.ctx, study_id, name)
        assert "/review/" in invite["url"]
        tokens.append(invite["token"])
        stored = await pool.fetchval("SELECT count(*) FROM study_reviewers WHERE token_hash = $1",
                                     hashlib.sha256(invite["token"].encode()).hexdigest())
        assert stored == 1 and await pool.fetchval("SELECT count(*) FROM study_reviewers WHERE token_hash = $1",
                                                   invite["token"]) == 0

    # Through the CLI: the first pair, blind; a vote, and the same vote again (nothing written).
    code, out, err = await novelbus("review", "next", study_id, "--reviewer-token", tokens[0], "--json", *f)
    assert code == 0, err
    shown = json.loads(out)
    assert set(shown) >= {"pairId", "criteria", "context", "a", "b"} and shown["criteria"] == STUDY["criteria"]
    secrets_ = [study_id, STUDY["title"], "The Keeper's Ledger", "inline", "subagent", "offline", "W2",
                *row.arms.values(), row.registration_hash]
    responses = [out]
    vote = ("review", "vote", study_id, shown["pairId"], "--reviewer-token", tokens[0], "--criterion", "style",
            "--choice", "a", "--flag", "narrative-style", "--span", "0:12", "--text", "a", "--json")
    code, out, err = await novelbus(*vote, *f)
    assert code == 0 and json.loads(out)["recorded"] is True, err
    code, out, err = await novelbus(*vote, *f)
    assert code == 0 and json.loads(out)["recorded"] is False, err
    responses.append(out)
    assert await db.vote_count(pool, study_id) == 1
    # STUDY-8: bad votes are refused naming what is wrong, exit 2 from the CLI, nothing written
    pair, length = shown["pairId"], len(shown["a"])
    for args, named in [
        ((study_id, pair, "--criterion", "style", "--choice", "a", "--flag", "world-building", "--text", "a",
          "--span", f"0:{length + 1}"), f"span 0:{length + 1} is outside text a"),
    ]:
        code, _, err = await novelbus("review", "vote", *args[:2], "--reviewer-token", tokens[0], *args[2:], *f)
        assert code == 2 and named in err, err
    with pytest.raises(store.StoreError, match="study 's-nowhere' not found"):
        await studies.vote(stack.ctx, "s-nowhere", pair, tokens[0], criterion="style", choice="a")
    for kwargs, named in [
        ({"pair_id": "p-nowhere", "criterion": "style", "choice": "a"}, "pair 'p-nowhere' is not a pair"),
        ({"pair_id": pair, "criterion": "plot", "choice": "a"}, "criterion 'plot' is not registered"),
        ({"pair_id": pair, "criterion": "style", "choice": "maybe"}, "choice 'maybe' is not one of"),
        ({"pair_id": pair, "criterion": "style", "choice": "a", "flag": "plot-holes", "text": "a", "span": (0, 1)},
         "flag 'plot-holes' is not a category"),
        ({"pair_id": pair, "criterion": "style", "choice": "a", "flag": "timeline-plot", "text": "b",
          "span": (5, 5)}, "span 5:5 is outside text b"),
    ]:
        pair_id = kwargs.pop("pair_id")
        with pytest.raises(store.StoreError, match=re.escape(named)):
            await studies.vote(stack.ctx, study_id, pair_id, tokens[0], **kwargs)
    assert await db.vote_count(pool, study_id) == 1

    # Every pair, both reviewers: reviewer 1 always A, reviewer 2 always B (services the CLI calls).
    for token, choice in zip(tokens, ("a", "b"), strict=True):
        while not (nxt := await studies.next_pair(stack.ctx, study_id, token)).get("done"):
            responses.append(json.dumps(nxt))
            for criterion in set(nxt["criteria"]) - set(nxt["voted"]):
                await studies.vote(stack.ctx, study_id, nxt["pairId"], token, criterion=criterion, choice=choice)
    # A fresh process continues where the reviewer left off: nothing left.
    code, out, _ = await novelbus("review", "next", study_id, "--reviewer-token", tokens[1], "--json", *f)
    assert code == 0 and json.loads(out) == {"done": True, "progress": {"done": 9, "total": 9}}
    for text in responses:  # STUDY-3: nothing names an arm, novel, title, id, hash or model
        for secret in secrets_:
            assert secret not in text, secret
        assert not HEX64.search(text)

    # STUDY-3: every pair was shown in both orders (from the ledger, not from the service).
    rows = await pool.fetch("SELECT DISTINCT ON (alias, pair_id, criterion) alias, pair_id, criterion, choice, a_is_test"
                            " FROM study_votes WHERE study_id = $1 ORDER BY alias, pair_id, criterion, vote_id DESC",
                            study_id)
    shown_first = {(r["alias"], r["pair_id"]): r["a_is_test"] for r in rows}
    pairs = {r["pair_id"] for r in rows}
    assert len(pairs) == 9 and all(shown_first[("reviewer-1", p)] != shown_first[("reviewer-2", p)] for p in pairs)

    code, out, _ = await novelbus("study", "judge", study_id, "--judge-model", "offline", "--json", *f)
    assert code == 0 and json.loads(out)["judge"] == "judge-1"
    code, out, _ = await novelbus("study", "report", study_id, "--json", *f)
    report = json.loads(out)
    assert code == 0
    assert report["positionBias"] == {"reviewer-1": 1.0, "reviewer-2": 0.0}
    outcome = {("a", True): "win", ("a", False): "loss", ("b", True): "loss", ("b", False): "win"}
    per = {alias: {(r["pair_id"], r["criterion"]): outcome[(r["choice"], r["a_is_test"])] for r in rows
                   if r["alias"] == alias} for alias in ("reviewer-1", "reviewer-2")}
    items = sorted(per["reviewer-1"])
    x, y = [per["reviewer-1"][k] for k in items], [per["reviewer-2"][k] for k in items]
    # Balanced positions: always-A and always-B name the same arm on every item.
    assert x == y and report["agreement"]["kappa"] == round(kappa(x, y), 4)
    for criterion in STUDY["criteria"]:
        row_ = report["criteria"][criterion]
        wins = sum(1 for k in items if k[1] == criterion and per["reviewer-1"][k] == "win") * 2
        assert (row_["wins"], row_["losses"], row_["ties"], row_["bothBad"]) == (wins, 18 - wins, 0, 0)
        assert row_["low"] <= wins / 18 <= row_["high"]
    judge = report["judges"]["judge-1"]
    assert judge["counted"] is ((judge["kappa"] or -1) >= 0.4 and (judge["positionConsistency"] or 0) >= 0.65)
    cost = report["cost"]
    assert cost["source"] == "provider" and cost["ratio"] == round(
        (cost["test"]["inputTokens"] / cost["test"]["units"]) / (cost["base"]["inputTokens"] / cost["base"]["units"]), 4)
    # STUDY-5: the flag, traced to what its writer was given
    [flag] = report["flags"]["story"]
    assert flag["category"] == "narrative-style" and "L0:story" in flag["attribution"]["blocks"]
    # STUDY-6: 9 pairs with two reviewers each ≥ 6; quality not worse needs every lower bound ≥ 0.4
    quality_ok = all(report["criteria"][c]["low"] >= 0.4 for c in STUDY["criteria"])
    expected = "subagent" if quality_ok and cost["ratio"] <= 0.40 else "inline"
    assert report["verdict"] == expected

    # STUDY-4: a model judge behind the OpenAI wire format: every pair in both orders, each call's
    # usage recorded under the mode `judge` of the test arm's novel (always a tie: it agrees with
    # nobody, so it is not counted and the verdict below stays the people's)
    calls: list[dict[str, Any]] = []

    def tie(request: dict[str, Any]) -> Response:
        calls.append(request)
        return completion(content=json.dumps(dict.fromkeys(JUDGE_CRITERIA, "tie")),  # the judge's own criteria
                          usage={"prompt_tokens": 100, "completion_tokens": 10})

    async with ChatServer([], responder=tie) as server:
        monkeypatch.setenv("NOVELBUS_MODEL_BASE_URL", server.base_url)
        code, out, err = await novelbus("study", "judge", study_id, "--judge-model", "openai:judge-test", "--json", *f)
    judged = json.loads(out)
    assert code == 0 and judged["judge"] == "judge-2" and judged["failedPairs"] == 0, err
    assert len(calls) == 18 and judged["votes"] == 18 * len(STUDY["criteria"])  # 9 pairs, both orders
    assert judged["usageNovelId"] == row.arms["subagent"]
    assert (judged["usage"]["calls"], judged["usage"]["inputTokens"], judged["usage"]["outputTokens"]) == (18, 1800, 180)
    assert (await store.usage_totals(pool, row.arms["subagent"]))["judge"]["calls"] == 18
    assert "judge" not in await store.usage_totals(pool, row.arms["inline"])

    code, out, err = await novelbus("study", "decide", study_id, "--json", *f)
    record = json.loads(out)
    assert code == 0 and record["verdict"] == expected and record["reviewers"] == 2, err
    assert "Alice" not in out and "Bob" not in out and record["registrationHash"] == row.registration_hash
    # closed: a late vote is refused and nothing is written
    count = await db.vote_count(pool, study_id)
    with pytest.raises(store.StoreError, match="is closed"):
        await studies.vote(stack.ctx, study_id, shown["pairId"], tokens[0], criterion="style", choice="b")
    assert await db.vote_count(pool, study_id) == count

    bare = json.loads(sample_novel_bytes())
    del bare["config"]["writerMode"]
    bare["config"].pop("writerShape", None)
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    code, _, err = await novelbus("novel", "create", str(tmp_path / "bare.json"), "--no-start", *f)
    assert code == 0 and w3.DECISION["studyId"] in err and "shipped" in err
    code, out, err = await novelbus("study", "adopt", study_id, "--json", *f)
    assert code == 0 and json.loads(out)["writerMode"] == ("subagent" if expected == "subagent" else "inline"), err
    code, _, err = await novelbus("novel", "create", str(tmp_path / "bare.json"), "--no-start", *f)
    assert code == 0 and study_id in err and "adopted" in err, err


async def test_a_bad_study_file_and_foreign_or_replayed_tokens_are_refused_and_nothing_is_written(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """STUDY-8: arms that differ beyond the variable are refused at create naming the field; a
    token of another study, a made-up one and a redeemed invite are refused; a study that has
    not started takes no vote."""
    f = flags(stack, nats_url)
    pool = stack.ctx.pool
    code, _, err = await novelbus("study", "create", str(study_file(tmp_path, arms={
        "inline": {"writerMode": "inline", "detector": "off"}, "subagent": {"writerMode": "subagent"}})), *f)
    assert code == 2 and "arms.subagent: differs from arms.inline in detector" in err and "variable under test" in err
    assert await db.list_studies(pool) == []

    code, out, err = await novelbus("study", "create", str(study_file(tmp_path)), "--no-start", "--json", *f)
    assert code == 0, err
    first = json.loads(out)["studyId"]
    second = await studies.create(stack.ctx, parse_study_file(
        json.dumps({**STUDY, "novel": json.loads(sample_novel_bytes())})), start_arms=False)
    assert (await db.get_study(pool, first)).arms == {}  # registered, not started: no arm novel yet
    mine = (await studies.invite(stack.ctx, first, "carol"))["token"]
    foreign = (await studies.invite(stack.ctx, second, "dave"))["token"]
    ok = ("--criterion", "style", "--choice", "tie")
    for token, named in [(foreign, f"not for study {first!r}"), ("made-up-token", "not known")]:
        code, _, err = await novelbus("review", "next", first, "--reviewer-token", token, *f)
        assert code == 2 and "reviewer-refused" in err and named in err, err
    code, _, err = await novelbus("review", "vote", first, "p-any", "--reviewer-token", mine, *ok, *f)
    assert code == 2 and "has not started" in err, err
    # a one-time link: redeemed once for a session, the invite is refused from then on
    session = await studies.redeem_invite(stack.ctx, first, mine)
    code, _, err = await novelbus("review", "next", first, "--reviewer-token", mine, *f)
    assert code == 2 and "already redeemed" in err, err
    with pytest.raises(store.StoreError, match="already redeemed"):
        await studies.redeem_invite(stack.ctx, first, mine)
    assert (await studies.next_pair(stack.ctx, first, session)) == {"done": True, "progress": {"done": 0, "total": 0}}
    assert await pool.fetchval("SELECT count(*) FROM study_votes") == 0
