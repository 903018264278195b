"""OPS-2: the web panel used as an operator would, in a real headless Chromium.

One novel is created from the form, paused right away, switched to another writer mode, resumed
and followed live to `finished` without a reload; a bad file shows its field error and creates
nothing. Every page is saved as a PNG (see conftest.shots).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.bench.generate import generate_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.panel.conftest import Panel

pytestmark = pytest.mark.timeout(240)


def _novel_json() -> str:
    """Big enough (24 scenes) that a pause right after create lands well before the end."""
    data = generate_novel_file(6, 4, seed=3, unit_chars=300)
    data["title"] = "The Panel Test"
    data["config"]["writerMode"] = "subagent"  # the form's writer mode (inline) overrides it
    return json.dumps(data, indent=2)


async def test_create_pause_switch_resume_follow_to_finished_in_a_browser(
        panel: Panel, browser: Any, shots: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """OPS-2"""
    caplog.set_level(logging.DEBUG)
    pool = panel.rt.ctx.pool
    context = await browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = await context.new_page()
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)

    # --- create from the form: paste the JSON, pick writer mode inline ---------------------------
    await page.goto(panel.url)
    await page.locator("#empty").wait_for(state="visible")
    await page.get_by_role("link", name="Create", exact=True).first.click()
    await page.locator("#text").fill(_novel_json())
    await page.locator("#writerMode").select_option("inline")
    await page.locator("#writerShape").select_option("W2")
    await page.screenshot(path=str(shots / "create.png"), full_page=True)
    await page.get_by_role("button", name="Create").click()
    await page.wait_for_url(re.compile(r"/novels/n-[0-9a-f]+$"))
    novel_id = page.url.rsplit("/", 1)[1]

    # --- pause right away ------------------------------------------------------------------------
    await page.locator("#btn-pause:not([disabled])").wait_for()
    await page.locator("#btn-pause").click()
    await page.locator("#status.paused").wait_for()
    assert "user-request" in await page.locator("#status").inner_text()
    assert "Paused: user-request" in await page.locator("#pause").inner_text()
    novel = await store.get_novel(pool, novel_id)
    assert (novel.status, novel.pause_reason, novel.writer_mode) == ("paused", "user-request", "inline")
    await page.evaluate("window.__noReload = true")  # gone if the page ever reloads

    # --- switch mode while paused ----------------------------------------------------------------
    await page.locator("#mode").select_option("subagent")
    await page.locator("#btn-mode").click()
    await page.locator("#modeinfo", has_text="writer mode subagent").wait_for()
    await page.locator("#feed li.novel-mode-switched").wait_for()  # arrived over SSE
    assert (await store.get_novel(pool, novel_id)).writer_mode == "subagent"
    paused_at = (await store.get_novel(pool, novel_id)).turns
    await page.screenshot(path=str(shots / "novel-paused.png"), full_page=True)
    assert paused_at < 24, "the novel finished before the pause could land"
    # Meanwhile, in another tab, the novels page says it is paused, and why.
    tab = await context.new_page()
    await tab.goto(panel.url)
    row = tab.locator(f'#novels tr[data-novel="{novel_id}"]')
    await row.locator(".badge.paused").wait_for()
    assert "user-request" in await row.locator(".pausewhy").inner_text()
    await tab.screenshot(path=str(shots / "novels-paused.png"), full_page=True)
    await tab.close()

    # --- resume and follow it live to finished ---------------------------------------------------
    await page.locator("#btn-resume").click()
    await page.locator("#status.finished").wait_for(timeout=120_000)
    assert await page.evaluate("window.__noReload === true"), "the page reloaded"
    await page.locator("#feed li.novel-finished").wait_for()
    assert await page.locator("#scene-progress").get_attribute("value") == "24"
    novel = await store.get_novel(pool, novel_id)
    assert novel.status == "finished" and novel.writer_mode == "subagent"
    runs = await store.list_writer_runs(pool, novel_id)
    samples = await store.recent_usage(pool, novel_id)
    # The switch took effect from the next unit: every turn after the pause (bar one in flight).
    assert {s["mode"] for s in samples if s["turn"] > paused_at + 1} == {"subagent"}
    assert all(s["mode"] == "inline" for s in samples if s["turn"] <= paused_at)
    await page.locator("#chart svg g.bar").nth(len(samples) - 1).wait_for()
    assert await page.locator("#chart svg g.bar").count() == len(samples)
    assert await page.locator("#runs tbody tr").count() == min(20, len(runs))
    # The prose, read-only, by chapter: the first chapter's paragraphs as committed.
    snap = await store.load_snapshot(pool, novel_id)
    first = [p for c in snap.commits if c.chapter_id == snap.outline.ordered_chapters()[0].chapterId  # type: ignore[union-attr]
             for p in c.paragraphs]
    await page.locator("#prose p").first.wait_for()
    assert await page.locator("#prose p").all_inner_texts() == first
    await page.screenshot(path=str(shots / "novel-finished.png"), full_page=True)

    # --- Markdown download -----------------------------------------------------------------------
    async with page.expect_download() as info:
        await page.locator("#download").click()
    download = await info.value
    md = tmp_path / "novel.md"
    await download.save_as(str(md))
    assert md.read_text().startswith("# The Panel Test\n") and first[0] in md.read_text()

    # --- the novels page -------------------------------------------------------------------------
    await page.get_by_role("link", name="Novels", exact=True).click()
    row = page.locator(f'#novels tr[data-novel="{novel_id}"]')
    await row.locator(".badge.finished").wait_for()
    assert "24/24" in await row.inner_text()
    await page.screenshot(path=str(shots / "novels.png"), full_page=True)

    # No prose in any URL the browser asked for, nor in any log line of the run.
    prose = [p[:40] for c in snap.commits for p in c.paragraphs]
    assert not [u for u in urls if any(p in u for p in prose)]
    assert not [p for p in prose if p in caplog.text]
    assert not [r for r in caplog.records if r.name.startswith(("uvicorn.access", "sse_starlette"))]
    assert not console_errors, console_errors
    await context.close()


async def test_a_bad_file_shows_the_field_error_and_creates_nothing(
        panel: Panel, browser: Any, shots: Path, tmp_path: Path) -> None:
    """OPS-2"""
    data = json.loads(sample_novel_bytes())
    data["outline"]["scenes"][0]["participants"] = ["nobody-here"]
    bad = tmp_path / "bad-novel.json"
    bad.write_text(json.dumps(data))
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(panel.url + "new")
    await page.locator("#file").set_input_files(str(bad))
    await page.get_by_role("button", name="Create").click()
    errors = page.locator("#errors")
    await errors.wait_for(state="visible")
    text = await errors.inner_text()
    assert "Nothing was created" in text
    assert "scenes[0].participants" in text and "nobody-here" in text  # the CLI's words
    assert page.url == panel.url + "new"
    await page.screenshot(path=str(shots / "create-error.png"), full_page=True)

    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    await page.locator("#file").set_input_files(str(empty))
    await page.get_by_role("button", name="Create").click()
    await errors.filter(has_text="empty").wait_for()
    assert await store.list_novels(panel.rt.ctx.pool) == []
    await page.close()
