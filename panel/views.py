"""The panel's read model: what the pages show, built from the store's read functions.

Everything here returns plain JSON-able dicts. Titles, chapter titles and scene goals come from
the operator's own outline; prose only from `chapter_prose` (a response body, never a URL or a log).
"""

from __future__ import annotations

from typing import Any

from novelbus import store
from novelbus.app.billing import mode_bills
from novelbus.messages.base import tag_of
from novelbus.messages.events import NovelPaused
from novelbus.novel.bill import Prices
from novelbus.novel.length import book_band
from novelbus.novel.next_work import live_units, scene_commits, scene_finished
from novelbus.novel.snapshot import NovelSnapshot

# The four-way split of a turn's raw input (USE-1), in the order the chart stacks them.
INPUT_SPLIT = ("historyChars", "toolResultChars", "packChars", "proseEchoChars")
RECENT_RUNS = 20


def _length(snap: NovelSnapshot) -> dict[str, Any]:
    budget = snap.config.length
    band = book_band(budget)
    return {"kind": budget.kind, "target": budget.targetCharacters if budget.kind == "target" else None,
            "band": list(band) if band else None, "characters": snap.committed_characters}


def _scene_counts(snap: NovelSnapshot) -> tuple[int, int]:
    if snap.outline is None:
        return 0, 0
    scenes = snap.outline.scenes
    return sum(scene_finished(snap, s.chapterId, s.sceneId) for s in scenes), len(scenes)


async def _pause_detail(pool: Any, novel: store.NovelRow) -> str | None:
    if not novel.pause_reason:
        return None
    paused = await store.last_event_payload(pool, novel.novel_id, tag_of(NovelPaused))
    return (paused or {}).get("detail") or None


async def novel_summary(pool: Any, novel: store.NovelRow) -> dict[str, Any]:
    """One row of the novels page: status, progress against the length band, why it paused."""
    snap = await store.load_snapshot(pool, novel.novel_id, prose=False)
    done, total = _scene_counts(snap)
    return {"novelId": novel.novel_id, "title": novel.title, "status": novel.status,
            "pauseReason": novel.pause_reason, "pauseDetail": await _pause_detail(pool, novel),
            "writerMode": novel.writer_mode, "writerShape": novel.config.writerShape,
            "length": _length(snap), "scenesDone": done, "scenes": total, "turns": novel.turns,
            "createdAt": novel.created_at.isoformat()}


async def novels(pool: Any) -> list[dict[str, Any]]:
    return [await novel_summary(pool, n) for n in await store.list_novels(pool)]


def _chapters(snap: NovelSnapshot) -> list[dict[str, Any]]:
    """Chapter and scene progress: per scene done / writing / pending, units and characters."""
    if snap.outline is None:
        return []
    units = live_units(snap)
    chapters = []
    for chapter in snap.outline.ordered_chapters():
        scenes: list[dict[str, Any]] = []
        for scene in snap.outline.scenes_of(chapter.chapterId):
            commits = scene_commits(snap, chapter.chapterId, scene.sceneId)
            mine = [u for u in units if u.chapter_id == chapter.chapterId and u.scene_id == scene.sceneId]
            state = ("done" if scene_finished(snap, chapter.chapterId, scene.sceneId)
                     else "writing" if any(u.state == "claimed" for u in mine)
                     else "started" if commits else "pending")
            scenes.append({"sceneId": scene.sceneId, "order": scene.order, "state": state,
                           "units": len(mine), "commits": len(commits),
                           "characters": sum(c.effective_characters for c in commits)})
        chapters.append({"chapterId": chapter.chapterId, "order": chapter.order, "title": chapter.title,
                         "scenes": scenes, "done": bool(scenes) and all(s["state"] == "done" for s in scenes),
                         "characters": sum(s["characters"] for s in scenes)})
    return chapters


def _sample(s: dict[str, Any]) -> dict[str, Any]:
    keep = ("turn", "unitId", "mode", "calls", "inputChars", "estInputTokens", "outputChars", *INPUT_SPLIT)
    return {k: s.get(k) for k in keep}


async def novel_detail(pool: Any, novel_id: str, prices: Prices | None = None) -> dict[str, Any]:
    """Everything the novel page shows except prose (raises store.NovelNotFound); the usage
    totals' bill per mode at `prices` (SERVE-5: "no prices" when there are none)."""
    totals = await store.usage_totals(pool, novel_id)
    novel = await store.get_novel(pool, novel_id)
    snap = await store.load_snapshot(pool, novel_id, prose=False)
    done, total = _scene_counts(snap)
    claimed = [u for u in await store.list_units(pool, novel_id) if u.state == "claimed"]
    runs = await store.list_writer_runs(pool, novel_id)
    return {
        **await novel_summary(pool, novel),
        "scenesDone": done, "scenes": total,
        "inFlight": [{"unitId": u.unit_id, "mode": u.claimed_mode, "attempt": u.attempt} for u in claimed],
        "outlineRevision": novel.outline_revision,
        "chapters": _chapters(snap),
        "commits": len(snap.commits),
        "counters": {"turns": novel.turns, "writerRuns": novel.writer_runs,
                     "writerOutputChars": novel.writer_output_chars,
                     "consecutiveFailures": novel.consecutive_failures, "stallCount": novel.stall_count},
        "budgets": novel.config.budgets.model_dump(mode="json"),
        "writerRunsRecent": [
            {"runId": r.run_id, "unitId": r.unit_id, "dispatch": r.dispatch, "mode": r.mode,
             "provider": r.provider, "status": r.status, "reason": r.reason, "outputChars": r.output_chars}
            for r in runs[-RECENT_RUNS:]],
        "writerRunsTotal": len(runs),
        "usage": {"recent": [_sample(s) for s in await store.recent_usage(pool, novel_id)],
                  "totals": totals, "split": list(INPUT_SPLIT), "bills": mode_bills(totals, prices)},
    }


async def chapter_prose(pool: Any, novel_id: str, chapter_id: str) -> dict[str, Any] | None:
    """The committed paragraphs of one chapter, in outline order; None for an unknown chapter."""
    snap = await store.load_snapshot(pool, novel_id)
    if snap.outline is None or chapter_id not in {c.chapterId for c in snap.outline.chapters}:
        return None
    chapter = snap.outline.chapter(chapter_id)
    scenes = [{"sceneId": s.sceneId,
               "paragraphs": [p for c in scene_commits(snap, chapter_id, s.sceneId) for p in c.paragraphs]}
              for s in snap.outline.scenes_of(chapter_id)]
    return {"chapterId": chapter_id, "title": chapter.title, "order": chapter.order, "scenes": scenes}
