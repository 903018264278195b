"""The one tool registry (TOOL-1..5).

Every tool a writer can see is declared here exactly once: name, description, tables read,
parameter schema (a pydantic model) and implementation. Model tool definitions are generated
from this registry (`openai_tool_definitions`) and nowhere else.

Read tools are pure functions of a `NovelSnapshot` that the writer-runner actor loads inside a
read-only transaction for the delegated novel only (TOOL-5): a model never reaches the database,
files or the retrieval plan. That snapshot carries the prose of the chapter being written only; a
tool that reads other prose declares which (`ToolSpec.prose`), and the runner reads exactly that
by commit id before the call (`prose_to_read`, `with_prose`; PERF-2: a unit's reads do not
grow with the book). Results carry creative content and public ids (chapter, scene,
character, commit ids) but never tokens, claim ids, hashes or run ids (CTX-8).

`novel_body_commit` is the single write tool. Its parameter schema lives here too, but its
implementation is supplied by the caller: the runner hands the arguments to the claim manager.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from novelbus.novel.body import CommitArgs, CommitBody
from novelbus.novel.context import select_references, validate_request
from novelbus.novel.next_work import (
    commit_totals,
    completed_chapters,
    finished_scenes,
    live_commits,
    live_units,
    scenes_by_chapter,
)
from novelbus.novel.outline import Chapter, Outline
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import keywords

BODY_READ_CAP = 30_000  # TOOL-2: characters of chapter/body text per read
SEARCH_ROW_CAP = 50  # TOOL-2: rows per search
EXCERPT_CHARS = 240
MEMORY_READ_CAP = BODY_READ_CAP

COMMIT_TOOL = "novel_body_commit"

# RUN-3: the closed W2 allow-list. Claim, planning, revision and completion tools do not exist here.
W2_ALLOW_LIST: tuple[str, ...] = (
    "novel_status_read",
    "novel_outline_read",
    "novel_character_read",
    "novel_lore_search",
    "novel_body_read",
    "novel_body_search",
    "novel_facts_read",
    "memory_search",
    "memory_read",
    "novel_references_read",
    COMMIT_TOOL,
)

READ_TOOLS_NOT_ENABLED = "READ_TOOLS_NOT_ENABLED"


class ToolContractError(Exception):
    """Unknown tool or invalid arguments (TOOL-3; the CLI exits with code 2)."""

    code = "tool-contract"
    exit_code = 2


class ToolGateError(Exception):
    """A task names registry read tools while read tools are not enabled (TOOL-4)."""

    code = READ_TOOLS_NOT_ENABLED


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    tables_read: tuple[str, ...]
    params: type[BaseModel] | type[CommitArgs]  # read tools: pydantic; the commit: the body's own Struct
    # None for the write tool: its implementation is supplied by the caller (the claim manager).
    impl: Callable[[NovelSnapshot, Any], Any] | None
    kind: Literal["read", "write"] = "read"
    # The commits whose prose (paragraphs) `impl` reads for these arguments; None: none. A
    # snapshot may come without prose (PERF-2): the runner reads exactly these first.
    prose: Callable[[NovelSnapshot, Any], Iterable[str]] | None = None


# --- parameter schemas --------------------------------------------------------------------------


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(_Params):
    pass


class OutlineReadParams(_Params):
    chapterId: str | None = Field(
        default=None,
        description="Chapter to centre the window on; default: the chapter being written.",
    )


class CharacterReadParams(_Params):
    characterId: str = Field(
        min_length=1, description="A character id, e.g. from the scene participants."
    )


class SearchParams(_Params):
    query: str = Field(min_length=1, max_length=400, description="Words or phrases to look for.")


class BodyReadParams(_Params):
    chapterId: str = Field(min_length=1, description="Chapter whose committed prose to read.")
    sceneId: str | None = Field(default=None, description="Only this scene of the chapter.")


class FactsReadParams(_Params):
    characterId: str | None = Field(default=None, description="Only facts about this character.")


class ReferencesReadParams(_Params):
    kind: Literal["style", "pattern", "excerpt"] | None = Field(default=None, description="Only this kind.")


class MemoryReadParams(_Params):
    noteId: str = Field(min_length=1, description="A note id returned by memory_search.")


def commit_body_from_args(args: CommitArgs) -> CommitBody:
    """The CommitBody a validated commit call carries (unitId stripped)."""
    return args.body()


# --- small helpers ------------------------------------------------------------------------------


def _current_unit(snapshot: NovelSnapshot) -> UnitView | None:
    units = live_units(snapshot)
    claimed = [u for u in units if u.state == "claimed"]
    if claimed:
        return claimed[-1]
    return next((u for u in units if u.state == "prepared"), None)


def _current_chapter_id(snapshot: NovelSnapshot) -> str | None:
    unit = _current_unit(snapshot)
    return _chapter_being_written(snapshot, unit, live_commits(snapshot) if unit is None else [])


def _chapter_being_written(
    snapshot: NovelSnapshot, unit: UnitView | None, commits: list[CommitView]
) -> str | None:
    """The current unit's chapter, else the last live commit's, else the first outlined."""
    if unit is not None:
        return unit.chapter_id
    if commits:
        return commits[-1].chapter_id
    if snapshot.outline is not None and snapshot.outline.chapters:
        return snapshot.outline.ordered_chapters()[0].chapterId
    return None


def _require_outline(snapshot: NovelSnapshot) -> Outline:
    if snapshot.outline is None:
        raise ToolContractError("the novel has no outline yet")
    return snapshot.outline


def _chapter_or_error(snapshot: NovelSnapshot, chapter_id: str) -> Chapter:
    outline = _require_outline(snapshot)
    try:
        return outline.chapter(chapter_id)
    except KeyError:
        raise ToolContractError(f"chapterId: unknown chapter {chapter_id!r}") from None


def _terms(query: str) -> list[str]:
    terms = [t.lower() for t in keywords(query) if t.strip()]
    if not terms and query.strip():
        terms = [query.strip().lower()]
    return list(dict.fromkeys(terms))


def _score(text: str, terms: Iterable[str]) -> int:
    low = text.lower()
    return sum(1 for t in terms if t in low)


def _excerpt(text: str, terms: list[str], width: int = EXCERPT_CHARS) -> str:
    low = text.lower()
    hits = [low.find(t) for t in terms if t in low]
    start = max(0, min(hits) - width // 3) if hits else 0
    piece = text[start : start + width]
    prefix = "…" if start > 0 else ""
    suffix = "…" if start + width < len(text) else ""
    return prefix + piece + suffix


def _cap_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rows": rows[:SEARCH_ROW_CAP],
        "totalMatches": len(rows),
        "truncated": len(rows) > SEARCH_ROW_CAP,
    }


def cap_text(text: str, cap: int = BODY_READ_CAP) -> tuple[str, bool]:
    """Cut `text` at `cap` characters and say so explicitly (TOOL-2)."""
    if len(text) <= cap:
        return text, False
    return f"{text[:cap]}\n[truncated: {len(text) - cap} more characters]", True


# --- read tool implementations -------------------------------------------------------------------


STATUS_CHAPTER_WINDOW = 2  # chapters shown on each side of the current one


def novel_status_read(snapshot: NovelSnapshot, _: NoParams) -> dict[str, Any]:
    outline = snapshot.outline
    commits = live_commits(snapshot)
    unit = _current_unit(snapshot)
    chapters: list[dict[str, Any]] = []
    current = _chapter_being_written(snapshot, unit, commits)
    finished_chapters = 0
    if outline is not None:
        ordered = outline.ordered_chapters()
        at = next((k for k, c in enumerate(ordered) if c.chapterId == current), 0)
        # PERF-2: every scene's progress from one pass over the commits (`finished_scenes`,
        # `completed_chapters`), not a scan of every commit per scene.
        done = set(completed_chapters(snapshot))
        finished_chapters = sum(1 for c in ordered if c.chapterId in done)
        finished = finished_scenes(snapshot)
        scenes_of = scenes_by_chapter(outline)
        # A fixed-size window around the current chapter (shifted at the book's ends), so the
        # result stays the same size however long the book grows and wherever the unit is.
        size = 2 * STATUS_CHAPTER_WINDOW + 1
        lo = max(0, min(at - STATUS_CHAPTER_WINDOW, len(ordered) - size))
        hi = lo + size
        shown = {ch.chapterId for ch in ordered[lo:hi]}
        # committed characters per shown chapter (SERVE-8: the shown chapters' commits only)
        by_chapter = commit_totals(snapshot.novel_id, commits).by_chapter
        characters = {cid: sum(c.effective_characters for c in by_chapter.get(cid, ())) for cid in shown}
        for ch in ordered[lo:hi]:
            scenes = scenes_of.get(ch.chapterId, [])
            chapters.append(
                {
                    "chapterId": ch.chapterId,
                    "order": ch.order,
                    "title": ch.title,
                    "scenes": len(scenes),
                    "scenesFinished": sum(1 for s in scenes if (ch.chapterId, s.sceneId) in finished),
                    "committedCharacters": characters.get(ch.chapterId, 0),
                }
            )
    length = snapshot.config.length
    return {
        "novelId": snapshot.novel_id,
        "title": snapshot.title,
        "status": snapshot.status,
        "pauseReason": snapshot.pause_reason,
        "committedCharacters": commit_totals(snapshot.novel_id, commits).chars,
        "commitCount": len(commits),
        "lengthTarget": length.targetCharacters if length.kind == "target" else None,
        "currentChapterId": current,
        "lastCommit": None
        if not commits
        else {
            "commitId": commits[-1].commit_id,
            "chapterId": commits[-1].chapter_id,
            "sceneId": commits[-1].scene_id,
        },
        "chaptersTotal": len(outline.chapters) if outline is not None else 0,
        "chaptersFinished": finished_chapters,
        "currentUnit": None
        if unit is None
        else {
            "unitId": unit.unit_id,
            "chapterId": unit.chapter_id,
            "sceneId": unit.scene_id,
            "fragment": unit.fragment,
            "continuationAnchor": unit.continuation_anchor,
        },
        "chapters": chapters,
    }


def novel_outline_read(snapshot: NovelSnapshot, p: OutlineReadParams) -> dict[str, Any]:
    """A chapter window: the story, one chapter with its scenes, and its neighbours in brief."""
    outline = _require_outline(snapshot)
    chapter_id = p.chapterId or _current_chapter_id(snapshot)
    if chapter_id is None:
        return {"story": outline.story.model_dump(mode="json"), "chapter": None, "scenes": []}
    chapter = _chapter_or_error(snapshot, chapter_id)
    ordered = outline.ordered_chapters()
    i = next(k for k, c in enumerate(ordered) if c.chapterId == chapter.chapterId)

    def brief(c: Chapter) -> dict[str, Any]:
        return {"chapterId": c.chapterId, "order": c.order, "title": c.title, "purpose": c.purpose}

    return {
        "story": outline.story.model_dump(mode="json"),
        "chapter": chapter.model_dump(mode="json"),
        "scenes": [s.model_dump(mode="json") for s in outline.scenes_of(chapter.chapterId)],
        "previousChapter": brief(ordered[i - 1]) if i > 0 else None,
        "nextChapter": brief(ordered[i + 1]) if i + 1 < len(ordered) else None,
        "chapterCount": len(ordered),
    }


def novel_character_read(snapshot: NovelSnapshot, p: CharacterReadParams) -> dict[str, Any]:
    outline = _require_outline(snapshot)
    try:
        character = outline.character(p.characterId)
    except KeyError:
        raise ToolContractError(f"characterId: unknown character {p.characterId!r}") from None
    return {"character": character.model_dump(mode="json", exclude_none=True)}


def novel_lore_search(snapshot: NovelSnapshot, p: SearchParams) -> dict[str, Any]:
    outline = _require_outline(snapshot)
    terms = _terms(p.query)
    scored = []
    for entry in outline.lore:
        if entry.disabled:
            continue
        score = _score(" ".join(entry.keys), terms) * 2 + _score(entry.content, terms)
        if score:
            scored.append((-score, entry.entryId, entry))
    scored.sort(key=lambda t: (t[0], t[1]))
    rows = [
        {"entryId": e.entryId, "keys": list(e.keys), "content": e.content} for _, _, e in scored
    ]
    return _cap_rows(rows)


def novel_body_read(snapshot: NovelSnapshot, p: BodyReadParams) -> dict[str, Any]:
    _chapter_or_error(snapshot, p.chapterId)
    # SERVE-8: the chapter's live commits in seq order (`commit_totals`), not a pass over the book
    chapter = commit_totals(snapshot.novel_id, live_commits(snapshot)).by_chapter.get(p.chapterId, ())
    commits = [c for c in chapter if p.sceneId is None or c.scene_id == p.sceneId]
    # Each paragraph carries its citable source so canon changes can point at it.
    full = "\n\n".join(
        f"[{c.commit_id}#{i}] {para}" for c in commits for i, para in enumerate(c.paragraphs)
    )
    text, truncated = cap_text(full)
    return {
        "chapterId": p.chapterId,
        "sceneId": p.sceneId,
        "commitIds": [c.commit_id for c in commits],
        "effectiveCharacters": sum(c.effective_characters for c in commits),
        "text": text,
        "truncated": truncated,
    }


def _body_read_prose(snapshot: NovelSnapshot, p: BodyReadParams) -> list[str]:
    """The commits `novel_body_read` may quote: the chapter's (the scene's), superseded or not."""
    chapter = commit_totals(snapshot.novel_id, snapshot.commits).by_chapter.get(p.chapterId, ())
    return [c.commit_id for c in chapter if p.sceneId is None or c.scene_id == p.sceneId]


def _all_prose(snapshot: NovelSnapshot, _: Any) -> list[str]:
    return [c.commit_id for c in snapshot.commits]


def novel_body_search(snapshot: NovelSnapshot, p: SearchParams) -> dict[str, Any]:
    terms = _terms(p.query)
    rows = []
    for c in live_commits(snapshot):
        for i, para in enumerate(c.paragraphs):
            if _score(para, terms):
                rows.append(
                    {
                        "source": f"{c.commit_id}#{i}",
                        "chapterId": c.chapter_id,
                        "sceneId": c.scene_id,
                        "excerpt": _excerpt(para, terms),
                    }
                )
    return _cap_rows(rows)


def novel_facts_read(snapshot: NovelSnapshot, p: FactsReadParams) -> dict[str, Any]:
    if p.characterId is not None:
        outline = _require_outline(snapshot)
        try:
            outline.character(p.characterId)
        except KeyError:
            raise ToolContractError(f"characterId: unknown character {p.characterId!r}") from None
    facts = []
    for c in live_commits(snapshot):
        for change in c.canon_changes:
            if p.characterId is not None and p.characterId not in change.character_ids:
                continue
            fact: dict[str, Any] = {
                "commitId": c.commit_id,
                "kind": change.kind,
                "summary": change.summary,
                "sources": list(change.sources),
                "characterIds": list(change.character_ids),
            }
            if change.detail is not None:
                fact["detail"] = change.detail
            facts.append(fact)
    # The most recent facts matter most: keep the newest rows when capping.
    recent = facts[-SEARCH_ROW_CAP:]
    return {"rows": recent, "totalMatches": len(facts), "truncated": len(facts) > SEARCH_ROW_CAP}


def novel_references_read(snapshot: NovelSnapshot, p: ReferencesReadParams) -> dict[str, Any]:
    """CTX-13: the licensed references the writer's pack carries — the same authorisation (the
    `generation` scenario, purpose `production`, the read's date for expiry), the same order and
    bounds; never one left out of the context, and never why (that is in the manifest)."""
    outline = _require_outline(snapshot)
    request = validate_request(novel_id=snapshot.novel_id, unit_id="tools", as_of=snapshot.as_of_seq,
                               scenario="generation", purpose="production", profile="bounded")
    cards = select_references(outline.references, request, snapshot.read_on)
    rows = [{"referenceId": c.reference_id, "kind": c.kind, "text": c.text, "source": c.source}
            for c in cards if p.kind is None or c.kind == p.kind]
    return {"rows": rows, "totalMatches": len(rows), "truncated": False}


def memory_search(snapshot: NovelSnapshot, p: SearchParams) -> dict[str, Any]:
    terms = _terms(p.query)
    scored = []
    for note_id, text in snapshot.notes:
        score = _score(text, terms) + _score(note_id, terms)
        if score:
            scored.append((-score, note_id, text))
    scored.sort(key=lambda t: (t[0], t[1]))
    return _cap_rows([{"noteId": n, "excerpt": _excerpt(t, terms)} for _, n, t in scored])


def memory_read(snapshot: NovelSnapshot, p: MemoryReadParams) -> dict[str, Any]:
    for note_id, text in snapshot.notes:
        if note_id == p.noteId:
            capped, truncated = cap_text(text, MEMORY_READ_CAP)
            return {"noteId": note_id, "text": capped, "truncated": truncated}
    raise ToolContractError(f"noteId: unknown note {p.noteId!r}")


# --- the registry -------------------------------------------------------------------------------

_OUTLINE = ("novels", "outline_revisions")

TOOL_REGISTRY: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "novel_status_read",
            "Progress of the novel: status, committed characters, per-chapter scene progress and "
            "the unit being written.",
            ("novels", "outline_revisions", "units", "commits"),
            NoParams,
            novel_status_read,
        ),
        ToolSpec(
            "novel_outline_read",
            "The story and one chapter of the outline with its scenes, plus the neighbouring "
            "chapters in brief. Defaults to the chapter being written.",
            (*_OUTLINE, "units"),
            OutlineReadParams,
            novel_outline_read,
        ),
        ToolSpec(
            "novel_character_read",
            "One character's outline card: identity, state, motivation, arc, relations.",
            _OUTLINE,
            CharacterReadParams,
            novel_character_read,
        ),
        ToolSpec(
            "novel_lore_search",
            f"Search the world book by keys and content; at most {SEARCH_ROW_CAP} entries.",
            _OUTLINE,
            SearchParams,
            novel_lore_search,
        ),
        ToolSpec(
            "novel_body_read",
            f"Committed prose of one chapter (optionally one scene), each paragraph tagged with its "
            f"citable source; cut at {BODY_READ_CAP} characters with a [truncated: …] marker.",
            (*_OUTLINE, "commits"),
            BodyReadParams,
            novel_body_read,
            prose=_body_read_prose,
        ),
        ToolSpec(
            "novel_body_search",
            f"Search committed prose; returns paragraph sources and excerpts, at most "
            f"{SEARCH_ROW_CAP} rows.",
            ("commits",),
            SearchParams,
            novel_body_search,
            prose=_all_prose,
        ),
        ToolSpec(
            "novel_facts_read",
            f"Canon facts recorded by earlier commits, with their commit ids; optionally about one "
            f"character. The newest {SEARCH_ROW_CAP} rows.",
            (*_OUTLINE, "commits"),
            FactsReadParams,
            novel_facts_read,
        ),
        ToolSpec(
            "memory_search",
            f"Search the author's notes for this novel; at most {SEARCH_ROW_CAP} rows.",
            ("notes",),
            SearchParams,
            memory_search,
        ),
        ToolSpec(
            "memory_read",
            "Read one author note by id.",
            ("notes",),
            MemoryReadParams,
            memory_read,
        ),
        ToolSpec(
            "novel_references_read",
            "The licensed style samples and pattern cards of the pack's pattern-references.",
            _OUTLINE,
            ReferencesReadParams,
            novel_references_read,
        ),
        ToolSpec(
            COMMIT_TOOL,
            "Commit the prose of the unit being written, once. Paragraphs are prose only: no "
            "headings, ids, notes or closing markers. The first successful commit ends the run.",
            (),
            CommitArgs,
            None,
            kind="write",
        ),
    )
}

READ_TOOLS: dict[str, ToolSpec] = {n: s for n, s in TOOL_REGISTRY.items() if s.kind == "read"}
WRITE_TOOLS: dict[str, ToolSpec] = {n: s for n, s in TOOL_REGISTRY.items() if s.kind == "write"}


# --- contract: validation, definitions, gate -----------------------------------------------------


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(arguments)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def get_tool(name: str) -> ToolSpec:
    try:
        return TOOL_REGISTRY[name]
    except KeyError:
        raise ToolContractError(f"unknown tool {name!r}") from None


def parse_tool_arguments(raw: str) -> dict[str, Any]:
    """Arguments as a model sends them (JSON text) → a dict, or a contract error.

    Parsed leniently (MODEL-2): raw control characters inside strings, as grammar-constrained
    servers emit them, are accepted here; the arguments are then validated strictly."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw, strict=False)
    except json.JSONDecodeError as e:
        raise ToolContractError(
            f"arguments are not valid JSON: {e.msg} at column {e.colno}"
        ) from None
    if not isinstance(value, dict):
        raise ToolContractError("arguments must be a JSON object")
    return value


