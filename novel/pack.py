"""Writer pack (SPEC §7, PACK-1..5): the writer's projection (CTX-8) of a frozen context.

``render_writer_pack(frozen, shape)`` renders the pack from a ``novel.context.FrozenContext``;
``render_pack(snapshot, unit_id, shape)`` is the pure shortcut that assembles the context from
an in-memory snapshot first (same snapshot, same bytes, same hashes — PACK-1).

Text format (other code parses it, see ``parse_pack``)::

    [[protocol]]
    - bullet line
    ...

    [[story]]
    key: value
    ...

Each block starts with a header line ``[[name]]`` and holds ``key: value`` lines, or ``- ``
bullet lines for lists (a character bullet carries indented ``  key: value`` lines); blocks are
separated by one blank line and the text ends with a newline. The prose blocks
(``earlier-chapters``, ``prose-tail``) are the exception: their body is raw prose, paragraphs
separated by blank lines, so split blocks on the header lines, not on blank lines. Values are
single-line (whitespace collapsed); truncated values end with ``…``; empty fields and empty
blocks are omitted.

Block order: ``protocol, story, style-constraints, pattern-references, characters, chapter`` (the
stable prefix, PACK-2/3) then
``scene, lore, canon, prose-tail, foreshadowing, unit``. The prefix is everything before
``[[scene]]``, including the blank separator line, so ``text == prefix + rest``. The ``wide``
continuity profile adds ``earlier-chapters`` (the four preceding chapters in full; it changes
only at a chapter boundary, so it closes the stable prefix) and ``recalled-prose`` (paragraphs
recalled through canon pointers, in the tail before ``prose-tail``). A novel with licensed
references (CTX-13, L3) adds the writer's ``patternReferences`` (block ``pattern-references``: the
references its context carries, in a stable order, bounded) and ``styleConstraints`` (block
``style-constraints``), both in the stable prefix, in both shapes.

The writer sees creative fields only (CTX-8): never run, claim or delegation ids, tokens,
hashes, manifests, outline revisions, attempts, last errors, pause reasons or verdicts.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from typing import Literal

import msgspec

from novelbus.novel.body import body_field_guide, body_shape
from novelbus.novel.context import (
    HEADER_RE,
    MAX_CANON_FACTS,
    MAX_CHARACTERS,
    MAX_FORESHADOWING,
    MAX_LORE_ENTRIES,
    PROSE_TAIL_LIMIT,
    CanonCard,
    ContextInputError,
    FrozenContext,
    IdentityCache,
    WriterPackError,
    freeze_from_snapshot,
)
from novelbus.novel.outline import Chapter, Character, Scene, Story
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.text import cached_cjk_count, one_line, tokens_of, truncate

__all__ = [
    "BLOCK_ORDER",
    "MAX_CANON_FACTS",
    "MAX_CHARACTERS",
    "MAX_FORESHADOWING",
    "MAX_LORE_ENTRIES",
    "PREFIX_BLOCKS",
    "PROSE_TAIL_LIMIT",
    "TRIMMED_BLOCKS",
    "WriterPack",
    "WriterPackError",
    "block_fields",
    "parse_pack",
    "render_pack",
    "render_writer_pack",
]

PackShape = Literal["full", "trimmed"]

BLOCK_ORDER: tuple[str, ...] = (
    "protocol",
    "story",
    "style-constraints",
    "pattern-references",
    "characters",
    "chapter",
    "earlier-chapters",
    "scene",
    "lore",
    "canon",
    "recalled-prose",
    "prose-tail",
    "foreshadowing",
    "unit",
)
PREFIX_BLOCKS: tuple[str, ...] = ("protocol", "story", "style-constraints", "pattern-references", "characters",
                                  "chapter", "earlier-chapters")
TRIMMED_BLOCKS: tuple[str, ...] = (
    "protocol",
    "story",
    "style-constraints",
    "pattern-references",
    "chapter",
    "earlier-chapters",
    "scene",
    "recalled-prose",
    "prose-tail",
    "unit",
)
PROSE_BLOCKS: tuple[str, ...] = ("earlier-chapters", "prose-tail")

# §7 limits, in code points (the counts live in novel.context, which selects the cards).
STORY_FIELD_LIMIT = 400
CHAPTER_FIELD_LIMIT = 300
SCENE_FIELD_LIMIT = 300
CHARACTER_LIMIT = 2_000
LORE_ENTRY_LIMIT = 1_200
CANON_FACT_LIMIT = 400
FORESHADOWING_LIMIT = 400
CHAPTER_SEPARATOR = "* * *"  # between chapters inside [[earlier-chapters]]

# Per-field limits inside one character entry; with the header they stay under CHARACTER_LIMIT.
_CHARACTER_NAME_LIMIT = 80
_CHARACTER_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("identity", "identitySummary", 300),
    ("description", "description", 450),
    ("personality", "personality", 250),
    ("motivation", "motivation", 250),
    ("arc", "arc", 250),
)
_RELATIONS_LIMIT = 250
_SENTENCE_END = frozenset(".!?…。！？")

# CTX-13: what the writer does with the licensed references it is given (the styleConstraints).
STYLE_CONSTRAINTS: tuple[str, ...] = (
    "Write in the voice the pattern references show: rhythm, diction, point of view.",
    "Never copy their sentences, names, places or events: they are not part of this story.",
)
STYLE_TOOL: tuple[str, ...] = ("novel_references_read gives them again.",)  # W2 only: W1 has no tools

FORESHADOWING_RULE = (
    "When the scene pays off an item named in foreshadowingDue, show it in the prose and add a "
    "canonChange {kind: foreshadowing, foreshadowingId: <item id>, foreshadowingStatus: resolved}."
)

PROTOCOL_W1: tuple[str, ...] = (
    "You write the next unit of a novel. Write prose only, in the language and style of the story.",
    "Never put headings, chapter or scene numbers, ids, word counts, progress notes, explanations "
    "or closing markers (such as 'The End' or 'to be continued') into the prose.",
    "Continue seamlessly from the prose tail and the continuation anchor; pursue the scene goal; "
    "do not contradict the canon facts; respect the story's taboos.",
    "Length: write between targetMin and targetMax effective characters (letters and digits).",
    # QUAL-1: the fields come from the commit body's one definition (novel.body), as the draft
    # schema does; no placeholder a model could copy into the prose.
    "Reply with ONLY one JSON object, no commentary, with these fields:",
    *body_field_guide(),
    FORESHADOWING_RULE,
)

PROTOCOL_W2: tuple[str, ...] = (
    "You write the next unit of a novel. Write prose only, in the language and style of the story.",
    "Never put headings, chapter or scene numbers, ids, word counts, progress notes, explanations "
    "or closing markers (such as 'The End' or 'to be continued') into the prose.",
    "Research before narrating: this pack leaves out characters, lore, canon facts and "
    "foreshadowing; read what the scene needs with the read tools (novel_status_read, "
    "novel_outline_read, novel_character_read, novel_lore_search, novel_body_read, "
    "novel_body_search, novel_facts_read, memory_search, memory_read).",
    "Continue seamlessly from the prose tail and the continuation anchor; pursue the scene goal; "
    "do not contradict the canon facts; respect the story's taboos.",
    "Length: write between targetMin and targetMax effective characters (letters and digits).",
    "Then call novel_body_commit exactly once with unitId from the unit block and the body: "
    f"{body_shape()}; paragraphs are one string per paragraph with no blank lines inside, sources "
    "are 'inline' or 'inline#<paragraph index>'.",
    FORESHADOWING_RULE,
    "Stop after the first successful commit. If a commit is refused, fix the named problem and "
    "commit again. Never explain your work in the prose or after the commit.",
)


class WriterPack(msgspec.Struct, frozen=True):
    text: str
    prefix: str  # the stable prefix: text.startswith(prefix) (PACK-2/3)
    prefix_sha256: str
    sha256: str
    shape: PackShape
    chars: int  # code points of text
    est_tokens: int  # novel.text.estimate_tokens(text)
    blocks: list[str]  # names of the blocks present, in order
    # The frozen context this pack projects (for the receipt, never shown to the writer).
    context_sha256: str = ""
    manifest_sha256: str = ""
    profile: str = "bounded"
    as_of: int = 0


# --- small renderers ---------------------------------------------------------------------


def _field(key: str, value: str | None, limit: int) -> str | None:
    if value is None:
        return None
    flat = one_line(value)
    return f"{key}: {truncate(flat, limit)}" if flat else None


def _fields(items: Iterable[tuple[str, str | None, int]]) -> list[str]:
    return [line for key, value, limit in items if (line := _field(key, value, limit)) is not None]


def _joined(values: Iterable[str]) -> str:
    """List items on one line: after a sentence end a space, otherwise "; "."""
    out = ""
    for value in values:
        flat = one_line(value)
        if not flat:
            continue
        if out:
            out += " " if out[-1] in _SENTENCE_END else "; "
        out += flat
    return out


def _render_block(name: str, lines: list[str]) -> str:
    return f"[[{name}]]\n" + "".join(line + "\n" for line in lines)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Names:
    """characterId → "Name (id)" from the context's identity index."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def __call__(self, character_id: str) -> str:
        name = self.names.get(character_id)
        if name is None:
            return character_id
        return f"{truncate(one_line(name), _CHARACTER_NAME_LIMIT)} ({character_id})"


