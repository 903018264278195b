"""CTX-12: the panel shows `novelbus context verify`'s result per novel, over plain HTTP against
real NATS + PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from novelbus.app import actions
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.panel.conftest import Panel
from tests.panel.test_panel_http import http


async def test_the_panel_shows_how_many_freezes_were_reproduced_and_the_source_that_differs(panel: Panel) -> None:
    """CTX-12: after two units, every freeze is reproduced (API and page); after a commit row is
    changed behind the store's back, the page says `mismatch` and names `commit-1`."""
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    config = nf.config.model_copy(update={"writerMode": "inline", "extractor": "offline", "canonSource": "both",
                                          "budgets": nf.config.budgets.model_copy(update={"maxTurns": 3})})
    paused = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        if b'"novel.paused"' in msg.data and not paused.done():
            paused.set_result(True)

    ctx = panel.rt.ctx
    sub = await ctx.nc.subscribe(ctx.subjects.events_of(None), cb=on_event)
    try:
        novel_id = await actions.create(ctx, nf.model_copy(update={"config": config}))
        await asyncio.wait_for(paused, 60)
    finally:
        await sub.unsubscribe()
    status, _, body = await http(f"{panel.url}api/novels/{novel_id}/context-verify")
    report = json.loads(body)
    assert status == 200 and report["freezes"] == report["reproduced"] >= 3 and report["mismatches"] == []
    status, _, page = await http(f"{panel.url}novels/{novel_id}/context")
    assert status == 200 and b">reproduced<" in page
    # the extractor may still freeze a context after the pause: the page counts at least as many
    counts = re.search(rb'<span id="verify-counts">(\d+) of (\d+)</span>', page)
    assert counts is not None, page
    assert int(counts[1]) == int(counts[2]) >= report["freezes"]

    await ctx.pool.execute(
        "UPDATE commits SET body = jsonb_set(body, '{paragraphs,-1}', to_jsonb('A changed line.'::text))"
        " WHERE novel_id = $1 AND seq = 1", novel_id)
    status, _, page = await http(f"{panel.url}novels/{novel_id}/context")
    assert status == 200 and b">mismatch<" in page and b"commit-1" in page
    status, _, _ = await http(f"{panel.url}novels/n-nothere/context")
    assert status == 404
