"""The OpenAI-compatible provider against an in-test chat-completions server (RUN-1)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from novelbus.novel.pack import render_pack
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.writers.factory import (
    HOSTED_OPENAI_BASE_URL,
    LOCAL_PLACEHOLDER_KEY,
    is_local_base_url,
    make_provider,
)
from novelbus.writers.offline import OfflineProvider
from novelbus.writers.openai_provider import OpenAIProvider, window_from_model_entry
from novelbus.writers.provider import ModelProvider, ProviderError, ToolCall, Usage
from novelbus.writers.runner import run_w2
from novelbus.writers.tools import (
    COMMIT_TOOL,
    W2_ALLOW_LIST,
    call_read_tool,
    openai_tool_definitions,
)
from tests.writers.chat_server import ChatServer, completion, json_response

SECRET = "sk-test-SECRET-never-shown"
PROMPT = "PROMPT-TEXT-never-in-errors"
MESSAGES = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "write"}]
FAST_RETRY = {"retry-after-ms": "5"}  # the client honours it: retries without a real backoff


def provider_for(server: ChatServer, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider("test-model", server.base_url, SECRET, **kw)


async def complete(server: ChatServer, tools: list[dict] | None = None, **kw: Any):
    provider = provider_for(server, **kw)
    try:
        return await provider.complete(MESSAGES, tools, max_output_tokens=321)
    finally:
        await provider.aclose()


def assert_clean(err: ProviderError) -> None:
    assert SECRET not in str(err) and PROMPT not in str(err)


async def test_text_reply_with_usage_and_cached_tokens() -> None:
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 80,
        "total_tokens": 1280,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    async with ChatServer([completion(content="Hello.", usage=usage)]) as server:
        reply = await complete(server)
    assert reply.text == "Hello." and reply.stop_reason == "completed" and reply.tool_calls == []
    assert reply.usage == Usage(input_tokens=1200, output_tokens=80, cached_tokens=1024)
    request = server.requests[0]
    assert server.paths == ["/v1/chat/completions"]
    assert request["model"] == "test-model" and request["stream"] is False
    assert request["messages"] == MESSAGES and request["max_tokens"] == 321
    assert "tools" not in request
    assert server.headers[0]["authorization"] == f"Bearer {SECRET}"


async def test_usage_missing_or_without_cache_details_is_none() -> None:
    """USE-2: what the server does not report stays None (fail-open)."""
    plain = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    async with ChatServer([completion(content="a"), completion(content="b", usage=plain)]) as s:
        provider = provider_for(s)
        first = await provider.complete(MESSAGES, None, max_output_tokens=10)
        second = await provider.complete(MESSAGES, None, max_output_tokens=10)
        await provider.aclose()
    assert first.usage is None
    assert second.usage == Usage(input_tokens=10, output_tokens=2, cached_tokens=None)


async def test_tool_calls_are_parsed_and_tools_are_sent() -> None:
    definitions = openai_tool_definitions(W2_ALLOW_LIST)
    reply_calls = [
        ("call_1", "novel_status_read", "{}"),
        ("call_2", "memory_read", '{"noteId":"n1"}'),
    ]
    async with ChatServer([completion(tool_calls=reply_calls, finish_reason="tool_calls")]) as s:
        reply = await complete(s, definitions)
    assert reply.stop_reason == "tool_calls" and reply.text is None
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="novel_status_read", arguments="{}"),
        ToolCall(id="call_2", name="memory_read", arguments='{"noteId":"n1"}'),
    ]
    assert s.requests[0]["tools"] == definitions


@pytest.mark.parametrize(
    ("finish", "stop"),
    [("stop", "completed"), ("length", "length"), ("content_filter", "refused"), ("odd", "error")],
)
async def test_finish_reasons_are_normalised(finish: str, stop: str) -> None:
    async with ChatServer([completion(content="x", finish_reason=finish)]) as s:
        reply = await complete(s)
    assert reply.stop_reason == stop


@pytest.mark.parametrize(
    "body",
    [b"{not json at all", b"<html>oops</html>", b"[1, 2, 3]", b'{"choices": []}', b'{"id": 1}'],
)
async def test_malformed_reply_is_a_bad_reply_error(body: bytes) -> None:
    async with ChatServer([(200, {"content-type": "application/json"}, body)]) as s:
        with pytest.raises(ProviderError) as err:
            await complete(s, max_retries=0)
    assert err.value.code == "provider-bad-reply"
    assert_clean(err.value)


async def test_rate_limit_is_retried_then_succeeds() -> None:
    limited = json_response({"error": {"message": "slow down"}}, 429, FAST_RETRY)
    async with ChatServer([limited, completion(content="ok")]) as s:
        reply = await complete(s, max_retries=2)
    assert reply.text == "ok" and len(s.requests) == 2


async def test_rate_limit_that_persists_is_a_rate_limited_error() -> None:
    limited = json_response({"error": {"message": PROMPT}}, 429, FAST_RETRY)
    async with ChatServer([limited, limited, limited]) as s:
        with pytest.raises(ProviderError) as err:
            await complete(s, max_retries=2)
    assert err.value.code == "provider-rate-limited" and len(s.requests) == 3
    assert_clean(err.value)


async def test_server_error_is_unavailable_and_never_echoes_the_body() -> None:
    boom = json_response({"error": {"message": f"crashed on {PROMPT}"}}, 500, FAST_RETRY)
    async with ChatServer([boom, boom]) as s:
        with pytest.raises(ProviderError) as err:
            await complete(s, max_retries=1)
    assert err.value.code == "provider-unavailable" and "500" in str(err.value)
    assert len(s.requests) == 2
    assert_clean(err.value)


@pytest.mark.parametrize(
    ("status", "code"),
    [(401, "provider-config"), (404, "provider-config"), (400, "provider-bad-reply")],
)
async def test_client_errors_say_what_to_fix(status: int, code: str) -> None:
    async with ChatServer([json_response({"error": {"message": PROMPT}}, status)]) as s:
        with pytest.raises(ProviderError) as err:
            await complete(s, max_retries=0)
    assert err.value.code == code and str(status) in str(err.value)
    assert_clean(err.value)


async def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAIProvider("m", f"http://127.0.0.1:{port}/v1", SECRET, max_retries=0, timeout=5)
    with pytest.raises(ProviderError) as err:
        await provider.complete(MESSAGES, None, max_output_tokens=10)
    await provider.aclose()
    assert err.value.code == "provider-unavailable"
    assert_clean(err.value)


async def test_whole_w2_run_through_the_openai_provider(sample_snapshot: NovelSnapshot) -> None:
    """A scripted server plays the model: one read tool, then the commit (PROBE P1-style)."""
    pack = render_pack(sample_snapshot, "u-1", "trimmed")
    commit_args = {
        "unitId": "u-1",
        "paragraphs": ["Wren found the lamp cold.", "The keeper's chair was empty."],
        "sceneCompletion": {"completed": True, "basis": "the lamp is found cold"},
        "canonChanges": [],
    }

    def second(request: dict[str, Any]):
        tool_messages = [m for m in request["messages"] if m["role"] == "tool"]
        assert tool_messages[0]["tool_call_id"] == "call_status"
        assert json.loads(tool_messages[0]["content"])["currentChapterId"] == "ch1"
        assistant = request["messages"][2]
        assert assistant["tool_calls"][0]["function"]["name"] == "novel_status_read"
        return completion(
            tool_calls=[("call_commit", COMMIT_TOOL, json.dumps(commit_args))],
            finish_reason="tool_calls",
            usage={"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960},
        )

    script = [
        completion(
            tool_calls=[("call_status", "novel_status_read", "{}")], finish_reason="tool_calls"
        ),
        second,
    ]
    commits: list[dict[str, Any]] = []

    async def read_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
        return call_read_tool(sample_snapshot, name, args)

    async def commit(args: dict[str, Any]) -> dict[str, Any]:
        commits.append(args)
        return {"ok": True, "receipt": {"commitId": "commit-1"}}

    async with ChatServer(script) as s:
        async with provider_for(s) as provider:
            outcome = await run_w2(
                provider,
                pack.text,
                allow_list=W2_ALLOW_LIST,
                read_tool=read_tool,
                commit=commit,
                max_output_tokens=2048,
            )
    assert outcome.ok, outcome
    assert commits == [commit_args]
    assert [r.tool for r in outcome.tool_calls] == ["novel_status_read", COMMIT_TOOL]
    assert outcome.usage[1].usage == Usage(input_tokens=900, output_tokens=60)
    assert len(s.requests) == 2
    assert [t["function"]["name"] for t in s.requests[0]["tools"]] == list(W2_ALLOW_LIST)
    assert s.requests[0]["messages"][0] == {"role": "system", "content": pack.text}


# --- make_provider ------------------------------------------------------------------------------


def test_make_provider_offline() -> None:
    provider = make_provider("offline", env={})
    assert isinstance(provider, OfflineProvider) and isinstance(provider, ModelProvider)


async def test_make_provider_local_server_needs_no_key() -> None:
    provider = make_provider(
        "openai:qwen2.5", env={"NOVELBUS_MODEL_BASE_URL": "http://127.0.0.1:8000/v1"}
    )
    assert isinstance(provider, OpenAIProvider)
    assert provider._client.api_key == LOCAL_PLACEHOLDER_KEY
    assert provider.model == "qwen2.5" and "127.0.0.1:8000" in provider.label
    await provider.aclose()


async def test_make_provider_key_precedence_and_hosted_default() -> None:
    provider = make_provider(
        "openai:gpt-4o-mini", env={"NOVELBUS_MODEL_API_KEY": "a", "OPENAI_API_KEY": "b"}
    )
    assert isinstance(provider, OpenAIProvider)
    assert provider._client.api_key == "a" and provider.base_url == HOSTED_OPENAI_BASE_URL
    assert "a" not in provider.label.split()
    await provider.aclose()
    fallback = make_provider("openai:gpt-4o-mini", env={"OPENAI_API_KEY": "b"})
    assert isinstance(fallback, OpenAIProvider) and fallback._client.api_key == "b"
    await fallback.aclose()


@pytest.mark.parametrize(
    ("spec", "env", "needle"),
    [
        ("openai:m", {}, "NOVELBUS_MODEL_BASE_URL"),
        ("openai:", {"OPENAI_API_KEY": SECRET}, "model"),
        ("openai", {"OPENAI_API_KEY": SECRET}, "model"),
        ("anthropic:claude", {}, "offline"),
        ("openai:m", {"NOVELBUS_MODEL_BASE_URL": "https://models.example.com/v1"}, "API key"),
        ("openai:m", {"NOVELBUS_MODEL_BASE_URL": "ftp://x", "OPENAI_API_KEY": SECRET}, "http"),
    ],
)
def test_make_provider_config_errors_say_what_to_set(spec: str, env: dict, needle: str) -> None:
    with pytest.raises(ProviderError) as err:
        make_provider(spec, env=env)
    assert err.value.code == "provider-config" and needle in str(err.value)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://localhost:11434/v1", True),
        ("http://127.0.0.1:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://192.168.1.20:8080/v1", True),
        ("http://ollama:11434/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://8.8.8.8/v1", False),
    ],
)
def test_local_base_urls(url: str, local: bool) -> None:
    assert is_local_base_url(url) is local


async def test_hermes_tool_calls_in_the_content_are_parsed_and_options_are_sent() -> None:
    """MODEL-3: a server that leaves `<tool_call>{…}</tool_call>` in the content still yields
    tool calls; tool_choice and response_format (MODEL-2) go on the wire as given."""
    content = ('Let me look.\n<tool_call>\n{"name": "novel_status_read", "arguments": {}}\n'
               '</tool_call>\n<tool_call>{"name": "memory_read", "arguments": {"noteId": "n1"}}'
               '</tool_call>\n<tool_call>not json</tool_call>')
    definitions = openai_tool_definitions(W2_ALLOW_LIST)
    forced = {"type": "function", "function": {"name": COMMIT_TOOL}}
    fmt = {"type": "json_object", "schema": {"type": "object"}}
    async with ChatServer([completion(content=content), completion(content="{}")]) as s:
        provider = provider_for(s)
        reply = await provider.complete(MESSAGES, definitions, max_output_tokens=50,
                                        tool_choice=forced)
        plain = await provider.complete(MESSAGES, None, max_output_tokens=50, response_format=fmt)
        await provider.aclose()
    assert reply.text_tool_calls and reply.stop_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("novel_status_read", {}), ("memory_read", {"noteId": "n1"})]
    assert len({c.id for c in reply.tool_calls}) == 2
    assert s.requests[0]["tool_choice"] == forced and "response_format" not in s.requests[0]
    assert s.requests[1]["response_format"] == fmt and "tool_choice" not in s.requests[1]
    assert not plain.text_tool_calls and plain.tool_calls == []


@pytest.mark.parametrize(("entry", "window"), [
    ({"id": "m", "max_model_len": 32768}, 32768),                       # vLLM
    ({"id": "m", "meta": {"n_ctx_train": 8192, "n_vocab": 49152}}, 8192),  # llama.cpp server
    ({"id": "m", "context_length": 4096}, 4096),
    ({"id": "m", "owned_by": "me"}, None),
    ({"id": "m", "max_model_len": "big"}, None),
    ({"id": "m", "max_model_len": True}, None),
    ({"id": "m", "max_model_len": 12}, None),
])
def test_window_from_a_model_listing_entry(entry: dict[str, Any], window: int | None) -> None:
    """MODEL-5: the window read from one `GET /models` entry; nothing made up when absent."""
    assert window_from_model_entry(entry) == window


async def test_discover_context_window_asks_the_model_listing() -> None:
    """MODEL-5: the provider reads its own model's entry; a server without a figure (or an error)
    gives None."""
    listing = {"object": "list", "data": [{"id": "x", "object": "model", "max_model_len": 2048},
                                          {"id": "test-model", "object": "model", "max_model_len": 16384}]}
    async with ChatServer([json_response(listing), json_response({"object": "list", "data": []}),
                           json_response({"error": "no"}, 404)]) as s:
        provider = provider_for(s, max_retries=0)
        try:
            assert await provider.discover_context_window() == 16384
            assert await provider.discover_context_window() is None
            assert await provider.discover_context_window() is None
        finally:
            await provider.aclose()
        assert s.paths == ["/v1/models"] * 3