# --- blocks ------------------------------------------------------------------------------


def _story_lines(s: Story, title: str) -> list[str]:
    return _fields(
        [
            ("title", title, STORY_FIELD_LIMIT),
            ("premise", s.premise, STORY_FIELD_LIMIT),
            ("theme", s.theme, STORY_FIELD_LIMIT),
            ("mainConflict", s.mainConflict, STORY_FIELD_LIMIT),
            ("endingDirection", s.endingDirection, STORY_FIELD_LIMIT),
            ("taboos", _joined(s.taboos), STORY_FIELD_LIMIT),
            ("style", s.style, STORY_FIELD_LIMIT),
        ]
    )


def _character_entry(character: Character, names: tuple[tuple[str, str | None], ...]) -> list[str]:
    """One character's lines; ``names`` maps every id it shows (its own, its relations')."""
    person = _Names({k: v for k, v in names if v is not None})
    lines = [f"- {person(character.characterId)}"]
    for key, attr, limit in _CHARACTER_FIELDS:
        line = _field(key, getattr(character, attr), limit)
        if line is not None:
            lines.append("  " + line)
    relations = _joined(f"{person(r.characterId)}: {r.description}" for r in character.relations)
    line = _field("relations", relations, _RELATIONS_LIMIT)
    if line is not None:
        lines.append("  " + line)
    return lines


