"""STUDY-1: the study file and its registration.

A study file names a novel file (a path relative to the study file, or the novel file's content
inline), two or more arms (each a delta over the novel's config), the variable under test, the
criteria, the scenes sampled and the decision rule. `parse_study_file` validates it like a novel
file (every error names the field) and refuses arms that differ in a field other than the
variable under test (STUDY-8). `registration` is the canonical form that is frozen and hashed
once any arm starts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from novelbus.novel.outline import (
    NovelConfig,
    NovelFile,
    OutlineError,
    describe_validation_error,
    parse_novel_file,
)
from novelbus.novel.roles.judge import CRITERIA
from novelbus.novel.study._variables import VARIABLES, config_differences, refused_differences

# ConStory-Bench's five error categories for long stories (a flag names one).
FLAG_CATEGORIES: tuple[str, ...] = ("characterization", "factual-detail", "narrative-style", "timeline-plot",
                                    "world-building")
CHOICES: tuple[str, ...] = ("a", "b", "tie", "both-bad")
ARM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"


class StudyError(ValueError):
    """A bad study file; the message names every offending field."""

    code = "bad-study"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Model):
    """The pre-registered decision rule (STUDY-6)."""

    notWorseMargin: float = Field(default=0.1, ge=0, lt=0.5, strict=True)  # of the win share, below 0.5
    minPairs: int = Field(default=6, ge=1, le=10_000, strict=True)  # pairs with enough reviewers
    minReviewersPerPair: int = Field(default=2, ge=1, le=100, strict=True)  # people per pair
    judgeKappa: float = Field(default=0.4, ge=-1, le=1, strict=True)  # a model judge counts from here
    judgePositionConsistency: float = Field(default=0.65, ge=0, le=1, strict=True)
    costRatio: float = Field(default=0.40, gt=0, le=10, strict=True)  # raw input, test / baseline
    bootstrap: int = Field(default=2_000, ge=100, le=100_000, strict=True)  # resamples of the interval


class SceneRef(_Model):
    chapterId: str = Field(min_length=1)
    sceneId: str = Field(min_length=1)


class SceneSample(_Model):
    """`sample` scenes drawn with `seed` from the outline's scenes (all of them when fewer)."""

    sample: int = Field(ge=1, le=100_000, strict=True)
    seed: int = Field(default=0, ge=0, strict=True)


