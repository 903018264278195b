"""MODEL-5 at creation: does the novel's first request fit the writer model's window?

Each writer shape opens its run with a request the window must hold, plus room to answer:

- W2: the trimmed pack as the system message, the W2 instruction, the W2 allow-list's tool
  definitions;
- W1: the full pack and the W1 instruction, no tools;
- inline: the session preamble (the trimmed pack's protocol and story) and the first unit's brief
  (`writers.inline`), with the same tool definitions as W2.

`first_request_bound` renders that pack (pure, from the novel file alone, no body yet) for every
scene's first unit and returns the largest estimate — a lower bound of what the runs will send
(later units also carry prior prose, bounded by the pack profile, and the inline session grows
until it compacts; the run-time fit and the compaction gate still guard those).
"""

from __future__ import annotations

from dataclasses import dataclass

from novelbus.actors.writer import output_tokens_from_env
from novelbus.novel.outline import NovelFile, outline_revision
from novelbus.novel.pack import WriterPackError, render_pack
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.inline import session_preamble, unit_brief
from novelbus.writers.provider import ChatMessage
from novelbus.writers.runner import (
    MIN_OUTPUT_TOKENS,
    W1_INSTRUCTION,
    W2_INSTRUCTION,
    expected_output_tokens,
    request_tokens,
)
from novelbus.writers.sampling import capped_output_tokens, sampling_of
from novelbus.writers.structured import unit_target_max
from novelbus.writers.tools import W2_ALLOW_LIST, openai_tool_definitions

SHAPES = ("W1", "W2", "inline")


@dataclass(frozen=True)
class RequestBound:
    tokens: int  # estimated prompt tokens (pack + instruction + tools + template margin) + reply reserve
    tool_tokens: int  # of which the tool definitions
    scene_id: str  # the scene whose first unit needs the most
    reserve: int = MIN_OUTPUT_TOKENS  # of which the reply: the unit's targetMax in tokens (QUAL-4)


def w2_floor() -> RequestBound:
    """What every W2 request needs before its pack: instruction, tool definitions, template margin
    and the reply reserve (what `novelbus probe` sets against the window; scene_id empty)."""
    tools = openai_tool_definitions(W2_ALLOW_LIST)
    tool_only = request_tokens([], tools) - request_tokens([], None)
    tokens = request_tokens([user_message(W2_INSTRUCTION)], tools) + MIN_OUTPUT_TOKENS
    return RequestBound(tokens=tokens, tool_tokens=tool_only, scene_id="")


def _opening(shape: str, pack_text: str) -> list[ChatMessage]:
    if shape == "W1":
        return [system_message(pack_text), user_message(W1_INSTRUCTION)]
    if shape == "inline":
        return [system_message(session_preamble(pack_text)), user_message(unit_brief(pack_text))]
    return [system_message(pack_text), user_message(W2_INSTRUCTION)]


def first_request_bound(nf: NovelFile, shape: str = "W2") -> RequestBound | None:
    """The largest first request of `shape` (W1, W2, inline) over the outline's scenes, with the
    reply reserve of that unit's expected output, its targetMax (None: no scene to write)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown writer shape {shape!r}")
    outline = nf.outline
    if outline is None:
        return None
    tools = None if shape == "W1" else openai_tool_definitions(W2_ALLOW_LIST)
    tool_only = request_tokens([], tools) - request_tokens([], None)
    cap = capped_output_tokens(output_tokens_from_env(), sampling_of(nf.config.model.sampling))
    best: RequestBound | None = None
    for scene in outline.scenes:
        unit = UnitView(unit_id="u-fit", chapter_id=scene.chapterId, scene_id=scene.sceneId, fragment=1,
                        state="prepared", attempt=0, continuation_anchor=scene.continuationAnchor)
        snapshot = NovelSnapshot(
            novel_id="n-fit", title=nf.title, status="active", pause_reason=None, config=nf.config,
            outline=outline, outline_revision=outline_revision(None, "create", outline),
            units=[unit], commits=[], as_of_seq=0,
        )
        try:
            pack = render_pack(snapshot, unit.unit_id, "full" if shape == "W1" else "trimmed")
            messages = _opening(shape, pack.text)
        except (WriterPackError, ValueError):
            continue  # a pack that cannot be built is refused at dispatch, with its own reason
        # QUAL-4: room for the whole unit, as the run reserves it (never more than a call may ask for)
        reserve = min(expected_output_tokens(unit_target_max(pack.text), pack.text), cap)
        tokens = request_tokens(messages, tools) + reserve
        if best is None or tokens > best.tokens:
            best = RequestBound(tokens=tokens, tool_tokens=tool_only, scene_id=scene.sceneId, reserve=reserve)
    return best


def w2_request_bound(nf: NovelFile) -> RequestBound | None:
    """The largest first W2 request over the outline's scenes (None: no scene to write)."""
    return first_request_bound(nf, "W2")


_WHAT = {"W2": "trimmed pack, instruction", "W1": "full pack, instruction",
         "inline": "session preamble, first unit brief"}


def fit_error(nf: NovelFile, window: int, shape: str = "W2") -> str | None:
    """A clear reason when the first `shape` request cannot fit `window` tokens, else None."""
    bound = first_request_bound(nf, shape)
    if bound is None or bound.tokens <= window:
        return None
    tools = f", {bound.tool_tokens:,} of tool definitions" if bound.tool_tokens else ""
    return (f"the writer model's context window of {window:,} tokens cannot hold the first {shape} request "
            f"for scene {bound.scene_id}: about {bound.tokens:,} estimated tokens ({_WHAT[shape]}{tools} "
            f"and a {bound.reserve:,}-token reply reserve: the unit's targetMax in tokens)")


def w2_fit_error(nf: NovelFile, window: int) -> str | None:
    """A clear reason when the first W2 request cannot fit `window` tokens, else None."""
    return fit_error(nf, window, "W2")
