"""Writer pack rendering (SPEC §7, PACK-1..5): a pure function of a store snapshot.

Text format (other code parses it, see ``parse_pack``)::

    [[protocol]]
    - bullet line
    ...

    [[story]]
    key: value
    ...

Each block starts with a header line ``[[name]]`` and holds ``key: value`` lines, or ``- ``
bullet lines for lists (a character bullet carries indented ``  key: value`` lines); blocks are
separated by one blank line and the text ends with a newline. The ``prose-tail`` block is the
exception: its body is raw prose, paragraphs separated by blank lines, so split blocks on the
header lines, not on blank lines. Values are single-line (whitespace collapsed); truncated
values end with ``…``; empty fields and empty blocks are omitted.

Block order: ``protocol, story, characters, chapter`` (the stable prefix, PACK-2/3) then
``scene, lore, canon, prose-tail, foreshadowing, unit``. The prefix is everything before
``[[scene]]``, including the blank separator line, so ``text == prefix + rest``.

The writer sees creative fields only (CTX-8): never run, claim or delegation ids, tokens,
hashes, outline revisions, last errors, pause reasons or verdicts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Literal

import msgspec

from novel.body import CanonChange
from novel.length import narrative_stage, remaining_book_characters, unit_target_range
from novel.next_work import foreshadowing_status, live_commits, remaining_scenes, scene_commits
from novel.outline import Chapter, Character, Outline, Scene
from novel.snapshot import CommitView, NovelSnapshot, UnitView
from novel.text import estimate_tokens, keywords, one_line, tail, truncate

PackShape = Literal["full", "trimmed"]

BLOCK_ORDER: tuple[str, ...] = (
    "protocol",
    "story",
    "characters",
    "chapter",
    "scene",
    "lore",
    "canon",
    "prose-tail",
    "foreshadowing",
    "unit",
)
PREFIX_BLOCKS: tuple[str, ...] = ("protocol", "story", "characters", "chapter")
TRIMMED_BLOCKS: tuple[str, ...] = ("protocol", "story", "chapter", "scene", "prose-tail", "unit")

# §7 limits, in code points.
STORY_FIELD_LIMIT = 400
CHAPTER_FIELD_LIMIT = 300
SCENE_FIELD_LIMIT = 300
CHARACTER_LIMIT = 2_000
MAX_CHARACTERS = 6
LORE_ENTRY_LIMIT = 1_200
MAX_LORE_ENTRIES = 5
MAX_CANON_FACTS = 12
CANON_FACT_LIMIT = 400
PROSE_TAIL_LIMIT = 1_600
MAX_FORESHADOWING = 12
FORESHADOWING_LIMIT = 400

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

_CANON_KINDS = frozenset({"character-state", "relation"})
_HEADER_RE = re.compile(r"^\[\[([a-z-]+)\]\]$")
_SENTENCE_END = frozenset(".!?…。！？")
# A lore entry matched only by content needs this many shared keywords (one shared word such as
# "night" is noise; a key hit alone is enough).
_LORE_CONTENT_MIN_HITS = 2

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
    "Reply with ONLY one JSON object, no commentary: "
    '{"paragraphs": ["..."], "sceneCompletion": {"completed": false, "basis": "...", '
    '"outstandingGoals": ["..."], "nextAnchor": "..."}, "canonChanges": [{"kind": '
    '"character-state", "summary": "...", "sources": ["inline#0"], "detail": "...", '
    '"characterIds": ["..."]}]}',
    "paragraphs: one string per paragraph, no blank lines inside a paragraph.",
    "sceneCompletion: completed is true only when the scene goal is reached; basis says why "
    "(never empty); outstandingGoals lists what is left; nextAnchor says where the next unit "
    "picks up (null when completed).",
    "canonChanges: kind is one of event, character-state, relation, foreshadowing, variable; "
    "each source is 'inline' or 'inline#<paragraph index>' pointing into your paragraphs; "
    "characterIds names the characters the fact is about.",
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
    "paragraphs (one string per paragraph, no blank lines inside), sceneCompletion {completed, "
    "basis, outstandingGoals, nextAnchor}, canonChanges [{kind, summary, sources, detail, "
    "characterIds}] with sources 'inline' or 'inline#<paragraph index>'.",
    FORESHADOWING_RULE,
    "Stop after the first successful commit. If a commit is refused, fix the named problem and "
    "commit again. Never explain your work in the prose or after the commit.",
)


class WriterPackError(Exception):
    """PACK-4: the pack cannot be rendered completely; no writer may start on it."""

    code = "pack-error"

    def __init__(
        self, novel_id: str, unit_id: str, missing_blocks: list[str], reason: str = ""
    ) -> None:
        self.novel_id = novel_id
        self.unit_id = unit_id
        self.missing_blocks = missing_blocks
        self.reason = reason
        # The message ends with "missing: a, b" so a bus error reply can carry the block names.
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"writer pack for unit {unit_id} of novel {novel_id} is broken{why}; "
            f"missing: {', '.join(missing_blocks)}"
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


def _person(outline: Outline, character_id: str) -> str:
    try:
        name = outline.character(character_id).name
    except KeyError:
        return character_id
    return f"{truncate(one_line(name), _CHARACTER_NAME_LIMIT)} ({character_id})"


# --- blocks ------------------------------------------------------------------------------


def _story_lines(title: str, outline: Outline) -> list[str]:
    s = outline.story
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


def pack_characters(outline: Outline) -> list[Character]:
    """PACK-3: the union of participants over ALL scenes, in declaration order, capped at 6.

    Depends on the outline only, so the characters block is stable for the whole revision.
    """
    participants = {p for scene in outline.scenes for p in scene.participants}
    return [c for c in outline.characters if c.characterId in participants][:MAX_CHARACTERS]


def _character_entry(outline: Outline, character: Character) -> list[str]:
    lines = [f"- {_person(outline, character.characterId)}"]
    for key, attr, limit in _CHARACTER_FIELDS:
        line = _field(key, getattr(character, attr), limit)
        if line is not None:
            lines.append("  " + line)
    relations = _joined(
        f"{_person(outline, r.characterId)}: {r.description}" for r in character.relations
    )
    line = _field("relations", relations, _RELATIONS_LIMIT)
    if line is not None:
        lines.append("  " + line)
    return lines


def _characters_lines(outline: Outline) -> list[str]:
    lines: list[str] = []
    for character in pack_characters(outline):
        lines.extend(_character_entry(outline, character))
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


def continuation_context(
    snapshot: NovelSnapshot, unit: UnitView, scene: Scene
) -> tuple[str | None, list[str]]:
    """(continuationAnchor, outstandingGoals) for a unit.

    A continuation (fragment > 1) takes the unit's anchor, else the previous commit's
    nextAnchor; a scene's first unit takes the scene's own anchor.
    """
    if unit.fragment <= 1:
        return scene.continuationAnchor, []
    commits = scene_commits(snapshot, unit.chapter_id, unit.scene_id)
    previous = commits[-1].scene_completion if commits else None
    anchor = unit.continuation_anchor
    if anchor is None and previous is not None:
        anchor = previous.next_anchor
    goals = list(previous.outstanding_goals) if previous is not None else []
    return anchor, goals


def _due_foreshadowing(outline: Outline, scene: Scene, status: dict[str, str]) -> str:
    """Unresolved items whose payoff falls in this scene's chapter: part of the scene's task."""
    due = [
        f"{item.id}: {one_line(item.description)}"
        for item in outline.foreshadowing
        if item.payoffAt == scene.chapterId and status.get(item.id) != "resolved"
    ]
    return "; ".join(due)


def _scene_lines(
    outline: Outline, scene: Scene, anchor: str | None, goals: list[str], due: str = ""
) -> list[str]:
    participants = ", ".join(_person(outline, p) for p in scene.participants)
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


def scene_keywords(outline: Outline, scene: Scene) -> tuple[str, set[str]]:
    """The scene's match text (lowercased) and keywords: participants' names, goal, timeLocation."""
    names = []
    for p in scene.participants:
        try:
            names.append(outline.character(p).name)
        except KeyError:
            continue
    text = " ".join([*names, scene.goal, scene.timeLocation]).lower()
    return text, set(keywords(text))


def select_lore(outline: Outline, scene: Scene) -> list[int]:
    """Indexes of the lore entries for a scene (§7: ≤ 5, matched by keys or content).

    Key hits rank first, then content keyword overlap, then declaration order; disabled
    entries are skipped. The result is in declaration order (stable).
    """
    text, scene_kw = scene_keywords(outline, scene)
    ranked: list[tuple[int, int, int]] = []
    for index, entry in enumerate(outline.lore):
        if entry.disabled:
            continue
        key_hits = 0
        for key in entry.keys:
            flat = one_line(key).lower()
            if flat and (flat in text or scene_kw.intersection(keywords(flat))):
                key_hits += 1
        content_hits = len(scene_kw.intersection(keywords(entry.content)))
        if key_hits or content_hits >= _LORE_CONTENT_MIN_HITS:
            ranked.append((-key_hits, -content_hits, index))
    return sorted(index for _, _, index in sorted(ranked)[:MAX_LORE_ENTRIES])


def _lore_lines(outline: Outline, scene: Scene) -> list[str]:
    lines: list[str] = []
    for index in select_lore(outline, scene):
        entry = outline.lore[index]
        body = one_line(f"{entry.entryId}: {entry.content}")
        lines.append("- " + truncate(body, LORE_ENTRY_LIMIT))
    return lines


def select_canon(
    snapshot: NovelSnapshot, participants: Iterable[str]
) -> list[tuple[CommitView, CanonChange]]:
    """§7 canon: the last 12 character-state/relation facts about participants, oldest first."""
    wanted = set(participants)
    facts = [
        (commit, change)
        for commit in live_commits(snapshot)
        for change in commit.canon_changes
        if change.kind in _CANON_KINDS and wanted.intersection(change.character_ids)
    ]
    return facts[-MAX_CANON_FACTS:]


def _canon_line(outline: Outline, commit: CommitView, change: CanonChange) -> str:
    who = ", ".join(_person(outline, c) for c in change.character_ids)
    text = one_line(change.summary)
    detail = one_line(change.detail or "")
    if detail:
        text = f"{text} — {detail}" if text else detail
    return "- " + truncate(f"{commit.commit_id} {change.kind} [{who}]: {text}", CANON_FACT_LIMIT)


def chapter_prose_tail(snapshot: NovelSnapshot, chapter_id: str) -> tuple[int, str]:
    """(number of the chapter's commits, raw tail of its committed prose ≤ 1,600)."""
    commits = [c for c in live_commits(snapshot) if c.chapter_id == chapter_id]
    text = "\n\n".join(p for c in commits for p in c.paragraphs)
    # A prose line that looks like a block header is indented so it cannot end the block.
    text = "\n".join(
        (" " + line) if _HEADER_RE.match(line.strip()) else line for line in text.split("\n")
    )
    cut = tail(text, PROSE_TAIL_LIMIT)
    if cut != text:  # truncated: drop a dangling paragraph break after the marker
        cut = cut[0] + cut[1:].lstrip()
    return len(commits), cut


def _foreshadowing_lines(outline: Outline, chapter: Chapter, status: dict[str, str]) -> list[str]:
    orders = {c.chapterId: c.order for c in outline.chapters}
    lines: list[str] = []
    for item in outline.foreshadowing:
        if status.get(item.id, item.status) == "resolved":
            continue
        planted_by_now = item.plantAt is not None and orders[item.plantAt] <= chapter.order
        if not (item.required or planted_by_now):
            continue
        tags: list[str] = [status.get(item.id, item.status)]
        if item.required:
            tags.append("required")
        if item.plantAt is not None:
            tags.append(f"plantAt {item.plantAt}")
        if item.payoffAt is not None:
            tags.append(f"payoffAt {item.payoffAt}")
        body = f"{item.id} ({', '.join(tags)}): {one_line(item.description)}"
        lines.append("- " + truncate(body, FORESHADOWING_LIMIT))
        if len(lines) == MAX_FORESHADOWING:
            break
    return lines


def _unit_lines(snapshot: NovelSnapshot, unit: UnitView) -> list[str]:
    budget = snapshot.config.length
    commits = live_commits(snapshot)
    committed = sum(c.effective_characters for c in commits)
    target = unit_target_range(budget, committed, remaining_scenes(snapshot))
    stage = narrative_stage(budget, committed, has_commits=bool(commits))
    remaining = remaining_book_characters(budget, committed)
    lines = [
        f"unitId: {unit.unit_id}",
        f"fragment: {unit.fragment}",
        f"targetMin: {target.min}",
        f"targetMax: {target.max}",
        f"stage: {stage}",
    ]
    if remaining is not None:
        lines.append(f"remainingCharacters: {remaining}")
    return lines


# --- the renderer ------------------------------------------------------------------------


def render_pack(snapshot: NovelSnapshot, unit_id: str, shape: PackShape) -> WriterPack:
    """Render the writer pack for one unit (PACK-1..5); raise WriterPackError on a broken pack.

    Fail loud (PACK-4): no outline revision; unknown/superseded unit or a unit whose chapter or
    scene is not in the outline; the current chapter has commits but the prose tail is empty;
    (full shape only) a scene participant covered by neither the characters nor the canon
    block. The trimmed shape has no characters or canon block by design (PACK-5): the W2 writer
    reads characters and facts with its tools, so the coverage check does not apply to it.
    """

    def fail(missing: list[str], reason: str) -> WriterPackError:
        return WriterPackError(snapshot.novel_id, unit_id, missing, reason)

    outline = snapshot.outline
    if outline is None or snapshot.outline_revision is None:
        raise fail(["outline"], "the novel has no outline revision")
    unit = next((u for u in snapshot.units if u.unit_id == unit_id), None)
    if unit is None or unit.state == "superseded":
        raise fail(["unit"], "unit not found or superseded")
    try:
        chapter = outline.chapter(unit.chapter_id)
    except KeyError:
        raise fail(["chapter"], f"chapter {unit.chapter_id} is not in the outline") from None
    scene = next(
        (s for s in outline.scenes_of(chapter.chapterId) if s.sceneId == unit.scene_id), None
    )
    if scene is None:
        raise fail(["scene"], f"scene {unit.scene_id} is not in chapter {chapter.chapterId}")

    full = shape == "full"
    anchor, goals = continuation_context(snapshot, unit, scene)
    chapter_commits, prose = chapter_prose_tail(snapshot, chapter.chapterId)
    canon = select_canon(snapshot, scene.participants) if full else []

    missing: list[str] = []
    reasons: list[str] = []
    if chapter_commits and not prose.strip("… \n"):
        missing.append("prose-tail")
        reasons.append(f"chapter {chapter.chapterId} has {chapter_commits} commits but no prose")
    if full:
        covered = {c.characterId for c in pack_characters(outline)}
        covered.update(cid for _, change in canon for cid in change.character_ids)
        uncovered = [p for p in scene.participants if p not in covered]
        if uncovered:
            missing.extend(["characters", "canon"])
            reasons.append(
                "participants in neither the characters nor the canon block: "
                + ", ".join(uncovered)
            )
    if missing:
        raise fail(missing, "; ".join(reasons))

    fstatus = foreshadowing_status(snapshot)
    content: dict[str, list[str]] = {
        "protocol": list("- " + line for line in (PROTOCOL_W1 if full else PROTOCOL_W2)),
        "story": _story_lines(snapshot.title, outline),
        "chapter": _chapter_lines(chapter),
        "scene": _scene_lines(outline, scene, anchor, goals, _due_foreshadowing(outline, scene, fstatus)),
        "prose-tail": prose.split("\n") if prose else [],
        "unit": _unit_lines(snapshot, unit),
    }
    if full:
        content["characters"] = _characters_lines(outline)
        content["lore"] = _lore_lines(outline, scene)
        content["canon"] = [_canon_line(outline, commit, change) for commit, change in canon]
        content["foreshadowing"] = _foreshadowing_lines(outline, chapter, fstatus)

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
        est_tokens=estimate_tokens(text),
        blocks=names,
    )


# --- parsing (for the offline writer, tests and tooling) -----------------------------------


def parse_pack(text: str) -> dict[str, list[str]]:
    """Split pack text into ``{block name: body lines}`` (separator blank line removed).

    Blocks are split on header lines ``[[name]]`` with a known name, so the prose tail's blank
    lines are kept.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        m = _HEADER_RE.match(line)
        if m is not None and m.group(1) in BLOCK_ORDER:
            current = blocks.setdefault(m.group(1), [])
            continue
        if current is not None:
            current.append(line)
    for lines in blocks.values():
        while lines and lines[-1] == "":
            lines.pop()
    return blocks


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
