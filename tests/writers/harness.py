"""Test harness for writers through the actors: a fake chat-completions model, per-run scripted
behaviours, and a helper that drives one novel until it finishes or pauses.

Nothing here mocks NATS or PostgreSQL; the fake model is an HTTP server on 127.0.0.1 (see
`chat_server.ChatServer`) whose answers come from the deterministic offline writer.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from novelbus.actors.context import Settings
from novelbus.actors.runtime import Runtime, running
from novelbus.app.probe import PROBE_NOVEL
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.text import estimate_tokens
from novelbus.writers.offline import OfflineProvider, UnitBrief
from novelbus.writers.provider import ChatMessage, ModelProvider, ModelReply, ToolCall
from novelbus.writers.runner import W1_REPAIR
from tests.waiting import Driven, drive  # noqa: F401 - the one `drive` (HOUSE-10), re-exported for the writer tests
from tests.writers.chat_server import Response, completion

# --- a fake OpenAI-compatible model -----------------------------------------------------------------


def _prompt_text(messages: list[ChatMessage]) -> str:
    parts = []
    for m in messages:
        parts.append(f"<{m.get('role')}>")
        if isinstance(m.get("content"), str):
            parts.append(m["content"])
        for call in m.get("tool_calls") or ():
            fn = call.get("function", {})
            parts.append(f"{call.get('id')}:{fn.get('name')}:{fn.get('arguments')}")
    return "".join(parts)


class FakeModel:
    """The offline writer behind the chat-completions wire format, with usage and a prefix cache.

    `cached_tokens` is what a server's prefix cache would serve: the longest prompt prefix shared
    with any earlier request. `usage=False` omits usage; `cache=False` omits cache details.
    """

    def __init__(self, inner: ModelProvider | None = None, *, usage: bool = True, cache: bool = True) -> None:
        self.inner = inner or OfflineProvider(report_usage=False)
        self.usage = usage
        self.cache = cache
        self.prompts: list[str] = []
        self.cached: list[int] = []

    async def __call__(self, request: dict[str, Any]) -> Response:
        messages = request["messages"]
        reply = await self.inner.complete(messages, request.get("tools"),
                                          max_output_tokens=int(request.get("max_tokens") or 1024))
        prompt = _prompt_text(messages)
        shared = max((len(os.path.commonprefix([prompt, p])) for p in self.prompts), default=0)
        self.prompts.append(prompt)
        cached = estimate_tokens(prompt[:shared]) if shared else 0
        self.cached.append(cached)
        usage: dict[str, Any] | None = None
        if self.usage:
            produced = (reply.text or "") + "".join(c.name + c.arguments for c in reply.tool_calls)
            usage = {"prompt_tokens": estimate_tokens(prompt), "completion_tokens": estimate_tokens(produced),
                     "total_tokens": estimate_tokens(prompt) + estimate_tokens(produced)}
            if self.cache:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
        calls = [(c.id, c.name, c.arguments) for c in reply.tool_calls]
        finish = "tool_calls" if calls else "stop"
        return completion(content=reply.text, tool_calls=calls or None, finish_reason=finish, usage=usage)


# --- scripted behaviours per writer run -----------------------------------------------------------


@dataclass
class RunView:
    """What a behaviour sees of one model call."""

    run: int  # 0-based writer run (dispatch) seen by this provider
    step: int  # 0-based call within the run
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None
    unit_id: str | None  # from the pack's [[unit]] block


Behaviour = Callable[[RunView], ModelReply | None]


@dataclass
class PerRun:
    """runs[i] answers the calls of the i-th writer run (None: behave like the offline writer).

    A run starts with a call whose last message is a user turn (the pack or the instruction);
    later calls of a run end with tool results. Every call is recorded.
    """

    runs: Sequence[Behaviour | None]
    fallback: ModelProvider = field(default_factory=OfflineProvider)
    default: Behaviour | None = None  # for runs past the list (None: offline)
    name: str = "scripted"
    label: str = "scripted (test behaviours, no language model)"
    structured_mode: str = "prompt"  # MODEL-2: no server to probe (P6)
    views: list[RunView] = field(default_factory=list)
    unit_ids: list[str | None] = field(default_factory=list)  # per run

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        # Calls within a run end with tool results, or with the W1 repair request (MODEL-2).
        fresh = messages[-1].get("role") == "user" and not str(
            messages[-1].get("content") or "").startswith(W1_REPAIR.split("{", 1)[0])
        if fresh:
            packs = [m["content"] for m in messages
                     if isinstance(m.get("content"), str) and "[[unit]]" in m["content"].split("\n")]
            self.unit_ids.append(UnitBrief.from_pack(packs[-1] if packs else "").unit_id)
        run = len(self.unit_ids) - 1
        step = 0 if fresh else sum(1 for v in self.views if v.run == run)
        view = RunView(run, step, copy.deepcopy(messages), copy.deepcopy(tools), self.unit_ids[run])
        self.views.append(view)
        behaviour = self.runs[run] if run < len(self.runs) else self.default
        reply = behaviour(view) if behaviour is not None else None
        if reply is None:
            reply = await self.fallback.complete(messages, tools, max_output_tokens=max_output_tokens)
        return reply


def tool_reply(*calls: tuple[str, dict[str, Any]], prefix: str = "call") -> ModelReply:
    return ModelReply(text=None, stop_reason="tool_calls",
                      tool_calls=[ToolCall(id=f"{prefix}-{i}", name=n, arguments=json.dumps(a))
                                  for i, (n, a) in enumerate(calls)])


def text_reply(text: str | None) -> ModelReply:
    return ModelReply(text=text, tool_calls=[], stop_reason="completed")


def good_body(paragraph: str = "The bell rang once more over the dark water.") -> dict[str, Any]:
    return {"paragraphs": [paragraph, "Mara listened and did not move."],
            "sceneCompletion": {"completed": True, "basis": "the scene goal is reached"},
            "canonChanges": []}


# --- stacks and novels ----------------------------------------------------------------------------


def tiny_novel(shape: str = "W2", **budgets: Any) -> NovelFile:
    """Two scenes in one chapter (the probe's novel), with the given writer shape and budgets."""
    data = copy.deepcopy(PROBE_NOVEL)
    data["title"] = "The Ferry Bell"
    data["config"]["writerShape"] = shape
    data["config"]["budgets"] = {"externalRetry": {"maxAttempts": 1, "backoffMs": 0}, **budgets}
    # The scripted writers of the run-loop tests commit two-sentence bodies on purpose: the
    # content gate's length check is off here, every other check stays on (QUAL-2).
    data["config"]["quality"] = {"minLengthRatio": 0}
    return parse_novel_file(json.dumps(data))


def sample_with(shape: str) -> NovelFile:
    from novelbus.novel.sample import sample_novel_bytes

    data = json.loads(sample_novel_bytes())
    data["config"]["writerShape"] = shape
    return parse_novel_file(json.dumps(data))


@contextlib.asynccontextmanager
async def writer_stack(nats_url: str, new_database: Any, namespace: str, *, provider: ModelProvider | None = None,
                       settings: Settings | None = None) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    kwargs = {"writer": {"provider": provider}} if provider is not None else None
    async with running(nats_url, dsn, subjects=Subjects(namespace), settings=settings, actor_kwargs=kwargs) as rt:
        yield rt


