"""The commit body schema (SPEC §16 Commit), shared by W1 drafts, the W2 commit tool and the store."""

from __future__ import annotations

from typing import Literal

import msgspec

CanonKind = Literal["event", "character-state", "relation", "foreshadowing", "variable"]


class SceneCompletion(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    completed: bool
    basis: str
    outstanding_goals: list[str] = []
    next_anchor: str | None = None


class CanonChange(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    kind: CanonKind
    summary: str
    sources: list[str]
    detail: str | None = None
    # Which characters the fact is about; lets the pack pick participants' facts (PACK canon block).
    character_ids: list[str] = []
    # kind "foreshadowing": the outline item this change plants or resolves (finish guard, §16).
    foreshadowing_id: str | None = None
    foreshadowing_status: Literal["planted", "resolved"] = "resolved"


class CommitBody(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    paragraphs: list[str]
    scene_completion: SceneCompletion
    canon_changes: list[CanonChange] = []
