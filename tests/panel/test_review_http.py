"""STUDY-3, STUDY-8: the review routes over plain HTTP against real NATS + PostgreSQL — the invite
exchanged once for a study-scoped cookie, every bad vote refused naming what is wrong with
nothing written, a repeated submit writing nothing, a closed study taking no vote."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from novelbus.app import studies
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.study import parse_study_file
from novelbus.store import studies as db
from tests.panel.conftest import Panel

CRITERIA = ["style", "scene_continuity"]
TEXT_A, TEXT_B = "The lamp was lit before the storm came in.", "Night fell; the keeper climbed the stair — slowly."


def _request(url: str, method: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, head, raw = r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        status, head, raw = e.code, dict(e.headers.items()), e.read()
    try:
        return status, {k.lower(): v for k, v in head.items()}, json.loads(raw)
    except ValueError:
        return status, {k.lower(): v for k, v in head.items()}, raw.decode()


async def http(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None,
               raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})} if data is not None else dict(headers or {})
    return await asyncio.to_thread(_request, url, method, data, hdrs)


async def _running_study(panel: Panel) -> tuple[str, list[str]]:
    """A study frozen and running with two pairs of known texts (its arms not started: the pairs
    are saved the way `refresh_pairs` saves them)."""
    ctx = panel.rt.ctx
    study = parse_study_file(json.dumps({
        "title": "HTTP review", "novel": json.loads(sample_novel_bytes()), "variable": "writerMode",
        "compare": ["subagent", "inline"], "criteria": CRITERIA,
        "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent"}}}))
    study_id = await studies.create(ctx, study, start_arms=False)
    for arm in ("inline", "subagent"):  # frozen, running, its arm novels created and not started
        await studies.create_arm(ctx, study_id, arm, start=False)
    pairs = []
    for i, scene in enumerate(study.novel.outline.scenes[:2]):
        pair = db.PairRow(pair_id=f"p{i}abc", pair_index=i, chapter_id=scene.chapterId, scene_id=scene.sceneId,
                          test_text=TEXT_A, base_text=TEXT_B,
                          context={"goal": scene.goal, "conflict": "", "timeLocation": "", "participants": [],
                                   "previousParagraph": ""}, refused=[])
        await db.save_pair(ctx.pool, study_id, pair)
        pairs.append(pair.pair_id)
    return study_id, pairs


async def test_an_invite_becomes_a_study_scoped_cookie_once_and_bad_votes_write_nothing(panel: Panel) -> None:
    """STUDY-3, STUDY-8"""
    pool = panel.rt.ctx.pool
    study_id, pairs = await _running_study(panel)
    base = f"{panel.url}review/{study_id}"
    invite = await studies.invite(panel.rt.ctx, study_id, "Dee")

    status, head, _ = await http(f"{base}/session", "POST", raw=b"invite=x",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415
    status, head, body = await http(f"{base}/session", "POST", {"invite": invite["token"]})
    assert status == 200 and body == {"ok": True}, body
    cookie = head["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and f"Path=/review/{study_id}" in cookie
    session = cookie.split(";", 1)[0]
    status, _, body = await http(f"{base}/session", "POST", {"invite": invite["token"]})
    assert status == 403 and "already redeemed" in body["error"]
    status, _, body = await http(f"{base}/next")
    assert status == 403 and "not known" in body["error"]  # no cookie, no pair

    status, _, shown = await http(f"{base}/next", headers={"Cookie": session})
    assert status == 200 and shown["pairId"] in pairs and {shown["a"], shown["b"]} == {TEXT_A, TEXT_B}
    assert set(shown) == {"pairId", "criteria", "questions", "voted", "context", "a", "b", "progress", "choices",
                          "flagCategories", "csrf"}
    assert study_id not in json.dumps(shown)
    auth = {"Cookie": session, "X-Review-CSRF": shown["csrf"]}
    votes = {c: "a" for c in CRITERIA}
    a_len = len(shown["a"])
    for body, status_, named in [
        ({"pairId": shown["pairId"], "votes": votes}, 403, "CSRF"),  # without the header (below: with)
        ({"pairId": "p-nowhere", "votes": votes}, 404, "pair 'p-nowhere' is not a pair of this study"),
        ({"pairId": shown["pairId"], "votes": {"plot": "a"}}, 422, "criterion 'plot' is not registered"),
        ({"pairId": shown["pairId"], "votes": {"style": "maybe"}}, 422, "choice 'maybe' is not one of"),
        # one good vote beside a bad one: neither is written
        ({"pairId": shown["pairId"], "votes": {"style": "a", "scene_continuity": "maybe"}}, 422,
         "choice 'maybe' is not one of"),
        ({"pairId": shown["pairId"], "votes": votes, "flag": {"criterion": "style", "category": "plot-holes",
                                                              "text": "a", "start": 0, "end": 3}},
         422, "flag 'plot-holes' is not a category"),
        ({"pairId": shown["pairId"], "votes": votes, "flag": {"criterion": "style", "category": "world-building",
                                                              "text": "a", "start": 2, "end": a_len + 1}},
         422, f"span 2:{a_len + 1} is outside text a"),
        ({"pairId": shown["pairId"], "votes": {"style": "a"}, "flag": {"criterion": "scene_continuity",
                                                                       "category": "world-building", "text": "b",
                                                                       "start": 0, "end": 1}},
         422, "flag.criterion"),
        ({"pairId": shown["pairId"], "votes": votes, "flag": {"criterion": "style", "category": "world-building",
                                                              "text": "a", "start": "0", "end": 2}},
         422, "start and end are character offsets"),
    ]:
        headers = {"Cookie": session} if status_ == 403 else auth
        status, _, answer = await http(f"{base}/vote", "POST", body, headers=headers)
        assert status == status_ and named in answer["error"], (status, answer)
        assert study_id not in answer["error"]
        assert await db.vote_count(pool, study_id) == 0, body

    # A flagged vote: the span in characters of text b (the em dash is one character).
    dash = shown["b"].index("—") if "—" in shown["b"] else shown["a"].index("—")
    text = "b" if "—" in shown["b"] else "a"
    good = {"pairId": shown["pairId"], "votes": votes,
            "flag": {"criterion": "style", "category": "narrative-style", "text": text, "start": dash,
                     "end": dash + 1}}
    status, _, answer = await http(f"{base}/vote", "POST", good, headers=auth)
    assert status == 200 and answer["recorded"] == {c: True for c in CRITERIA}, answer
    status, _, answer = await http(f"{base}/vote", "POST", good, headers=auth)  # a repeated submit
    assert status == 200 and answer["recorded"] == {c: False for c in CRITERIA}
    assert await db.vote_count(pool, study_id) == 2
    [flagged] = [v for v in await db.effective_votes(pool, study_id) if v.flag_category]
    assert (flagged.criterion, flagged.flag_text, flagged.span_start, flagged.span_end) == ("style", text, dash,
                                                                                            dash + 1)
    status, _, nxt = await http(f"{base}/next", headers={"Cookie": session})
    assert nxt["pairId"] != shown["pairId"] and nxt["progress"] == {"done": 1, "total": 2}

    # Done with both pairs, a change of mind on the first is checked whole as well.
    status, _, answer = await http(f"{base}/vote", "POST", {"pairId": nxt["pairId"], "votes": votes},
                                   headers={"Cookie": session, "X-Review-CSRF": nxt["csrf"]})
    assert status == 200 and (await http(f"{base}/next", headers={"Cookie": session}))[2]["done"] is True
    status, _, answer = await http(f"{base}/vote", "POST", {"pairId": shown["pairId"],
                                                            "votes": {"style": "b", "scene_continuity": "maybe"}},
                                   headers=auth)
    assert status == 422 and "choice 'maybe'" in answer["error"] and await db.vote_count(pool, study_id) == 4

    # The operator's report of it, and a closed study taking no vote.
    status, _, page = await http(f"{panel.url}studies/{study_id}")
    assert status == 200 and 'id="share-chart"' in page and 'id="bias-chart"' in page
    status, _, report = await http(f"{panel.url}api/studies/{study_id}/report")
    assert status == 200 and report["positionBias"] == {"reviewer-1": 1.0}
    assert report["criteria"]["style"]["wins"] + report["criteria"]["style"]["losses"] == 2
    status, _, answer = await http(f"{panel.url}api/studies/s-nowhere/report")
    assert status == 404 and "not found" in answer["error"]
    await db.close_study(pool, study_id)
    status, _, answer = await http(f"{base}/vote", "POST", {"pairId": nxt["pairId"], "votes": votes},
                                   headers={"Cookie": session, "X-Review-CSRF": nxt["csrf"]})
    assert status == 409 and "this study is closed" in answer["error"]
    assert await db.vote_count(pool, study_id) == 4