def _chapter_lines(chapter: Chapter) -> list[str]:
    return _fields(
        [
            ("chapterId", chapter.chapterId, CHAPTER_FIELD_LIMIT),
            ("order", str(chapter.order), CHAPTER_FIELD_LIMIT),
            ("title", chapter.title, CHAPTER_FIELD_LIMIT),
            ("purpose", chapter.purpose, CHAPTER_FIELD_LIMIT),
            ("entryCondition", chapter.entryCondition, CHAPTER_FIELD_LIMIT),
            ("exitCondition", chapter.exitCondition, CHAPTER_FIELD_LIMIT),
            ("keyEvents", _joined(chapter.keyEvents), CHAPTER_FIELD_LIMIT),
        ]
    )


def _scene_lines(
    person: _Names, scene: Scene, anchor: str | None, goals: list[str], due: str
) -> list[str]:
    participants = ", ".join(person(p) for p in scene.participants)
    return _fields(
        [
            ("sceneId", scene.sceneId, SCENE_FIELD_LIMIT),
            ("order", str(scene.order), SCENE_FIELD_LIMIT),
            ("goal", scene.goal, SCENE_FIELD_LIMIT),
            ("participants", participants, SCENE_FIELD_LIMIT),
            ("timeLocation", scene.timeLocation, SCENE_FIELD_LIMIT),
            ("causality", scene.causality, SCENE_FIELD_LIMIT),
            ("conflict", scene.conflict, SCENE_FIELD_LIMIT),
            ("expectedChange", scene.expectedChange, SCENE_FIELD_LIMIT),
            ("continuationAnchor", anchor, SCENE_FIELD_LIMIT),
            ("outstandingGoals", _joined(goals), SCENE_FIELD_LIMIT),
            ("foreshadowingDue", due, SCENE_FIELD_LIMIT),
        ]
    )


def _canon_line(person: _Names, card: CanonCard) -> str:
    change = card.change
    who = ", ".join(person(c) for c in change.character_ids)
    text = one_line(change.summary)
    detail = one_line(change.detail or "")
    if detail:
        text = f"{text} — {detail}" if text else detail
    hint = "" if card.verified else " (unverified hint)"
    return "- " + truncate(
        f"{card.commit_id} {change.kind} [{who}]{hint}: {text}", CANON_FACT_LIMIT
    )


