"""End to end: the bundled sample novel written by all six actors over real NATS + PostgreSQL."""

from __future__ import annotations

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.messages import events as ev
from novelbus.novel.export import export_markdown
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel


async def test_sample_novel_completes_with_one_commit_per_unit(stack: Runtime) -> None:
    """DRV-1, DRV-2, DRV-5, STORE-2, VER-1: the demo novel finishes; every unit has exactly one
    commit; prose order follows outline order; the Markdown export holds every scene."""
    nf = parse_novel_file(sample_novel_bytes())
    novel_id, events = await run_novel(stack, nf)
    pool = stack.ctx.pool

    novel = await store.get_novel(pool, novel_id)
    assert novel.status == "finished"
    snap = await store.load_snapshot(pool, novel_id)
    assert snap.outline is not None
    counts = await store.count_commits_per_unit(pool, novel_id)
    live_units = [u for u in snap.units if u.state != "superseded"]
    assert live_units and all(counts.get(u.unit_id) == 1 for u in live_units)
    assert all(u.state == "committed" for u in live_units)

    # prose order follows the outline: commit order == (chapter order, scene order)
    chapter_order = {c.chapterId: c.order for c in snap.outline.chapters}
    scene_order = {s.sceneId: s.order for s in snap.outline.scenes}
    keys = [(chapter_order[c.chapter_id], scene_order[c.scene_id]) for c in snap.commits]
    assert keys == sorted(keys)
    assert {c.scene_id for c in snap.commits} == {s.sceneId for s in snap.outline.scenes}

    md = export_markdown(snap)
    for c in snap.commits:
        assert c.paragraphs[0] in md
    for chapter in snap.outline.chapters:
        assert chapter.title in md

    # USE-3: writerRuns counts successful delegations; the usage ring has one sample per turn
    assert novel.writer_runs == len(snap.commits)
    samples = await store.recent_usage(pool, novel_id)
    assert len(samples) == len(snap.commits)
    assert all(s["inputChars"] > 0 for s in samples)

    types = [type(e) for e in events]
    assert types.count(ev.UnitCommitted) == len(snap.commits)
    assert types.count(ev.ChapterCompleted) == len(snap.outline.chapters)
    assert ev.ToolStarted in types  # W2: research before narration (RUN-3)
