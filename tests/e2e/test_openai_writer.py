"""The OpenAI-compatible provider through all six actors (RUN-1, USE-1): the whole sample novel is written
by `--model openai:<model>` against an in-test chat-completions server on 127.0.0.1 (the offline writer
behind the wire format, with usage and a prefix cache), chosen exactly as a user chooses it: the model
spec in the settings and NOVELBUS_MODEL_BASE_URL in the environment."""

from __future__ import annotations

from typing import Any

import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.cli.tools_cmd import model_tool_listing
from novelbus.messages import events as ev
from novelbus.writers.factory import ENV_API_KEY, ENV_BASE_URL, ENV_OPENAI_API_KEY
from tests.writers.chat_server import ChatServer, json_response
from tests.writers.harness import FakeModel, drive, sample_with, tiny_novel, writer_stack


@pytest.fixture
def model_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    def point_at(server: ChatServer) -> None:
        monkeypatch.setenv(ENV_BASE_URL, server.base_url)
        monkeypatch.delenv(ENV_API_KEY, raising=False)
        monkeypatch.delenv(ENV_OPENAI_API_KEY, raising=False)
    return point_at


@pytest.mark.parametrize("shape", ["W2", "W1"])
async def test_sample_novel_written_through_an_openai_compatible_server(
        shape: str, model_env: Any, nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-1: every unit of the sample novel goes over the chat-completions wire (tools and tool calls for
    W2, a JSON draft for W1, streaming off); the tools sent are exactly `novelbus tools --list`; provider
    usage including cached prompt tokens reaches the usage samples (USE-1)."""
    model = FakeModel()
    async with ChatServer([], responder=model) as server:
        model_env(server)
        async with writer_stack(nats_url, new_database, namespace, settings=Settings(model="openai:fake-model")) as rt:
            assert rt.actor("writer").state.provider.label.startswith("openai-compatible model fake-model")  # type: ignore[attr-defined]
            d = await drive(rt, sample_with(shape), timeout=120)
            pool = rt.ctx.pool
            snap = await store.load_snapshot(pool, d.novel_id)
            runs = await store.list_writer_runs(pool, d.novel_id)
            samples = await store.recent_usage(pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished), d.final
    assert snap.outline is not None and len(snap.commits) == len(snap.outline.scenes) == 9
    assert all(r.status == "ok" and r.provider.startswith("openai-compatible") for r in runs)

    assert server.paths and set(server.paths) == {"/v1/chat/completions"}
    assert all(r["model"] == "fake-model" and r["stream"] is False for r in server.requests)
    if shape == "W1":  # MODEL-2: one P6 request picks the mechanism, then the 9 drafts use it
        assert len(server.requests) == 10 and all("tools" not in r for r in server.requests)
        assert all(r["response_format"]["type"] == "json_schema" for r in server.requests)
        assert server.requests[-1]["response_format"]["json_schema"]["schema"]["required"] == [
            "paragraphs", "sceneCompletion", "canonChanges"]
    else:
        assert len(server.requests) > 9  # research rounds before each commit
        offered = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
                   for t in model_tool_listing()]
        assert all(r["tools"] == offered for r in server.requests)  # TOOL-1/3: --list == what is offered
        assert any(m.get("role") == "tool" for r in server.requests for m in r["messages"])

    assert len(samples) == 9 and all(s["inputTokens"] and s["outputTokens"] for s in samples)
    if shape == "W2":  # consecutive units of a chapter share the pack prefix: the server's cache hits
        assert sum(s["cachedTokens"] or 0 for s in samples) > 0
        assert sum(model.cached) == sum(s["cachedTokens"] or 0 for s in samples)


@pytest.mark.parametrize(("reply", "reason"), [
    (json_response({"error": {"message": "boom"}}, 500, {"retry-after-ms": "5"}), "provider-error:provider-unavailable"),
    ((200, {"content-type": "application/json"}, b"<html>not json</html>"), "provider-error:provider-bad-reply"),
    (json_response({"error": {"message": "slow down"}}, 429, {"retry-after-ms": "5"}),
     "provider-error:provider-rate-limited"),
])
async def test_a_broken_model_server_fails_dispatches_with_the_reason_and_writes_nothing(
        reply: Any, reason: str, model_env: Any, nats_url: str, new_database: Any, namespace: str) -> None:
    """RUN-4: a server answering 5xx, garbage or 429 (after the client's own retries) fails each dispatch
    with a provider-error reason; the unit's turn fails after writerDispatchLimit; nothing is committed."""
    async with ChatServer([], responder=lambda _: reply) as server:
        model_env(server)
        async with writer_stack(nats_url, new_database, namespace, settings=Settings(model="openai:fake-model")) as rt:
            d = await drive(rt, tiny_novel("W2", writerDispatchLimit=2, consecutiveFailureLimit=1))
            runs = await store.list_writer_runs(rt.ctx.pool, d.novel_id)
            commits = await store.list_commits(rt.ctx.pool, d.novel_id)
    assert isinstance(d.final, ev.NovelPaused)
    assert [(r.status, r.reason) for r in runs] == [("failed", reason)] * 2
    assert [(f.reason, f.dispatches) for f in d.of(ev.UnitFailed)] == [(reason, 2)]
    assert commits == []
    assert len(server.requests) >= 2