def _foreshadowing_line(
    item_id: str,
    status: str,
    required: bool,
    plant: str | None,
    payoff: str | None,
    description: str,
) -> str:
    tags: list[str] = [status]
    if required:
        tags.append("required")
    if plant is not None:
        tags.append(f"plantAt {plant}")
    if payoff is not None:
        tags.append(f"payoffAt {payoff}")
    body = f"{item_id} ({', '.join(tags)}): {one_line(description)}"
    return "- " + truncate(body, FORESHADOWING_LIMIT)


def _unit_lines(frozen: FrozenContext) -> list[str]:
    l0 = frozen.context.l0
    length = l0.length
    lines = [
        f"unitId: {l0.unit_id}",
        f"fragment: {l0.fragment}",
        f"targetMin: {length.target_min}",
        f"targetMax: {length.target_max}",
        f"stage: {length.stage}",
    ]
    if length.remaining is not None:
        lines.append(f"remainingCharacters: {length.remaining}")
    return lines


# Stable prefix parts, rendered once per outline object (novel.context.IdentityCache).
_STORY_LINES = IdentityCache(_story_lines)
_CHAPTER_LINES = IdentityCache(_chapter_lines)
_CHARACTER_ENTRY = IdentityCache(_character_entry)


# --- the projection ------------------------------------------------------------------------


def render_writer_pack(frozen: FrozenContext, shape: PackShape) -> WriterPack:
    """The writer's projection of a frozen context (CTX-8, PACK-1..5).

    Fail loud (PACK-4, together with the assembler's no-outline / unknown-unit cases): the
    current chapter has commits but the prose tail is empty; (full shape only) a scene
    participant covered by neither the characters nor the canon block. The trimmed shape has no
    characters or canon block by design (PACK-5): the W2 writer reads characters and facts with
    its tools, so the coverage check does not apply to it.
    """
    ctx = frozen.context
    request = ctx.request
    if request.scenario != "generation":
        raise ContextInputError(
            f"the writer projection serves scenario 'generation', not {request.scenario!r}"
        )
    if shape not in ("full", "trimmed"):
        raise ContextInputError(f"unknown pack shape {shape!r} (one of: full, trimmed)")
    l0, l1, l2 = ctx.l0, ctx.l1, ctx.l2
    full = shape == "full"
    person = _Names(l2.names)

    missing: list[str] = []
    reasons: list[str] = []
    current = l1.current
    if current.commits and not current.text.strip("… \n"):
        missing.append("prose-tail")
        reasons.append(f"chapter {current.chapter_id} has {current.commits} commits but no prose")
    if full:
        covered = {c.characterId for c in l2.characters}
        covered.update(cid for card in l2.canon for cid in card.change.character_ids)
        uncovered = [p for p in l0.scene.participants if p not in covered]
        if uncovered:
            missing.extend(["characters", "canon"])
            reasons.append(
                "participants in neither the characters nor the canon block: "
                + ", ".join(uncovered)
            )
    if missing:
        raise WriterPackError(request.novel_id, request.unit_id, missing, "; ".join(reasons))

    due = "; ".join(f"{item.id}: {one_line(item.description)}" for item in l0.foreshadowing_due)
    earlier = f"\n\n{CHAPTER_SEPARATOR}\n\n".join(e.text for e in l1.earlier if e.text)
    content: dict[str, list[str]] = {
        "protocol": list("- " + line for line in (PROTOCOL_W1 if full else PROTOCOL_W2)),
        "story": _STORY_LINES(l0.story, l0.title),
        "chapter": _CHAPTER_LINES(l0.chapter),
        "earlier-chapters": earlier.split("\n") if earlier else [],
        # CTX-13: licensed references (L3), stable for the revision and the day: prefix blocks
        "style-constraints": [f"- {line}" for line in (*STYLE_CONSTRAINTS, *(() if full else STYLE_TOOL))]
        if ctx.l3.references else [],
        "pattern-references": [f"- {r.reference_id} ({r.kind}): {one_line(r.text)}" for r in ctx.l3.references],
        "scene": _scene_lines(person, l0.scene, l0.continuation_anchor, l0.outstanding_goals, due),
        "recalled-prose": ["- " + e.text for e in l1.recall],
        "prose-tail": current.text.split("\n") if current.text else [],
        "unit": _unit_lines(frozen),
    }
    if full:
        characters: list[str] = []
        for character in l2.characters:
            ids = [character.characterId, *(r.characterId for r in character.relations)]
            known = tuple((cid, l2.names.get(cid)) for cid in ids)
            characters.extend(_CHARACTER_ENTRY(character, known))
        content["characters"] = characters
        content["lore"] = [
            "- " + truncate(one_line(f"{e.entryId}: {e.content}"), LORE_ENTRY_LIMIT)
            for e in l2.lore
        ]
        content["canon"] = [_canon_line(person, card) for card in l2.canon]
        content["foreshadowing"] = [
            _foreshadowing_line(
                card.item.id,
                card.status,
                card.item.required,
                card.item.plantAt,
                card.item.payoffAt,
                card.item.description,
            )
            for card in l2.foreshadowing
        ]

    names = [name for name in BLOCK_ORDER if content.get(name)]
    rendered = {name: _render_block(name, content[name]) for name in names}
    prefix_names = [n for n in names if n in PREFIX_BLOCKS]
    tail_names = [n for n in names if n not in PREFIX_BLOCKS]
    prefix = "\n".join(rendered[n] for n in prefix_names) + "\n"
    text = prefix + "\n".join(rendered[n] for n in tail_names)
    return WriterPack(
        text=text,
        prefix=prefix,
        prefix_sha256=_sha256(prefix),
        sha256=_sha256(text),
        shape=shape,
        chars=len(text),
        # == novel.text.estimate_tokens(text): CJK counts are additive and cached per block
        est_tokens=tokens_of(sum(cached_cjk_count(rendered[n]) for n in names), len(text)),
        blocks=names,
        context_sha256=frozen.context_sha256,
        manifest_sha256=frozen.manifest_sha256,
        profile=request.profile,
        as_of=request.as_of,
    )


