"""MODEL-3: the W2 tool-choice policy — which tool, if any, the next model call is forced to.

Pure: `next_choice` decides from a summary of the run so far (`RunState`), `research_target`
picks the read tool a forced research call uses from the pack the run was given. The runner
(`writers.runner`, `writers.inline`) applies the decision; every forced call still goes through
the runner's allow-list and scope checks like any other (nothing here executes a tool).

The policy, in order:

1. the commit tool is not allowed → never force anything (the server's default, `auto`);
2. the last allowed round → force `novel_body_commit`;
3. nothing researched yet and the model answered in text (or cut its text at max_tokens), or
   the model is known not to call tools under `auto` (it declined earlier in this run or in an
   earlier run of this process, or the user said so), and the window leaves room for a read
   result and the commit (`RESEARCH_ROOM_TOKENS`) → force ONE read tool by name
   (`research_target`: the previous prose of the unit's chapter when there is some, else the
   chapter's outline, else the novel's status);
4. the model answered in text, the previous call was forced research, or the model is known
   not to call tools under `auto` and has researched → force the commit (so a forced commit
   the claim manager refused is followed by another forced commit, not by `auto` again);
5. otherwise `auto`: the model decides (strong tool users research and commit on their own).

`auto` is never sent explicitly (some servers refuse it); a forced call is
`{"type": "function", "function": {"name": …}}` with that tool's parameters narrowed to what the
delegated unit allows (`pinned_parameters`), so a grammar-constrained server cannot name another
chapter or unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from novelbus.writers.tools import COMMIT_TOOL

# A forced read is only worth its place when the window can still hold a typical read result
# (a chapter's outline is ~850 tokens for six scenes) and the commit that follows it; with less
# room the policy forces the commit straight away (MODEL-5: never a research that cannot fit).
RESEARCH_ROOM_TOKENS = 1024

BODY_READ = "novel_body_read"
OUTLINE_READ = "novel_outline_read"
STATUS_READ = "novel_status_read"


@dataclass(frozen=True)
class RunState:
    """What the policy needs to know about one W2 run so far."""

    rounds: int  # tool rounds executed (replies that carried tool calls)
    max_tool_rounds: int
    researched: bool  # a read tool call was executed in this run (own or forced)
    answered_in_text: bool  # the last reply carried no tool call (text, or text cut at max_tokens)
    last_forced: str | None = None  # the tool the previous call was forced to, if any
    auto_declined: bool = False  # known: this model does not call tools under `auto` (this run or before)
    calls: int = 0  # model calls made so far in this run
    room: int | None = None  # tokens the window leaves beyond the next request's prompt (None: no window)


@dataclass(frozen=True)
class Research:
    """The read tool a forced research call uses, and its parameters narrowed to the unit."""

    tool: str
    chapter_id: str | None  # pinned into the tool's parameters (None: the tool takes none)


@dataclass(frozen=True)
class Choice:
    tool: str | None  # None: the server's default (auto); else the tool forced by name
    why: str  # "auto", "research-after-text", "research-known", "commit-last-round", …

    @property
    def forced(self) -> bool:
        return self.tool is not None


def next_choice(state: RunState, allowed: tuple[str, ...], research: Research | None) -> Choice:
    """The next call's tool choice (see the module docstring for the rules, in order)."""
    if COMMIT_TOOL not in allowed:
        return Choice(None, "auto")
    if state.rounds >= state.max_tool_rounds - 1:
        return Choice(COMMIT_TOOL, "commit-last-round")
    can_research = (research is not None and research.tool in allowed and not state.researched
                    and (state.room is None or state.room >= RESEARCH_ROOM_TOKENS))
    if can_research and research is not None:
        if state.answered_in_text:
            return Choice(research.tool, "research-after-text")
        if state.auto_declined:
            return Choice(research.tool, "research-known")
    if state.answered_in_text:
        return Choice(COMMIT_TOOL, "commit-after-text")
    if state.last_forced is not None and state.last_forced != COMMIT_TOOL:
        return Choice(COMMIT_TOOL, "commit-after-research")
    if state.auto_declined and state.researched:
        return Choice(COMMIT_TOOL, "commit-known")
    return Choice(None, "auto")


def research_target(pack_blocks: dict[str, dict[str, Any]], allowed: tuple[str, ...]) -> Research | None:
    """The read tool that gives the unit what it needs, from the pack's parsed blocks
    (`{block: fields}`; a `prose-tail` block means the chapter already has prose): the chapter's
    committed prose, else the chapter's outline (its scenes), else the novel's status."""
    chapter = pack_blocks.get("chapter", {}).get("chapterId")
    chapter_id = chapter if isinstance(chapter, str) and chapter else None
    if chapter_id is not None and "prose-tail" in pack_blocks and BODY_READ in allowed:
        return Research(BODY_READ, chapter_id)
    if chapter_id is not None and OUTLINE_READ in allowed:
        return Research(OUTLINE_READ, chapter_id)
    if STATUS_READ in allowed:
        return Research(STATUS_READ, None)
    return None


def pack_blocks(pack_text: str) -> dict[str, dict[str, Any]]:
    """The pack's blocks as `{name: top-level fields}` (what `research_target` reads)."""
    from novelbus.novel.pack import pack_fields

    try:
        return pack_fields(pack_text)  # its own dicts: the caller may keep them
    except (ValueError, TypeError):
        return {}


def pinned_parameters(research: Research) -> dict[str, Any]:
    """A forced research call's parameters: the unit's chapter, nothing else to invent."""
    if research.chapter_id is None:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    return {
        "type": "object",
        "properties": {"chapterId": {"type": "string", "enum": [research.chapter_id]}},
        "required": ["chapterId"],
        "additionalProperties": False,
    }
