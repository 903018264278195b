"""Commit body checks, business hash, source rewriting and W1 draft parsing (SPEC §16 Commit).

The store runs these inside its commit transaction; the verifier runs them on W1 drafts
(VER-2). Messages name fields and paragraph indexes, never prose (BUS-6).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Literal

import msgspec

from novelbus.novel.body import CanonChange, CommitBody
from novelbus.novel.guard import guard_prose
from novelbus.novel.text import effective_characters

BodyErrorCode = Literal[
    "empty-body",
    "bad-paragraph",
    "bad-scene-completion",
    "bad-canon-source",
    "length-exceeded",
    "schema",
]

_BLANK_LINE_RE = re.compile(r"\n[^\S\n]*\n")
_INLINE_RE = re.compile(r"^inline(?:#(0|[1-9][0-9]*))?$")
_COMMIT_RE = re.compile(r"^(commit-[1-9][0-9]*)(?:#(0|[1-9][0-9]*))?$")
_FENCE_RE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*)\n[ \t]*```$", re.DOTALL)


class BodyError(ValueError):
    """An invalid commit body; ``code`` is stable on the bus, the message names the field."""

    def __init__(self, code: BodyErrorCode, message: str) -> None:
        self.code: BodyErrorCode = code
        super().__init__(message)


def check_body(
    body: CommitBody,
    *,
    known_commits: Mapping[str, int],
    hard_max_remaining: int | None,
) -> None:
    """Validate a commit body in SPEC §16 order; raise on the first problem.

    1. non-empty body (≥ 1 paragraph)                      → ``empty-body``
    2. each paragraph non-blank, no blank line inside      → ``bad-paragraph``
    3. ``sceneCompletion.basis`` non-blank                  → ``bad-scene-completion``
    4. effective characters ≤ ``hard_max_remaining``        → ``length-exceeded``
    5. canon sources: ``inline``, ``inline#i`` (i < paragraph count), or ``commit-N`` /
       ``commit-N#i`` with ``known_commits[commit-N]`` = that commit's paragraph count
                                                            → ``bad-canon-source``
    6. the prose guard (STORE-6)                            → ``novel.guard.ProseGuardError``

    ``hard_max_remaining`` is the book's hard maximum minus the characters already committed
    (None: no hard maximum).
    """
    if not body.paragraphs:
        raise BodyError("empty-body", "paragraphs: the body has no paragraph")
    for i, paragraph in enumerate(body.paragraphs):
        if not paragraph.strip():
            raise BodyError("bad-paragraph", f"paragraphs[{i}]: empty paragraph")
        if _BLANK_LINE_RE.search(paragraph):
            raise BodyError(
                "bad-paragraph",
                f"paragraphs[{i}]: blank line inside a paragraph (split it into paragraphs)",
            )
    if not body.scene_completion.basis.strip():
        raise BodyError("bad-scene-completion", "sceneCompletion.basis: must not be empty")
    if hard_max_remaining is not None:
        size = sum(effective_characters(p) for p in body.paragraphs)
        if size > hard_max_remaining:
            raise BodyError(
                "length-exceeded",
                f"paragraphs: {size} effective characters exceed the {hard_max_remaining} "
                "left under the hard maximum",
            )
    for c, change in enumerate(body.canon_changes):
        for s, source in enumerate(change.sources):
            problem = _source_problem(source, len(body.paragraphs), known_commits)
            if problem is not None:
                raise BodyError("bad-canon-source", f"canonChanges[{c}].sources[{s}]: {problem}")
    guard_prose(body.paragraphs)


def commit_references(body: CommitBody) -> dict[str, int]:
    """Earlier commits the canon sources name: commit id → the highest paragraph index named
    (-1 when only whole commits are named). What the sources check needs from the book."""
    refs: dict[str, int] = {}
    for change in body.canon_changes:
        for source in change.sources:
            m = _COMMIT_RE.match(source)
            if m is not None:
                index = -1 if m.group(2) is None else int(m.group(2))
                refs[m.group(1)] = max(refs.get(m.group(1), -1), index)
    return refs


def _source_problem(source: str, paragraphs: int, known_commits: Mapping[str, int]) -> str | None:
    m = _INLINE_RE.match(source)
    if m is not None:
        if m.group(1) is not None and int(m.group(1)) >= paragraphs:
            return f"paragraph index {m.group(1)} out of range (body has {paragraphs})"
        return None
    m = _COMMIT_RE.match(source)
    if m is not None:
        commit_id = m.group(1)
        if commit_id not in known_commits:
            return f"unknown commit {commit_id}"
        if m.group(2) is not None and int(m.group(2)) >= known_commits[commit_id]:
            return (
                f"paragraph index {m.group(2)} out of range "
                f"({commit_id} has {known_commits[commit_id]})"
            )
        return None
    return "must be 'inline', 'inline#<i>', 'commit-<n>' or 'commit-<n>#<i>'"


def canonical_body_json(body: CommitBody) -> bytes:
    """Canonical JSON of ``{paragraphs, sceneCompletion, canonChanges}``: sorted keys, all
    fields present (defaults included), UTF-8, no whitespace."""
    return msgspec.json.encode(body, order="sorted")


def business_hash(body: CommitBody) -> str:
    """SHA-256 hex of the canonical body JSON; the duplicate-commit key (STORE-2, §16)."""
    return hashlib.sha256(canonical_body_json(body)).hexdigest()


def rewrite_sources(body: CommitBody, commit_id: str) -> list[CanonChange]:
    """Point ``inline`` / ``inline#i`` sources at the new commit (STORE-3)."""
    out: list[CanonChange] = []
    for change in body.canon_changes:
        sources = [
            commit_id + source[len("inline") :] if _INLINE_RE.match(source) else source
            for source in change.sources
        ]
        out.append(msgspec.structs.replace(change, sources=sources))
    return out


def parse_draft(raw: str) -> CommitBody:
    """Decode a W1 writer reply (RUN-2): a JSON commit body, optionally in a ```json fence.

    Nothing but whitespace may surround the object or the fence. Raises
    ``BodyError("schema", …)`` naming the bad field; the reply text is never quoted.
    """
    text = raw.strip()
    fenced = _FENCE_RE.match(text)
    if fenced is not None:
        text = fenced.group(1).strip()
    if not text:
        raise BodyError("schema", "draft: empty reply")
    if not text.startswith("{"):
        raise BodyError(
            "schema", "draft: the reply must be one JSON object (optionally in a ```json fence)"
        )
    try:
        return msgspec.json.decode(text, type=CommitBody)
    except msgspec.ValidationError as e:
        raise BodyError("schema", f"draft: {e}") from None
    except msgspec.DecodeError as e:
        raise BodyError("schema", f"draft: not valid JSON ({e})") from None


def parse_draft_lenient(raw: str) -> CommitBody:
    """`parse_draft`, but tolerant of raw control characters inside JSON strings (MODEL-2).

    Servers constraining output with a JSON grammar may emit a raw newline or tab inside a
    string; the text is then decoded leniently and validated strictly against the commit
    schema. Anything else fails exactly as `parse_draft` does.
    """
    try:
        return parse_draft(raw)
    except BodyError as strict_error:
        text = raw.strip()
        fenced = _FENCE_RE.match(text)
        if fenced is not None:
            text = fenced.group(1).strip()
        if not text.startswith("{"):
            raise
        try:
            value = json.loads(text, strict=False)
        except ValueError:
            raise strict_error from None
        try:
            return msgspec.convert(value, type=CommitBody)
        except msgspec.ValidationError as e:
            raise BodyError("schema", f"draft: {e}") from None
