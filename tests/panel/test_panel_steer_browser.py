"""OPS-2 + PLAN-1/4/5: steering a novel from the panel's novel page, in a real headless Chromium.

A novel paused for `budget` gets a directive (shown pending), a stale revise is refused naming the
current revision, a revision from the form adds a chapter and applies the directive
(`outline.revised` arrives in the live feed, the chapter shows in progress), an invalid budget is
refused naming the field, and raising `budgets.maxTurns` from the form lets it go on to finished.
Everything goes through `novelbus.cmd.steer` like `novelbus novel revise|direct|config`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.app import actions
from novelbus.bench.generate import generate_novel_file
from novelbus.novel.outline import NovelFile
from tests.panel.conftest import Panel

pytestmark = pytest.mark.timeout(180)

DIRECTIVE = "Let it rain in every scene of the new chapter, softly."


async def test_steer_a_budget_paused_novel_from_the_novel_page(
        panel: Panel, browser: Any, shots: Path, caplog: pytest.LogCaptureFixture) -> None:
    """OPS-2, PLAN-1, PLAN-4, PLAN-5"""
    caplog.set_level(logging.DEBUG)
    ctx = panel.rt.ctx
    pool = ctx.pool
    data = generate_novel_file(1, 3, seed=5, unit_chars=300)
    data["title"] = "Steered From The Panel"
    data["config"].update(writerMode="inline", budgets={"maxTurns": 2})
    novel_id = await actions.create(ctx, NovelFile.model_validate(data))

    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    await page.goto(f"{panel.url}novels/{novel_id}")
    await page.locator("#status.paused", has_text="budget").wait_for(timeout=60_000)
    first = (await store.get_novel(pool, novel_id)).outline_revision
    assert first is not None
    # The current revision is shown and prefilled as the expected one; the outline is there read-only.
    await page.locator("#outline-revision", has_text=first).wait_for()
    assert await page.locator("#expect").input_value() == first
    await page.locator("#outline-details summary").click()
    outline = json.loads(await page.locator("#outline-json").inner_text())
    assert [c["chapterId"] for c in outline["chapters"]] == ["ch001"] and len(outline["scenes"]) == 3
    await page.evaluate("window.__noReload = true")

    # --- a directive: pending in the ledger table ---------------------------------------------------
    await page.locator("#directive").fill(DIRECTIVE)
    await page.locator("#btn-direct").click()
    row = page.locator('#requirements tr[data-requirement="req-1"]')
    await row.locator(".badge.pending").wait_for()
    assert DIRECTIVE in await row.inner_text()
    await page.locator("#feed li.requirement-received").wait_for()
    ledger, _ = await store.list_requirements(pool, novel_id)
    assert [(r.requirement_id, r.status, r.text) for r in ledger] == [("req-1", "pending", DIRECTIVE)]

    # --- a revision from the form adds chapter 2 and applies req-1 ----------------------------------
    who = outline["scenes"][0]["participants"]
    layers = {"chapters": outline["chapters"] + [
        {"chapterId": "ch002", "order": 2, "title": "The Second Harbour", "purpose": "The search goes on.",
         "entryCondition": "", "exitCondition": "", "keyEvents": []}],
        "scenes": outline["scenes"] + [{"sceneId": "ch002s01", "chapterId": "ch002", "order": 1,
                                        "goal": "They reach the second harbour in the rain.", "participants": who}]}
    await page.locator("#layers").fill(json.dumps({"outline": layers}, indent=1))
    await page.locator("#reason").fill("add chapter two")
    await page.locator("#apply").fill("req-1")
    await page.locator("#btn-revise").click()
    await page.locator("#revise-result", has_text="2 chapters, 4 scenes").wait_for()
    await page.locator("#feed li.outline-revised").wait_for()  # over SSE
    await page.locator("#chapters .chapter", has_text="The Second Harbour").wait_for()
    second = (await store.get_novel(pool, novel_id)).outline_revision
    assert second != first
    await page.locator("#outline-revision", has_text=second).wait_for()
    assert await page.locator("#expect").input_value() == second  # prefilled again
    await row.locator(".badge.applied").wait_for()
    await page.locator(f'#revisions tr[data-revision="{second}"]', has_text="add chapter two").wait_for()

    # --- a stale expected revision: the conflict names the current one; nothing changes --------------
    await page.locator("#layers").fill(json.dumps({"story": outline["story"] | {"premise": "Another premise."}}))
    await page.locator("#expect").fill(first)
    await page.locator("#btn-revise").click()
    errors = page.locator("#revise-errors")
    await errors.wait_for(state="visible")
    text = await errors.inner_text()
    assert "revision-conflict" in text and "Nothing was changed" in text
    assert await page.locator("#current-revision").inner_text() == second
    assert await page.locator("#expect").get_attribute("aria-invalid") == "true"
    assert (await store.get_novel(pool, novel_id)).outline_revision == second
    assert len(await store.list_revisions(pool, novel_id)) == 2
    await page.locator("#steer").screenshot(path=str(shots / "steer-conflict.png"))
    await page.locator("#btn-use-current").click()
    assert await page.locator("#expect").input_value() == second

    # --- config: an invalid budget names the field; raising maxTurns lets it go on ------------------
    assert (await store.get_novel(pool, novel_id)).pause_reason == "budget"
    field = page.locator("#cfg-budgets-maxTurns")
    assert await field.input_value() == "2"
    await field.fill("-3")
    await page.locator("#btn-config").click()
    note = page.locator('#config-fields .field-note[data-field="budgets.maxTurns"]')
    await note.wait_for(state="visible")
    assert "greater than 0" in await note.inner_text()
    assert "budgets.maxTurns" in await page.locator("#config-errors").inner_text()
    assert (await store.get_novel(pool, novel_id)).config.budgets.maxTurns == 2  # nothing changed
    await field.fill("400")
    await page.locator("#btn-config").click()
    await page.locator("#config-result", has_text="budgets.maxTurns").wait_for()
    await page.locator("#status.finished").wait_for(timeout=90_000)
    await page.locator("#feed li.novel-config-changed").wait_for()
    await page.locator("#chapters .chapter.done", has_text="The Second Harbour").wait_for()
    assert await page.evaluate("window.__noReload === true"), "the page reloaded"
    novel = await store.get_novel(pool, novel_id)
    assert novel.status == "finished" and novel.config.budgets.maxTurns == 400 and novel.turns > 2
    await page.locator("#steer").screenshot(path=str(shots / "steer.png"))
    await page.screenshot(path=str(shots / "novel-steered.png"), full_page=True)

    # The directive text never went into a URL or a log line; no browser errors.
    assert not [u for u in urls if "rain" in u.lower() or "premise" in u.lower()]
    assert DIRECTIVE not in caplog.text and "Second Harbour" not in caplog.text
    # (the browser reports the refused requests themselves: the 409 and the 422 asked for above)
    expected = {f"Failed to load resource: the server responded with a status of {c}" for c in
                ("409 (Conflict)", "422 (Unprocessable Entity)")}
    assert set(console_errors) <= expected and len(console_errors) == 2, console_errors
    await page.close()
