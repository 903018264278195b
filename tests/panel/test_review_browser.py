"""STUDY-3, STUDY-4, STUDY-7: a study reviewed blind through the panel's pages in Chromium.

Two offline arms of the sample novel are written by the actors; two reviewers, each with their
own invite link, review its sampled pairs with clicks (the first always choosing the left text,
the second by a fixed pattern) and flag a problem with a span selected by the mouse. Every
response the pages fetch and every DOM is searched for an arm, a novel id, a title, a model, the
study id or a 64-hex hash; a reviewer's session opens no operator page and no other study; the
actors and the panel are restarted mid-review and each reviewer continues where they left off;
the operator's report page shows κ, position bias and intervals computed again here.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from novelbus.actors.runtime import running
from novelbus.app import studies
from novelbus.bus.events import EventFollower
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.study import parse_study_file, win_share_interval
from novelbus.panel.serve import PanelOptions, panel_server
from novelbus.store import studies as db

pytestmark = pytest.mark.timeout(240)

PANEL_TOKEN = "panel-token-for-the-review-test"
HEX64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
CRITERIA = ["scene_continuity", "style"]
STUDY: dict[str, Any] = {
    "title": "Bounded writers against one session, reviewed in the panel", "variable": "writerMode",
    "compare": ["subagent", "inline"],
    "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent", "writerShape": "W2"}},
    "rule": {"notWorseMargin": 0.1, "minPairs": 2, "minReviewersPerPair": 2, "judgeKappa": 0.4},
    "criteria": CRITERIA, "scenes": {"sample": 4, "seed": 7}, "seed": 11,
}
PATTERN = ["b", "a", "tie", "b", "both-bad", "a", "b", "tie"]  # the second reviewer's clicks, in turn


async def _finished(rt: Any, novel_id: str, timeout: float = 150.0) -> None:
    async def follow() -> None:
        async with EventFollower(rt.ctx.nc, rt.ctx.subjects, novel_id=novel_id, js=rt.ctx.js, replay=True) as events:
            async for event in events:
                if isinstance(event, ev.NovelFinished):
                    return
                assert not isinstance(event, ev.NovelPaused), f"{novel_id} paused: {event}"

    try:
        await asyncio.wait_for(follow(), timeout)
    except TimeoutError:
        pytest.fail(f"arm novel {novel_id} did not finish within {timeout:.0f} s")


def _kappa(x: list[str], y: list[str]) -> float:
    """Cohen's κ written out: observed agreement against the chance agreement of the marginals."""
    n = len(x)
    p_o = sum(a == b for a, b in zip(x, y, strict=True)) / n
    p_e = sum((x.count(k) / n) * (y.count(k) / n) for k in set(x) | set(y))
    return (p_o - p_e) / (1 - p_e)


def _outcome(choice: str, a_is_test: bool) -> str:
    if choice in ("tie", "both-bad"):
        return choice
    return "win" if (choice == "a") == a_is_test else "loss"


