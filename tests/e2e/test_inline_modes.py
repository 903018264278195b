"""DRV-3 with the inline path: a mode switch takes effect from the next unit; a claimed unit
finishes in the mode it was claimed in, and its usage is accounted in that mode."""

from __future__ import annotations

from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.inline import BRIEF_HEADER, session_id
from tests.waiting import drive


async def test_switching_inline_to_subagent_applies_from_the_next_unit(stack: Runtime) -> None:
    """DRV-3"""
    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes())
    config = nf.config.model_copy(update={"writerMode": "inline"})
    novel_id = await store.create_novel(
        ctx.pool, nf.model_copy(update={"novelId": None, "config": config})
    )
    commits = 0

    async def switch_after_two_commits(e: Any) -> None:
        nonlocal commits
        if isinstance(e, ev.UnitCommitted):
            commits += 1
            if commits == 2:  # switch while the novel runs
                await store.set_writer_mode(ctx.pool, novel_id, "subagent")

    driven = await drive(stack, novel_id, timeout=120, on_event=switch_after_two_commits)
    assert isinstance(driven.final, ev.NovelFinished), driven.final

    samples = await store.recent_usage(ctx.pool, novel_id)
    modes = [s["mode"] for s in samples]
    switch = modes.index("subagent")
    assert switch >= 2 and modes == ["inline"] * switch + ["subagent"] * (len(modes) - switch)
    units = {u.unit_id: u for u in await store.list_units(ctx.pool, novel_id)}
    for s in samples:  # accounted in the mode the unit was claimed in
        assert units[s["unitId"]].claimed_mode == s["mode"]
    totals = await store.usage_totals(ctx.pool, novel_id)
    assert (
        totals["inline"]["samples"] == switch
        and totals["subagent"]["samples"] == len(modes) - switch
    )
    session = await store.load_session(ctx.pool, session_id(novel_id))
    assert session is not None
    briefs = [m for m in session.history if str(m.get("content") or "").startswith(BRIEF_HEADER)]
    assert len(briefs) == switch  # subagent units never touched the author session
