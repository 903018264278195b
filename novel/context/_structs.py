"""The frozen context and its retrieval manifest: data only (CTX-7)."""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.context._request import (
    CONTEXT_SCHEMA,
    MANIFEST_SCHEMA,
    ContextRequest,
    ProfileBudget,
)
from novelbus.novel.context._sources import Readback
from novelbus.novel.context._watermark import Watermark
from novelbus.novel.outline import (
    Chapter,
    Character,
    Foreshadowing,
    LoreEntry,
    Scene,
    Story,
)


class LengthContract(msgspec.Struct, frozen=True, rename="camel"):
    target_min: int
    target_max: int
    stage: str
    remaining: int | None  # characters left in the book; None when unbounded
    committed: int


class TaskLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L0: the current task — never trimmed."""

    title: str
    story: Story
    chapter: Chapter
    scene: Scene
    unit_id: str
    fragment: int
    continuation_anchor: str | None
    outstanding_goals: list[str]
    foreshadowing_due: list[Foreshadowing]  # unresolved items paid off in this chapter
    length: LengthContract


class ProseExcerpt(msgspec.Struct, frozen=True, rename="camel"):
    role: str  # "current-chapter" | "earlier-chapter" | "recall"
    chapter_id: str
    pointers: list[str]  # commit ids (chapters) or commit-N#i (recalled paragraphs)
    commits: int  # commits behind the excerpt
    text: str
    total_chars: int  # before any window or trim
    source_version: int = 0  # first commit seq
    source_offset: int = 0  # character offset inside the source


class ProseLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L1: the continuity baseline (earlier chapters, current chapter), then recalled prose."""

    current: ProseExcerpt
    earlier: list[ProseExcerpt]
    recall: list[ProseExcerpt]


class CanonCard(msgspec.Struct, frozen=True, rename="camel"):
    commit_id: str  # the commit that established the fact
    seq: int
    index: int
    change: CanonChange
    verified: bool  # every pointer resolves to prose at or before asOf; else only a hint


class ForeshadowingCard(msgspec.Struct, frozen=True, rename="camel"):
    item: Foreshadowing
    status: str  # outline status overlaid by commits at or before asOf


class FactsLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L2: work facts, field by field; never the whole store, never future state."""

    characters: list[Character]
    lore: list[LoreEntry]  # declaration order
    canon: list[CanonCard]  # oldest first
    foreshadowing: list[ForeshadowingCard]
    names: dict[str, str]  # identity index: characterId → name, for every id shown


class ReferenceCard(msgspec.Struct, frozen=True, rename="camel"):
    """A licensed reference as a context carries it (CTX-13): what the writer may read, and whence."""

    reference_id: str
    kind: str
    text: str  # at most novel.context.REFERENCE_CHARS
    source: str
    licence: str


NO_REFERENCES = "no licensed references are stored; L3 is empty for every scenario"


class ReferenceLayer(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """L3: licensed references (CTX-13) — those the scenario asks for and the authorisation covers.

    ``patterns`` and ``note`` are always encoded and ``references`` only when there are any, so a
    context without references has the bytes (and hash) it always had (ADR 0007)."""

    patterns: list[str]  # the included references' ids, in context order
    note: str
    references: list[ReferenceCard] = []


class WriterContext(msgspec.Struct, frozen=True, rename="camel"):
    """The full audit object (stays inside the trusted boundary; the writer gets a projection)."""

    request: ContextRequest
    outline_revision: str
    l0: TaskLayer
    l1: ProseLayer
    l2: FactsLayer
    l3: ReferenceLayer
    schema: str = CONTEXT_SCHEMA


class ManifestSource(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    source_version: int
    source_offset: int
    score: int
    chars: int
    verified: bool = True
    digest: str = ""  # CTX-12: `content_digest` of prose and fact sources ("" for the rest)


class ManifestOmission(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    source_version: int
    source_offset: int
    score: int
    reason: str
    count: int = 1  # > 1: this and the next count-1 candidates (all ranked lower), one entry
    digest: str = ""  # CTX-12: `content_digest` of what was read and left out ("" when folded)


class ManifestTrim(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    kept_chars: int
    total_chars: int
    reason: str


class RetrievalManifest(msgspec.Struct, frozen=True, rename="camel"):
    """CTX-5: what was included, omitted and trimmed, and why — ids, versions, counts, hashes
    only (never prose), so it may be stored and echoed."""

    request: ContextRequest
    outline_revision: str
    commits_visible: int
    plan_sha256: str
    order: str
    budget: ProfileBudget
    used_tokens: dict[str, int]
    sources: list[ManifestSource]
    omitted: list[ManifestOmission]
    trims: list[ManifestTrim]
    readback: Readback
    sources_proven: int
    context_sha256: str
    # CTX-11: the extraction state read (None: an in-memory snapshot, which has no ledger).
    watermark: Watermark | None = None
    # CTX-12: SHA-256 per layer, so a re-assembly that differs names the layer it differs in.
    layers: dict[str, str] = {}
    # CTX-13: the outline without its references — two freezes whose arms differ by references
    # alone differ in outlineRevision and the L3 entries, never in this.
    outline_sha256: str = ""
    schema: str = MANIFEST_SCHEMA


class FrozenContext(msgspec.Struct, frozen=True):
    context: WriterContext
    manifest: RetrievalManifest
    context_sha256: str
    manifest_sha256: str

    def manifest_builtins(self) -> dict[str, Any]:
        """The manifest as JSON-ready builtins (what ``store.save_context_freeze`` stores)."""
        out: dict[str, Any] = msgspec.to_builtins(self.manifest)
        return out
