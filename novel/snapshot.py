"""Immutable store snapshots: the only input of the pure decision functions (ARCH-3, PACK-1).

The store builds these (store.snapshots.load_snapshot); pure functions never touch the database.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.outline import NovelConfig, Outline

UnitState = Literal["prepared", "claimed", "committed", "superseded"]
NovelStatus = Literal["active", "paused", "finished"]


class UnitView(msgspec.Struct, frozen=True):
    unit_id: str
    chapter_id: str
    scene_id: str
    fragment: int  # 1 for the scene's first unit, 2.. for continuation units
    state: UnitState
    attempt: int
    continuation_anchor: str | None = None
    last_error: str | None = None


class CommitView(msgspec.Struct, frozen=True):
    commit_id: str  # "commit-<seq>"
    seq: int  # novel-wide commit sequence, 1-based, strictly increasing in write order
    unit_id: str
    chapter_id: str
    scene_id: str
    paragraphs: list[str]
    scene_completion: SceneCompletion
    # sources already rewritten by the store: "inline#2" -> "commit-7#2"
    canon_changes: list[CanonChange]
    effective_characters: int
    body_hash: str
    # How many paragraphs the body has, also when `paragraphs` was not read (an index without
    # prose): what a canon source's paragraph index is checked against (CTX-4, STORE-3).
    paragraph_count: int


class NovelSnapshot(msgspec.Struct, frozen=True):
    novel_id: str
    title: str
    status: NovelStatus
    pause_reason: str | None
    config: NovelConfig
    outline: Outline | None
    outline_revision: str | None
    units: list[UnitView]  # in creation order
    commits: list[CommitView]  # in seq order; only commits visible at `as_of_seq`
    as_of_seq: int  # the last commit seq this snapshot includes (0 = none)
    notes: list[tuple[str, str]] = []  # author memory: (noteId, text)
    # The requirements ledger as next_work needs it (PLAN-4): open counts and the watermark.
    requirements_pending: int = 0
    requirements_blocked: int = 0
    requirement_watermark: int = 0
    read_on: str | None = None  # CTX-13: the read's date (UTC, ISO), for licensed references' expiry

    @property
    def committed_characters(self) -> int:
        return sum(c.effective_characters for c in self.commits)