class Watch:
    """Every response a page fetches (its body), and the DOM at each step."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, int, asyncio.Future[bytes]]] = []
        self.doms: list[str] = []

    def attach(self, page: Any) -> None:  # each body read as the response arrives
        page.on("response", lambda r: self.bodies.append((r.url, r.status, asyncio.ensure_future(r.body()))))

    async def texts(self) -> list[tuple[str, str]]:
        out = []
        for url, status, body in self.bodies:
            try:
                out.append((url, (await body).decode("utf-8", "replace")))
            except Exception:
                assert 300 <= status < 400, f"the body of {url} ({status}) could not be read"  # a redirect has none
        assert len(out) >= 20, "too few responses were watched"
        return out + [("dom", d) for d in self.doms]


async def _review_pair(page: Any, watch: Watch, choose: list[str], *, flag: bool = False,
                       shot: Path | None = None) -> dict[str, Any]:
    """Vote on the pair shown by clicks (one choice per open criterion); with `flag`, select a
    passage of text A with the mouse and flag it. Returns what the page showed."""
    await page.locator("#pair:not([hidden])").wait_for()
    shown = {"a": await page.locator("#text-a").text_content(), "b": await page.locator("#text-b").text_content(),
             "progress": await page.locator("#progress").inner_text()}
    watch.doms.append(await page.content())
    if flag:
        await page.evaluate("window.scrollTo(0, 0)")
        await page.locator("#text-a").scroll_into_view_if_needed()
        box = await page.locator("#text-a").bounding_box()
        await page.mouse.move(box["x"] + 4, box["y"] + 10)
        await page.mouse.down()
        await page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 40, steps=8)
        await page.mouse.up()
        shown["selected"] = await page.evaluate("window.getSelection().toString()")
        await page.locator("#flag-span.selected").wait_for()
        await page.locator("#flag-category").select_option("characterization")
        await page.locator("#flag-criterion").select_option(CRITERIA[0])
        watch.doms.append(await page.content())
    for fieldset, choice in zip(await page.locator("#criteria fieldset").all(), choose, strict=False):
        await fieldset.locator(f'input[data-choice="{choice}"]').click()
    if shot is not None:
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(shot), full_page=True)
    pair_before = await page.evaluate("document.getElementById('text-a').textContent")
    await page.locator("#submit").click()
    await page.wait_for_function("(t) => document.getElementById('text-a').textContent !== t"
                                 " || !document.getElementById('done').hidden", arg=pair_before)
    return shown


async def test_two_reviewers_review_blind_in_chromium_and_the_report_holds(
        nats_url: str, new_database: Any, namespace: str, browser: Any, shots: Path) -> None:
    """STUDY-3, STUDY-4, STUDY-7, STUDY-8"""
    dsn = await new_database()
    subjects = Subjects(namespace)
    study = parse_study_file(json.dumps({**STUDY, "novel": json.loads(sample_novel_bytes())}))
    novel_title = json.loads(sample_novel_bytes())["title"]
    async with running(nats_url, dsn, subjects=subjects) as rt:
        study_id = await studies.create(rt.ctx, study)
        other_id = await studies.create(rt.ctx, study, start_arms=False)
        row = await db.get_study(rt.ctx.pool, study_id)
        for novel_id in row.arms.values():
            await _finished(rt, novel_id)
        assert (await studies.status(rt.ctx, study_id))["pairs"] == 4
        invites = [await studies.invite(rt.ctx, study_id, name) for name in ("Ada Left", "Ben Pattern")]
        foreign = await studies.invite(rt.ctx, other_id, "Cy Elsewhere")
        forbidden = [novel_title, STUDY["title"], "inline", "subagent", "offline", "W2", study_id, other_id,
                     *row.arms.values(), str(row.registration_hash), "Ada Left", "Ben Pattern", "reviewer-"]
        watch = Watch()
        seen: dict[str, list[dict[str, Any]]] = {"r1": [], "r2": []}
        contexts = [await browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
        pages = [await c.new_page() for c in contexts]
        for page in pages:
            watch.attach(page)
        async with panel_server(rt.ctx, PanelOptions(port=0, token=PANEL_TOKEN)) as url:
            # Each reviewer opens their invite link, POSTed once for a cookie: the first with the token
            # in a query (which the page strips), the second the link as `study invite` prints it (the
            # token in the fragment, which a browser never sends to a server).
            links = [f"{url}review/{study_id}?invite={invites[0]['token']}",
                     invites[1]["url"].replace(studies.DEFAULT_PANEL_URL + "/", url)]
            assert "#invite=" in links[1]
            for page, invite, link in zip(pages, invites, links, strict=True):
                await page.goto(link)
                await page.locator("#pair:not([hidden])").wait_for()
                assert invite["token"] not in page.url  # gone from the address bar
            [cookie] = await contexts[0].cookies()
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == f"/review/{study_id}"
            api = contexts[0].request
            # STUDY-3: the reviewer's session and token open no operator page, API, or other study.
            for path, headers in [("api/novels", {}), ("", {}), (f"studies/{study_id}", {}),
                                  ("api/novels", {"Authorization": f"Bearer {invites[0]['token']}"}),
                                  ("api/novels", {"Cookie": f"novelbus_panel={cookie['value']}"}),
                                  (f"api/studies/{study_id}/report", {"Authorization": f"Bearer {cookie['value']}"})]:
                r = await api.get(url + path, headers=headers, max_redirects=0)
                assert r.status in (303, 401), (path, r.status)
            r = await api.get(f"{url}review/{other_id}/next", headers={"Cookie": f"novelbus_review={cookie['value']}"})
            assert r.status == 403 and "not for this study" in (await r.json())["error"]
            r = await api.post(f"{url}review/{study_id}/session", data=json.dumps({"invite": invites[0]["token"]}),
                               headers={"Content-Type": "application/json"})
            assert r.status == 403 and "already redeemed" in (await r.json())["error"]  # a replayed invite
            r = await api.post(f"{url}review/{study_id}/session", data=json.dumps({"invite": foreign["token"]}),
                               headers={"Content-Type": "application/json"})
            assert r.status == 403 and "not for this study" in (await r.json())["error"]  # another study's invite
            # STUDY-8 through the panel: a span outside the text is refused naming it; nothing written.
            nxt = await (await api.get(f"{url}review/{study_id}/next")).json()
            count = await db.vote_count(rt.ctx.pool, study_id)
            length = len(nxt["a"])
            r = await api.post(f"{url}review/{study_id}/vote", headers={"Content-Type": "application/json",
                                                                        "X-Review-CSRF": nxt["csrf"]},
                               data=json.dumps({"pairId": nxt["pairId"], "votes": {c: "a" for c in CRITERIA},
                                                "flag": {"criterion": CRITERIA[0], "category": "timeline-plot",
                                                         "text": "a", "start": 3, "end": length + 5}}))
            assert r.status == 422 and f"span 3:{length + 5} is outside text a" in (await r.json())["error"]
            r = await api.post(f"{url}review/{study_id}/vote", headers={"Content-Type": "application/json"},
                               data=json.dumps({"pairId": nxt["pairId"], "votes": {c: "a" for c in CRITERIA}}))
            assert r.status == 403  # no review CSRF token
            assert await db.vote_count(rt.ctx.pool, study_id) == count == 0

            # Reviewer 1 (always the left text) reviews two pairs, the first with a flag; reviewer 2 one.
            seen["r1"].append(await _review_pair(pages[0], watch, ["a", "a"], flag=True,
                                                 shot=shots / "review-pair.png"))
            seen["r1"].append(await _review_pair(pages[0], watch, ["a", "a"]))
            seen["r2"].append(await _review_pair(pages[1], watch, PATTERN[0:2]))
        counts_before = await db.vote_count(rt.ctx.pool, study_id)
    assert counts_before == 6

    # Restart the actors and the panel: the votes are in PostgreSQL, the sessions too (hashed).
    async with running(nats_url, dsn, subjects=subjects) as rt:
        async with panel_server(rt.ctx, PanelOptions(port=0, token=PANEL_TOKEN)) as url:
            for page, done in zip(pages, (2, 1), strict=True):
                await page.goto(f"{url}review/{study_id}")
                await page.locator("#pair:not([hidden])").wait_for()
                assert await page.locator("#progress").inner_text() == f"pair {done + 1} of 4"
            while len(seen["r1"]) < 4:
                seen["r1"].append(await _review_pair(pages[0], watch, ["a", "a"]))
            while len(seen["r2"]) < 4:
                i = 2 * len(seen["r2"])
                seen["r2"].append(await _review_pair(pages[1], watch, PATTERN[i:i + 2]))
            for page in pages:
                await page.locator("#done:not([hidden])").wait_for()
                watch.doms.append(await page.content())

            # The operator's report page (the panel token), against figures computed here.
            operator = await browser.new_context(viewport={"width": 1280, "height": 1000},
                                                 extra_http_headers={"Authorization": f"Bearer {PANEL_TOKEN}"})
            report_page = await operator.new_page()
            await report_page.goto(f"{url}studies/{study_id}")
            await report_page.locator("#share-chart .interval").first.wait_for(state="attached")
            await report_page.screenshot(path=str(shots / "study-report.png"), full_page=True)
            report = await (await operator.request.get(f"{url}api/studies/{study_id}/report")).json()
            kappa_shown = await report_page.locator("#kappa").inner_text()
            bias_shown = {a: await report_page.locator(f'#bias tr[data-alias="{a}"] .bias-value').inner_text()
                          for a in ("reviewer-1", "reviewer-2")}
            intervals_shown = {c: (float(await report_page.locator(f'#share-chart .interval[data-criterion="{c}"]')
                                         .get_attribute("data-low") or "nan"),
                                   float(await report_page.locator(f'#share-chart .interval[data-criterion="{c}"]')
                                         .get_attribute("data-high") or "nan")) for c in CRITERIA}
            r = await operator.request.get(f"{url}review/{study_id}/next")  # an operator is no reviewer
            assert r.status == 403 and "pairId" not in await r.text()
            await operator.close()
            rows = await rt.ctx.pool.fetch(
                "SELECT DISTINCT ON (alias, pair_id, criterion) alias, pair_id, criterion, choice, a_is_test,"
                " flag_category, flag_text, span_start, span_end"
                " FROM study_votes WHERE study_id = $1 ORDER BY alias, pair_id, criterion, vote_id DESC", study_id)
            texts = {p.pair_id: (p.test_text, p.base_text) for p in await db.list_pairs(rt.ctx.pool, study_id)}
    for c in contexts:
        await c.close()

    # STUDY-3 balance: every pair shown to the two reviewers in opposite orders — on the pages
    # (reviewer 1's left text is reviewer 2's right one) and in the ledger.
    assert len(rows) == 2 * 4 * len(CRITERIA)
    left_1 = {s["a"] for s in seen["r1"]}
    assert {s["b"] for s in seen["r2"]} == left_1 and {s["a"] for s in seen["r2"]} == {s["b"] for s in seen["r1"]}
    first = {(r["alias"], r["pair_id"]): r["a_is_test"] for r in rows}
    assert all(first[("reviewer-1", p)] != first[("reviewer-2", p)] for p in texts)
    assert {r["choice"] for r in rows if r["alias"] == "reviewer-1"} == {"a"}
    # The flag: its span, as the server stored it, is exactly the text the mouse selected.
    [flagged] = [r for r in rows if r["flag_category"]]
    assert (flagged["alias"], flagged["criterion"], flagged["flag_text"]) == ("reviewer-1", CRITERIA[0], "a")
    shown_a = texts[flagged["pair_id"]][0 if flagged["a_is_test"] else 1]
    selected = seen["r1"][0]["selected"]
    assert selected and shown_a[flagged["span_start"]:flagged["span_end"]] == selected

    # STUDY-3 blindness: no arm, novel id, title, model, study id, alias, name or hash anywhere.
    for where, text in await watch.texts():
        for secret in forbidden:
            assert secret not in text, f"{secret!r} in {where}"
        assert not HEX64.search(text), f"a 64-hex hash in {where}"

    # STUDY-4: κ, position bias, shares and intervals computed again from the votes cast.
    per: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
    for r in rows:
        per[r["alias"]][(r["pair_id"], r["criterion"])] = _outcome(r["choice"], r["a_is_test"])
    items = sorted(per["reviewer-1"])
    kappa = _kappa([per["reviewer-1"][k] for k in items], [per["reviewer-2"][k] for k in items])
    assert report["agreement"]["kappa"] == round(kappa, 4) and kappa_shown == f"{round(kappa, 4):.4f}"
    for alias in ("reviewer-1", "reviewer-2"):
        ab = [r["choice"] for r in rows if r["alias"] == alias and r["choice"] in ("a", "b")]
        bias = ab.count("a") / len(ab)
        assert report["positionBias"][alias] == round(bias, 4) and bias_shown[alias] == f"{bias:.2f}"
    assert report["positionBias"]["reviewer-1"] == 1.0
    for criterion in CRITERIA:
        outcomes = [per[a][k] for a in per for k in per[a] if k[1] == criterion]
        wins, losses = outcomes.count("win"), outcomes.count("loss")
        figures = report["criteria"][criterion]
        assert (figures["wins"], figures["losses"], figures["ties"], figures["bothBad"]) == (
            wins, losses, outcomes.count("tie"), outcomes.count("both-bad"))
        by_pair: dict[str, list[Any]] = defaultdict(list)
        for a in per:
            for (pair, c), o in per[a].items():
                if c == criterion:
                    by_pair[pair].append(o)
        expected = win_share_interval(by_pair, seed=STUDY["seed"], resamples=2_000)  # the documented method
        assert expected is not None and (figures["low"], figures["high"]) == tuple(round(v, 4) for v in expected)
        assert 0 <= figures["low"] <= wins / (wins + losses) <= figures["high"] <= 1
        assert intervals_shown[criterion] == (figures["low"], figures["high"])
