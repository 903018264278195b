"""MODEL-5 at creation: does the novel's first W2 request fit the writer model's window?

A W2 run opens with the trimmed pack as its system message, the W2 instruction and the tool
definitions of the W2 allow-list; the model then needs room to answer. `w2_request_bound` renders
that pack (pure, from the novel file alone, no body yet) for every scene's first unit and returns
the largest estimate — a lower bound of what the run will send (later units also carry prior
prose, bounded by the pack profile; the run-time fit still guards those).
"""

from __future__ import annotations

from dataclasses import dataclass

from novelbus.novel.outline import NovelFile, outline_revision
from novelbus.novel.pack import WriterPackError, render_pack
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.runner import MIN_OUTPUT_TOKENS, W2_INSTRUCTION, request_tokens
from novelbus.writers.tools import W2_ALLOW_LIST, openai_tool_definitions


@dataclass(frozen=True)
class RequestBound:
    tokens: int  # estimated prompt tokens (pack + instruction + tools + template margin) + output reserve
    tool_tokens: int  # of which the tool definitions
    scene_id: str  # the scene whose first unit needs the most


def w2_floor() -> RequestBound:
    """What every W2 request needs before its pack: instruction, tool definitions, template margin
    and the reply reserve (what `novelbus probe` sets against the window; scene_id empty)."""
    tools = openai_tool_definitions(W2_ALLOW_LIST)
    tool_only = request_tokens([], tools) - request_tokens([], None)
    tokens = request_tokens([user_message(W2_INSTRUCTION)], tools) + MIN_OUTPUT_TOKENS
    return RequestBound(tokens=tokens, tool_tokens=tool_only, scene_id="")


def w2_request_bound(nf: NovelFile) -> RequestBound | None:
    """The largest first W2 request over the outline's scenes (None: no scene to write)."""
    outline = nf.outline
    if outline is None:
        return None
    tools = openai_tool_definitions(W2_ALLOW_LIST)
    tool_only = request_tokens([], tools) - request_tokens([], None)
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
            pack = render_pack(snapshot, unit.unit_id, "trimmed")
        except WriterPackError:
            continue  # a pack that cannot be built is refused at dispatch, with its own reason
        messages = [system_message(pack.text), user_message(W2_INSTRUCTION)]
        tokens = request_tokens(messages, tools) + MIN_OUTPUT_TOKENS
        if best is None or tokens > best.tokens:
            best = RequestBound(tokens=tokens, tool_tokens=tool_only, scene_id=scene.sceneId)
    return best


def w2_fit_error(nf: NovelFile, window: int) -> str | None:
    """A clear reason when the first W2 request cannot fit `window` tokens, else None."""
    bound = w2_request_bound(nf)
    if bound is None or bound.tokens <= window:
        return None
    return (f"the writer model's context window of {window:,} tokens cannot hold the first W2 request "
            f"for scene {bound.scene_id}: about {bound.tokens:,} estimated tokens (trimmed pack, "
            f"instruction, {bound.tool_tokens:,} of tool definitions and a {MIN_OUTPUT_TOKENS}-token "
            "reply reserve)")