def validate_tool_args(name: str, args: dict[str, Any]) -> BaseModel | CommitArgs:
    params = get_tool(name).params
    if issubclass(params, BaseModel):
        try:
            return params.model_validate(args)
        except ValidationError as e:
            raise ToolContractError(f"{name}: invalid arguments: {_describe(e)}") from None
    try:
        return msgspec.convert(args, params)
    except msgspec.ValidationError as e:
        raise ToolContractError(f"{name}: invalid arguments: {e}") from None


def _read_call(name: str, args: dict[str, Any]) -> tuple[ToolSpec, BaseModel | CommitArgs]:
    spec = get_tool(name)
    if spec.kind != "read" or spec.impl is None:
        raise ToolContractError(f"{name!r} is not a read tool")
    return spec, validate_tool_args(name, args)


def call_read_tool(snapshot: NovelSnapshot, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Validate and run one read tool against the delegated novel's snapshot."""
    spec, params = _read_call(name, args)
    assert spec.impl is not None
    result: dict[str, Any] = spec.impl(snapshot, params)
    return result


def prose_to_read(
    snapshot: NovelSnapshot, loaded: Collection[str], name: str, args: dict[str, Any]
) -> list[str]:
    """The commits whose prose this call reads and `snapshot` does not hold yet (`loaded`: the
    commits whose prose it holds), in seq order; the contract errors of a call that reads prose,
    as `call_read_tool` raises them. PERF-2: the read tools' snapshot carries the prose of the chapter being
    written only — the rest of the book is read when a tool asks for it, so a run does not
    decode the whole book's prose on every unit."""
    spec = get_tool(name)
    if spec.prose is None:  # reads no prose (or is no read tool: `call_read_tool` says so)
        return []
    _, params = _read_call(name, args)
    wanted = set(spec.prose(snapshot, params)).difference(loaded)
    if not wanted:
        return []
    seqs = commit_totals(snapshot.novel_id, snapshot.commits).seqs  # SERVE-8: no pass over the book
    return sorted((cid for cid in wanted if cid in seqs), key=seqs.__getitem__)


def with_prose(snapshot: NovelSnapshot, prose: Mapping[str, list[str]]) -> NovelSnapshot:
    """`snapshot` with these commits' paragraphs filled in (commits are immutable: prose read
    later by commit id and `seq <= as_of_seq` is the prose the snapshot's read would have seen)."""
    commits = [
        msgspec.structs.replace(c, paragraphs=prose[c.commit_id]) if c.commit_id in prose else c
        for c in snapshot.commits
    ]
    return msgspec.structs.replace(snapshot, commits=commits)


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline pydantic `$defs` so every OpenAI-compatible server can read the schema."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            # Drop pydantic's generated titles (strings), never a property that is named "title".
            return {
                k: walk(v)
                for k, v in node.items()
                if k != "$defs" and not (k == "title" and isinstance(v, str))
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


def tool_parameters_schema(name: str) -> dict[str, Any]:
    return copy.deepcopy(_parameters_schema(name))


@functools.cache
def _parameters_schema(name: str) -> dict[str, Any]:
    # The registry is fixed for the process: generate each schema once (it is on every run's path).
    params = get_tool(name).params
    if issubclass(params, BaseModel):
        schema = _inline_refs(params.model_json_schema())
    else:  # the commit: generated from the one body schema (novel.body)
        schema = _inline_refs(msgspec.json.schema(params))
        schema.pop("description", None)  # the tool's own description says it
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def openai_tool_definitions(names: Iterable[str]) -> list[dict[str, Any]]:
    """Function-tool definitions for `names`, generated from the registry (TOOL-1). Each call
    returns its own copy (a caller may change it); the definitions of one list of names are built
    once and copied by decoding their JSON, several times cheaper than a deep copy (PERF-2: every
    writer run asks for them)."""
    result: list[dict[str, Any]] = json.loads(_definitions_json(tuple(dict.fromkeys(names))))
    return result


@functools.lru_cache(maxsize=64)
def _definitions_json(names: tuple[str, ...]) -> str:
    return json.dumps([
        {
            "type": "function",
            "function": {
                "name": name,
                "description": get_tool(name).description,
                "parameters": _parameters_schema(name),
            },
        }
        for name in names
    ])


ENV_READ_TOOLS = "NOVELBUS_READ_TOOLS"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def read_tools_switch(env: Mapping[str, str] | None = None) -> bool:
    """TOOL-4: NOVELBUS_READ_TOOLS (default on); ValueError naming it for anything but a switch."""
    raw = (os.environ if env is None else env).get(ENV_READ_TOOLS, "").strip().lower()
    if not raw or raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{ENV_READ_TOOLS} must be a switch (1/true/yes/on or 0/false/no/off), got {raw!r}")


def check_read_tools_gate(allow_list: Iterable[str], read_tools_enabled: bool) -> None:
    """TOOL-4: fail closed before a run whose allow-list names read tools that are not enabled."""
    names = list(allow_list)
    for name in names:
        get_tool(name)  # an unknown name can never be served: a contract error, not a gate
    wanted = [n for n in names if n in READ_TOOLS]
    if wanted and not read_tools_enabled:
        raise ToolGateError(
            f"{READ_TOOLS_NOT_ENABLED}: the allow-list names read tools ({', '.join(wanted)}) "
            "but read tools are not enabled"
        )


def registry_listing() -> list[dict[str, Any]]:
    """What `novelbus tools --list` prints (TOOL-3)."""
    return [
        {
            "name": s.name,
            "kind": s.kind,
            "description": s.description,
            "tablesRead": list(s.tables_read),
            "parameters": tool_parameters_schema(s.name),
        }
        for s in TOOL_REGISTRY.values()
    ]
