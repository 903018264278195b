"""Hand-built snapshots for the writer tests (no database: tools and packs are pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.outline import NovelFile, outline_revision, parse_novel_file
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import effective_characters

SAMPLE = Path(__file__).resolve().parents[2] / "novel" / "samples" / "sample.json"

CHINESE_NOVEL: dict[str, Any] = {
    "title": "灯塔守夜人",
    "config": {"length": {"kind": "target", "targetCharacters": 6000, "toleranceRatio": 0.2}},
    "outline": {
        "story": {"premise": "守塔人失踪，学徒林雾要在风暴前找到他。", "theme": "守望"},
        "chapters": [{"chapterId": "c1", "order": 1, "title": "熄灭的灯", "purpose": "失踪"}],
        "scenes": [
            {
                "sceneId": "s1",
                "chapterId": "c1",
                "order": 1,
                "goal": "林雾在灯塔里发现日志被撕掉了一页",
                "participants": ["linwu", "laozhou"],
                "timeLocation": "清晨的灯塔顶层",
                "conflict": "老周坚持说守塔人是淹死的",
                "expectedChange": "林雾决定自己去查",
            },
            {
                "sceneId": "s2",
                "chapterId": "c1",
                "order": 2,
                "goal": "林雾去港口打听消息",
                "participants": ["linwu"],
            },
        ],
        "characters": [
            {"characterId": "linwu", "name": "林雾", "identitySummary": "十七岁的学徒"},
            {"characterId": "laozhou", "name": "老周", "identitySummary": "港务长"},
        ],
        "lore": [
            {
                "entryId": "lamp",
                "keys": ["灯塔"],
                "content": "灯塔的大灯用煤油点燃，每夜要添两次油。",
            },
            {"entryId": "reef", "keys": ["暗礁"], "content": "港外有一片叫姐妹礁的暗礁。"},
        ],
    },
}


def novel_file(data: dict[str, Any]) -> NovelFile:
    return parse_novel_file(json.dumps(data, ensure_ascii=False))


def snapshot_of(
    nf: NovelFile,
    *,
    novel_id: str = "n-test",
    units: list[UnitView] | None = None,
    commits: list[CommitView] | None = None,
    notes: list[tuple[str, str]] | None = None,
) -> NovelSnapshot:
    outline = nf.outline
    if units is None:
        first = outline.scenes_of(outline.ordered_chapters()[0].chapterId)[0]
        units = [
            UnitView(
                unit_id="u-1",
                chapter_id=first.chapterId,
                scene_id=first.sceneId,
                fragment=1,
                state="claimed",
                attempt=1,
            )
        ]
    commits = commits or []
    return NovelSnapshot(
        novel_id=novel_id,
        title=nf.title,
        status="active",
        pause_reason=None,
        config=nf.config,
        outline=outline,
        outline_revision=outline_revision(None, "create", outline),
        units=units,
        commits=commits,
        as_of_seq=commits[-1].seq if commits else 0,
        notes=notes or [],
    )


def make_commit(
    seq: int,
    unit_id: str,
    chapter_id: str,
    scene_id: str,
    paragraphs: list[str],
    *,
    completed: bool = True,
    canon: list[CanonChange] | None = None,
) -> CommitView:
    return CommitView(
        commit_id=f"commit-{seq}",
        seq=seq,
        unit_id=unit_id,
        chapter_id=chapter_id,
        scene_id=scene_id,
        paragraphs=paragraphs,
        scene_completion=SceneCompletion(completed=completed, basis="done"),
        canon_changes=canon or [],
        effective_characters=sum(effective_characters(p) for p in paragraphs),
        body_hash="f" * 64,
        paragraph_count=len(paragraphs),
    )


@pytest.fixture(scope="session")
def sample_file() -> NovelFile:
    return parse_novel_file(SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def chinese_file() -> NovelFile:
    return novel_file(CHINESE_NOVEL)


@pytest.fixture
def sample_snapshot(sample_file: NovelFile) -> NovelSnapshot:
    return snapshot_of(sample_file)


@pytest.fixture
def sample_snapshot_with_prose(sample_file: NovelFile) -> NovelSnapshot:
    """The sample after its first scene was committed; the second scene is being written."""
    outline = sample_file.outline
    ch = outline.ordered_chapters()[0].chapterId
    s1, s2 = outline.scenes_of(ch)[:2]
    who = s1.participants[0]
    first = make_commit(
        1,
        "u-1",
        ch,
        s1.sceneId,
        [
            "Wren rowed out before the gulls were up, the oars cold in her hands.",
            "The lamp was cold. The door stood open and the keeper's chair was empty.",
        ],
        canon=[
            CanonChange(
                kind="character-state",
                summary="Wren is alone on the rock and afraid for Elias.",
                sources=["commit-1#1"],
                character_ids=[who],
            )
        ],
    )
    units = [
        UnitView(
            unit_id="u-1",
            chapter_id=ch,
            scene_id=s1.sceneId,
            fragment=1,
            state="committed",
            attempt=1,
        ),
        UnitView(
            unit_id="u-2",
            chapter_id=ch,
            scene_id=s2.sceneId,
            fragment=1,
            state="claimed",
            attempt=1,
        ),
    ]
    return snapshot_of(
        sample_file,
        units=units,
        commits=[first],
        notes=[("n1", "Remember: Wren hates the smell of paraffin; Elias taught her knots.")],
    )