def render_pack(
    snapshot: NovelSnapshot,
    unit_id: str,
    shape: PackShape,
    *,
    profile: str = "bounded",
    as_of: int | None = None,
) -> WriterPack:
    """Assemble the unit's context from an in-memory snapshot and project it (pure, PACK-1).

    Scenario ``generation``, purpose ``production``; ``as_of`` defaults to the last commit
    before the unit's own (novel.context.default_as_of). Raises WriterPackError (PACK-4).
    """
    frozen = freeze_from_snapshot(
        snapshot,
        unit_id,
        scenario="generation",
        purpose="production",
        profile=profile,
        as_of=as_of,
    )
    return render_writer_pack(frozen, shape)


# --- parsing (for the offline writer, tests and tooling) -----------------------------------


def parse_pack(text: str) -> dict[str, list[str]]:
    """Split pack text into ``{block name: body lines}`` (separator blank line removed).

    Blocks are split on header lines ``[[name]]`` with a known name, so the prose tail's blank
    lines are kept.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        m = HEADER_RE.match(line)
        if m is not None and m.group(1) in BLOCK_ORDER:
            current = blocks.setdefault(m.group(1), [])
            continue
        if current is not None:
            current.append(line)
    for lines in blocks.values():
        while lines and lines[-1] == "":
            lines.pop()
    return blocks


def pack_fields(text: str) -> dict[str, dict[str, str]]:
    """``{block name: block_fields(its lines)}`` of a pack, each call its own dicts; the parse is
    kept for the last packs seen (PERF-2: a writer run asks for the fields of one pack from
    several places; one parse serves them all)."""
    return {name: dict(fields) for name, fields in _pack_fields(text)}


@functools.lru_cache(maxsize=64)
def _pack_fields(text: str) -> tuple[tuple[str, dict[str, str]], ...]:  # never handed out
    return tuple((name, block_fields(lines)) for name, lines in parse_pack(text).items())


def block_fields(lines: list[str]) -> dict[str, str]:
    """The top-level ``key: value`` lines of a block (bullets and indented lines skipped)."""
    out: dict[str, str] = {}
    for line in lines:
        if line.startswith(("- ", " ")):
            continue
        key, sep, value = line.partition(": ")
        if sep:
            out[key] = value
    return out