class StudyFile(_Model):
    title: str = Field(min_length=1, max_length=200)
    novel: str | dict[str, Any]
    variable: str
    compare: tuple[str, str]
    arms: dict[str, dict[str, Any]]
    criteria: tuple[str, ...] = CRITERIA
    scenes: Literal["all"] | list[SceneRef] | SceneSample = "all"
    rule: Rule = Field(default_factory=Rule)
    seed: int = Field(default=0, ge=0, strict=True)  # positions, reviewer orders, the bootstrap
    judge: str | None = None  # a model judge run as one more reviewer: `offline` or a provider spec

    @field_validator("variable")
    @classmethod
    def _known_variable(cls, v: str) -> str:
        if v not in VARIABLES:
            raise ValueError(f"{v!r} is not a variable a study can test; one of: {', '.join(sorted(VARIABLES))}")
        return v

    @field_validator("criteria")
    @classmethod
    def _criteria(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        import re

        if not v:
            raise ValueError("at least one criterion")
        if len(set(v)) != len(v):
            raise ValueError("criteria must be distinct")
        for name in v:
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", name):
                raise ValueError(f"{name!r} is not a criterion name (lower-case letters, digits, '_' or '-')")
        return v

    @field_validator("arms")
    @classmethod
    def _arms(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        import re

        if len(v) < 2:
            raise ValueError("a study has at least two arms")
        for name in v:
            if not re.fullmatch(ARM_NAME, name):
                raise ValueError(f"{name!r} is not an arm name (1-32 letters, digits, '_' or '-')")
        return v

    @model_validator(mode="after")
    def _compare_names_arms(self) -> StudyFile:
        test, base = self.compare
        for name in (test, base):
            if name not in self.arms:
                raise ValueError(f"compare: {name!r} is not an arm (arms: {', '.join(self.arms)})")
        if test == base:
            raise ValueError("compare: the arm under test and its baseline must differ")
        return self


def _deep_merge(base: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class Study:
    """A validated study: the file, its novel, and each arm's novel config."""

    def __init__(self, file: StudyFile, novel: NovelFile, novel_data: dict[str, Any],
                 arm_configs: dict[str, NovelConfig]) -> None:
        self.file = file
        self.novel = novel
        self.novel_data = novel_data  # the novel file as JSON, for the registration
        self.arm_configs = arm_configs

    @property
    def test_arm(self) -> str:
        return self.file.compare[0]

    @property
    def base_arm(self) -> str:
        return self.file.compare[1]

    def arm_novel(self, arm: str) -> NovelFile:
        """The novel file an arm runs: the study's novel with the arm's config, no fixed id."""
        return self.novel.model_copy(update={"novelId": None, "config": self.arm_configs[arm]})

    def registration(self) -> dict[str, Any]:
        """What is frozen and hashed once any arm starts (STUDY-1)."""
        return {"schema": "novelbus.study/1", "study": self.file.model_dump(mode="json", exclude={"novel"}),
                "novel": self.novel_data}


def registration_hash(registration: Mapping[str, Any]) -> str:
    """sha256 of the registration as canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(registration, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def parse_study_file(raw: bytes | str, load_novel: Callable[[str], bytes] | None = None) -> Study:
    """Read a study file; every error names the field. `load_novel(path)` reads a novel file the
    study names by path (relative to the study file: the caller resolves it); without it only an
    inline novel is accepted. Raises StudyError."""
    if not raw.strip():
        raise StudyError('the file is empty: a study file is one JSON object {"title": …, "novel": …, '
                         '"variable": …, "compare": […], "arms": {…}} (docs/studies.md)')
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise StudyError(f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise StudyError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(data, dict):
        raise StudyError("a study file is one JSON object")
    try:
        file = StudyFile.model_validate(data)
    except ValidationError as e:
        raise StudyError(describe_validation_error(e)) from None
    if isinstance(file.novel, str):
        if load_novel is None:
            raise StudyError("novel: a path, but this study file was given without a directory; give the novel "
                             "file's content inline")
        try:
            novel_raw = load_novel(file.novel)
        except OSError as e:
            raise StudyError(f"novel: cannot read {file.novel!r}: {e.strerror or type(e).__name__}") from None
    else:
        novel_raw = json.dumps(file.novel, ensure_ascii=False).encode()
    try:
        novel = parse_novel_file(novel_raw)
        novel_data = json.loads(novel_raw)
    except OutlineError as e:
        raise StudyError(f"novel: {e}") from None
    base_config = novel_data.get("config") or {}
    configs: dict[str, NovelConfig] = {}
    merged: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for arm, delta in file.arms.items():
        merged[arm] = _deep_merge(base_config, delta)
        try:
            configs[arm] = NovelConfig.model_validate(merged[arm])
        except ValidationError as e:
            errors.extend(f"arms.{arm}.{part}" for part in describe_validation_error(e).split("; "))
    if errors:
        raise StudyError("; ".join(errors))
    for ref in file.scenes if isinstance(file.scenes, list) else ():
        try:
            novel.outline.scene(ref.sceneId)
        except KeyError:
            raise StudyError(f"scenes: {ref.sceneId!r} is not a scene of the novel's outline") from None
    # STUDY-8: arms may differ only in what the variable under test changes.
    names = list(file.arms)
    for other in names[1:]:
        diffs = config_differences(configs[names[0]].model_dump(mode="json"), configs[other].model_dump(mode="json"))
        refused = refused_differences(file.variable, diffs)
        if refused:
            raise StudyError(f"arms.{other}: differs from arms.{names[0]} in {', '.join(refused)}, which is not the "
                             f"variable under test ({file.variable!r}); a study changes one variable only")
    return Study(file, novel, novel_data, configs)


def study_from_registration(registration: Mapping[str, Any]) -> Study:
    """The study a stored registration describes (its novel is inline there)."""
    return parse_study_file(json.dumps({**registration["study"], "novel": registration["novel"]}, ensure_ascii=False))
