"""Outline and novel-file models (SPEC §16 BASE), validated with pydantic at the edge.

Field names follow the wire/file format (camelCase) on purpose: an outline file,
a tool result and the store's JSON columns all use the same spelling.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_ID_RE = re.compile(ID_PATTERN)

WriterMode = Literal["inline", "subagent"]
WriterShape = Literal["W1", "W2"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Story(_Model):
    premise: str
    theme: str = ""
    mainConflict: str = ""
    endingDirection: str = ""
    taboos: list[str] = Field(default_factory=list)
    style: str = ""


class Relation(_Model):
    characterId: str = Field(pattern=ID_PATTERN)
    description: str


class Character(_Model):
    characterId: str = Field(pattern=ID_PATTERN)
    name: str = Field(min_length=1)
    initialState: str = ""
    motivation: str = ""
    arc: str = ""
    relations: list[Relation] = Field(default_factory=list)
    identitySummary: str | None = None
    description: str | None = None
    personality: str | None = None


class Chapter(_Model):
    chapterId: str = Field(pattern=ID_PATTERN)
    order: int = Field(gt=0)
    title: str = ""
    purpose: str = ""
    entryCondition: str = ""
    exitCondition: str = ""
    keyEvents: list[str] = Field(default_factory=list)


class Scene(_Model):
    sceneId: str = Field(pattern=ID_PATTERN)
    chapterId: str = Field(pattern=ID_PATTERN)
    order: int = Field(gt=0)
    goal: str = Field(min_length=1)
    timeLocation: str = ""
    causality: str = ""
    conflict: str = ""
    expectedChange: str = ""
    participants: list[str] = Field(default_factory=list)
    continuationAnchor: str | None = None


class LoreEntry(_Model):
    entryId: str = Field(pattern=ID_PATTERN)
    keys: list[str] = Field(default_factory=list)
    content: str
    disabled: bool = False


class Foreshadowing(_Model):
    id: str = Field(pattern=ID_PATTERN)
    description: str
    plantAt: str | None = None
    payoffAt: str | None = None
    required: bool = False
    status: Literal["open", "planted", "resolved"] = "open"


def _unique(items: list[Any], attr: str, layer: str) -> None:
    seen: set[str] = set()
    for item in items:
        key = getattr(item, attr)
        if key in seen:
            raise ValueError(f"{layer}: duplicate {attr} {key!r}")
        seen.add(key)


class Outline(_Model):
    story: Story
    chapters: list[Chapter] = Field(default_factory=list)
    scenes: list[Scene] = Field(default_factory=list)
    characters: list[Character] = Field(default_factory=list)
    lore: list[LoreEntry] = Field(default_factory=list)
    foreshadowing: list[Foreshadowing] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_references(self) -> Outline:
        _unique(self.chapters, "chapterId", "chapters")
        _unique(self.scenes, "sceneId", "scenes")
        _unique(self.characters, "characterId", "characters")
        _unique(self.lore, "entryId", "lore")
        _unique(self.foreshadowing, "id", "foreshadowing")
        orders = [c.order for c in self.chapters]
        if len(set(orders)) != len(orders):
            raise ValueError("chapters: order values must be unique")
        chapter_ids = {c.chapterId for c in self.chapters}
        char_ids = {c.characterId for c in self.characters}
        per_chapter: dict[str, set[int]] = {}
        for i, s in enumerate(self.scenes):
            if s.chapterId not in chapter_ids:
                raise ValueError(f"scenes[{i}].chapterId: unknown chapter {s.chapterId!r}")
            for p in s.participants:
                if p not in char_ids:
                    raise ValueError(f"scenes[{i}].participants: unknown character {p!r}")
            seen = per_chapter.setdefault(s.chapterId, set())
            if s.order in seen:
                raise ValueError(
                    f"scenes[{i}].order: duplicate order {s.order} in chapter {s.chapterId!r}"
                )
            seen.add(s.order)
        for i, f in enumerate(self.foreshadowing):
            for field in ("plantAt", "payoffAt"):
                ref = getattr(f, field)
                if ref is not None and ref not in chapter_ids:
                    raise ValueError(f"foreshadowing[{i}].{field}: unknown chapter {ref!r}")
        return self

    # --- ordered views used by the pure functions -------------------------------------------
    def ordered_chapters(self) -> list[Chapter]:
        return sorted(self.chapters, key=lambda c: c.order)

    def scenes_of(self, chapter_id: str) -> list[Scene]:
        return sorted((s for s in self.scenes if s.chapterId == chapter_id), key=lambda s: s.order)

    def chapter(self, chapter_id: str) -> Chapter:
        for c in self.chapters:
            if c.chapterId == chapter_id:
                return c
        raise KeyError(chapter_id)

    def scene(self, scene_id: str) -> Scene:
        for s in self.scenes:
            if s.sceneId == scene_id:
                return s
        raise KeyError(scene_id)

    def character(self, character_id: str) -> Character:
        for c in self.characters:
            if c.characterId == character_id:
                return c
        raise KeyError(character_id)


class LengthBudget(_Model):
    """`unbounded` or a character target (SPEC §16 Length)."""

    kind: Literal["unbounded", "target"] = "target"
    targetCharacters: int = Field(default=20_000, gt=0)
    toleranceRatio: float = Field(default=0.1, ge=0, lt=1)
    hardMaximumCharacters: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_hard_max(self) -> LengthBudget:
        if (
            self.hardMaximumCharacters is not None
            and self.hardMaximumCharacters < self.targetCharacters
        ):
            raise ValueError("hardMaximumCharacters must be >= targetCharacters")
        return self


class ExternalRetry(_Model):
    maxAttempts: int = Field(default=3, ge=1)
    backoffMs: int = Field(default=2_000, ge=0)


class Budgets(_Model):
    """Run budgets (SPEC §16 Budgets). Invalid values are rejected, never clamped."""

    maxTurns: int = Field(default=200, gt=0)
    maxDurationMs: int = Field(default=3_600_000, gt=0)
    stallThresholdTurns: int = Field(default=6, gt=0)
    consecutiveFailureLimit: int = Field(default=3, gt=0)
    externalRetry: ExternalRetry = Field(default_factory=ExternalRetry)
    writerDispatchLimit: int = Field(default=3, ge=1, le=20)


class NovelConfig(_Model):
    writerMode: WriterMode = "subagent"
    writerShape: WriterShape = "W2"
    continuityProfile: Literal["bounded", "wide"] = "bounded"
    budgets: Budgets = Field(default_factory=Budgets)
    length: LengthBudget = Field(default_factory=LengthBudget)


class NovelFile(_Model):
    """What `novelbus novel create FILE` reads."""

    novelId: str | None = Field(default=None, pattern=ID_PATTERN)
    title: str = Field(min_length=1)
    config: NovelConfig = Field(default_factory=NovelConfig)
    outline: Outline

    @field_validator("title")
    @classmethod
    def _strip_title(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("title must not be blank")
        return v.strip()


class OutlineError(ValueError):
    """A bad outline or novel file; the message names every offending field."""

    code = "bad-outline"


def describe_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{loc}: {e['msg']}")
    return "; ".join(lines)


def parse_novel_file(raw: bytes | str) -> NovelFile:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OutlineError(f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    try:
        return NovelFile.model_validate(data)
    except ValidationError as e:
        raise OutlineError(describe_validation_error(e)) from None


def outline_revision(parent: str | None, reason: str, outline: Outline) -> str:
    """Content-derived revision id: a hash over parent revision, reason and payload (SPEC §16)."""
    payload = outline.model_dump(mode="json")
    blob = json.dumps(
        {"parent": parent, "reason": reason, "outline": payload},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "r-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def is_valid_id(value: str) -> bool:
    return bool(_ID_RE.match(value))
