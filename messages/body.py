"""The commit body schema (SPEC §16 Commit), shared by W1 drafts, the W2 commit tool and the store.

It is part of the wire contract (`claims.CommitUnit`, `runs.WriterResult` and `verify.ValidateDraft`
carry it), so it lives at the bottom layer, in messages/; the domain reads it as `novel.body`.
The one definition: the W2 commit tool's parameter schema is generated from `CommitArgs` (this
body plus the unit id) in `writers.tools`, descriptions included. The semantic rules (non-empty
paragraphs and basis, sources that resolve, length) are checked in one place too,
`novel.commitcheck.check_body`, with stable codes.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

CanonKind = Literal["event", "character-state", "relation", "foreshadowing", "variable"]


class SceneCompletion(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    completed: Annotated[bool, Meta(description="true when this unit reaches the scene goal.")]
    basis: Annotated[str, Meta(description="why (never empty).")]
    outstanding_goals: list[str] = []
    next_anchor: Annotated[
        str | None, Meta(description="where the next unit picks up; null when completed.")
    ] = None


class CanonChange(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    kind: CanonKind
    summary: Annotated[str, Meta(description="the fact, briefly.")]
    sources: Annotated[
        list[str],
        Meta(description="'inline' or 'inline#<paragraph index>' (or an existing 'commit-N[#i]')."),
    ]
    detail: str | None = None
    # Which characters the fact is about; lets the pack pick participants' facts (PACK canon block).
    character_ids: Annotated[
        list[str], Meta(description="ids of the characters it is about.")
    ] = []
    # kind "foreshadowing": the outline item this change plants or resolves (finish guard, §16).
    foreshadowing_id: Annotated[
        str | None, Meta(description="kind foreshadowing: the item's id.")
    ] = None
    foreshadowing_status: Literal["planted", "resolved"] = "resolved"


class CommitBody(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    paragraphs: Annotated[
        list[str],
        Meta(description="prose only, one string per paragraph, no blank line inside one."),
    ]
    scene_completion: SceneCompletion
    canon_changes: list[CanonChange] = []


class CommitArgs(CommitBody, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The W2 commit tool's arguments: the body plus the unit it is for (TOOL-1)."""

    unit_id: Annotated[str, Meta(min_length=1, description="The unit id from the [[unit]] block.")]

    def body(self) -> CommitBody:
        return CommitBody(paragraphs=self.paragraphs, scene_completion=self.scene_completion,
                          canon_changes=self.canon_changes)
