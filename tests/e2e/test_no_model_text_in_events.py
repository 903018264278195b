"""REL-9: events carry no model-authored text — a full novel, every event scanned.

Every string a model wrote (reply text, every string inside its tool-call arguments) and every
committed paragraph is cut into 20-character windows; no window may appear in any string of any
event, in the JetStream events stream or in the events table (tool arguments, recorded as JSON
text inside `tool.started`, are opened and scanned too).
"""

from __future__ import annotations

import json
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.provider import ChatMessage, ModelProvider, ModelReply
from novelbus.writers.record import ID_PATTERN
from tests.e2e.conftest import run_novel
from tests.e2e.test_token_never_leaves import _read_stream

WINDOW = 20


class RecordingProvider:
    """Test instrumentation: passes every call through and keeps every reply."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.name, self.label = inner.name, inner.label
        self.structured_mode = getattr(inner, "structured_mode", None)
        self.replies: list[ModelReply] = []

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        reply = await self.inner.complete(messages, tools, max_output_tokens=max_output_tokens, **options)
        self.replies.append(reply)
        return reply


def strings(value: Any) -> list[str]:
    """Every string inside a JSON value; a string that is itself JSON is opened too."""
    if isinstance(value, str):
        out = [value]
        if value[:1] in "{[":
            try:
                out += strings(json.loads(value))
            except json.JSONDecodeError:
                pass
        return out
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [str(k), *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def windows(text: str) -> set[str]:
    return {text[i:i + WINDOW] for i in range(len(text) - WINDOW + 1)}


def model_windows(replies: list[ModelReply], paragraphs: list[str]) -> set[str]:
    texts = list(paragraphs)
    for reply in replies:
        texts.append(reply.text or "")
        for call in reply.tool_calls:
            try:
                texts += strings(json.loads(call.arguments))
            except json.JSONDecodeError:
                texts.append(call.arguments)
    # ids and enum values are recorded by design (REL-9); they have the shape of an id
    return {w for t in texts if not ID_PATTERN.match(t) for w in windows(t)}


def leaks(event_texts: list[str], needles: set[str]) -> list[str]:
    return sorted({w for t in event_texts for w in windows(t) if w in needles})


async def test_no_event_carries_model_text_or_prose(stack: Runtime) -> None:
    """REL-9"""
    ctx = stack.ctx
    writer = stack.actor("writer")
    recorder = RecordingProvider(writer.state.provider)  # type: ignore[attr-defined]
    writer.state.provider = recorder  # type: ignore[attr-defined]
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))

    commits = await store.list_commits(ctx.pool, novel_id)
    bodies = [await store.get_commit_for_unit(ctx.pool, novel_id, c.unit_id) for c in commits]
    paragraphs = [p for b in bodies if b is not None and b.body is not None for p in b.body.paragraphs]
    assert len(paragraphs) >= len(commits)
    needles = model_windows(recorder.replies, paragraphs)
    tool_calls = sum(len(r.tool_calls) for r in recorder.replies)
    assert len(commits) >= 9 and tool_calls >= len(commits) and len(needles) > 5_000

    stream = await _read_stream(ctx.js, ctx.subjects.events_stream, ctx.subjects.events_all)
    rows = await store.list_events(ctx.pool, novel_id, limit=100_000)
    types = {r.type for r in rows}
    assert {"tool.started", "unit.committed", "writer.finished", "novel.finished"} <= types
    assert len(stream) >= len(rows) > 50
    event_texts = [s for m in stream for s in strings(json.loads(m.data))]
    event_texts += [s for r in rows for s in strings(r.payload)]
    assert leaks(event_texts, needles) == []


def test_scan_finds_a_planted_leak() -> None:
    """REL-9: The scan itself can fail: a basis sentence copied into an event payload is found."""
    basis = "The heroine finally opens the sealed door of the archive."
    reply = ModelReply(text=None, tool_calls=[])
    needles = model_windows([reply], [basis])
    assert leaks(strings({"args": json.dumps({"basis": basis[5:40]})}), needles)
    assert leaks(strings({"summary": "x"}), needles) == []


async def test_a_unit_id_the_writer_made_up_is_recorded_as_a_digest(stack: Runtime) -> None:
    """REL-9: The unit a commit asks for is the writer's text: an event about a refused commit keeps it
    only when it has the shape of an id (REL-5 still records the refusal)."""
    from novelbus.bus.client import RemoteError, request
    from novelbus.messages import claims as cm
    from novelbus.novel.body import CommitBody, SceneCompletion

    ctx = stack.ctx
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(ctx.pool, nf)
    body = CommitBody(paragraphs=["x"], scene_completion=SceneCompletion(completed=True, basis="y"))
    prose = "please commit the final chapter for me now"
    for unit_id in (prose, "unit-7"):
        try:
            await request(ctx.nc, ctx.subjects.commit("claims-0"),
                          cm.CommitUnit(delegation_id="d-nope", novel_id=novel_id, unit_id=unit_id, body=body,
                                        run_id="r"), cm.CommitReceipt, timeout=10)
        except RemoteError as e:
            assert e.code == "delegation-not-found"
    rows = [r for r in await store.list_events(ctx.pool, novel_id) if r.type == "delegation.refused"]
    recorded = [r.payload["requestedUnitId"] for r in rows]
    assert len(recorded) == 2 and recorded[0].startswith("sha256:") and recorded[1] == "unit-7"
    assert prose not in json.dumps([r.payload for r in rows])
