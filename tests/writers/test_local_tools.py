"""SERVE-6 / MODEL-3: tool calls on the embedded llama-server, whichever chat template the model has.

A template that renders no tools (the default SmolLM2's) makes llama-server drop them silently:
the provider then asks for a forced call as JSON-schema output holding the tool's parameters and
returns it as that tool's call. A template that renders tools gets them, forced as `required`.
The server here is an in-test OpenAI-wire server that reports prompt tokens as such a template would.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus.writers.chat import assistant_message, system_message, tool_message, user_message
from novelbus.writers.local_provider import LocalProvider, forced_tool, plain_messages
from novelbus.writers.provider import ModelReply, ToolCall, forced_tool_choice
from tests.writers.chat_server import ChatServer, Response, json_response

COMMIT = {"type": "function", "function": {
    "name": "novel_body_commit", "description": "Commit the unit's prose.",
    "parameters": {"type": "object", "properties": {"unitId": {"type": "string", "enum": ["u-1"]}},
                   "required": ["unitId"]}}}
READ = {"type": "function", "function": {
    "name": "novel_outline_read", "description": "Read the outline.",
    "parameters": {"type": "object", "properties": {}}}}


def _answer(*, renders_tools: bool, content: str, finish: str = "stop") -> Any:
    def respond(request: dict[str, Any]) -> Response:
        prompt = 10 + (40 if renders_tools and request.get("tools") else 0)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if renders_tools and request.get("tools"):
            fn = request["tools"][0]["function"]
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": fn["name"], "arguments": content}}]}
        return json_response({
            "id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if "tool_calls" in message else finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}})
    return respond


class _Server:
    """The process handle of an embedded server that is already up at `url` (the in-test one)."""

    model = "m"
    context_window = 4_096
    slots = 2
    api_key = "k"

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def running(self) -> bool:
        return True

    async def start(self) -> str:
        return self.url

    async def stop(self) -> None:
        return None


HISTORY = [system_message("pack"), user_message("write"),
           assistant_message(ModelReply(text=None, tool_calls=[ToolCall(id="c1", name="novel_outline_read",
                                                                        arguments='{"chapterId": "bell"}')])),
           tool_message("c1", '{"story": "a bell"}')]


async def test_a_forced_call_to_a_template_without_tools_is_asked_as_json_schema_output() -> None:
    """SERVE-6, MODEL-3"""
    async with ChatServer([], responder=_answer(renders_tools=False, content='{"unitId": "u-1"}')) as server:
        provider = LocalProvider(_Server(server.base_url))
        try:
            assert await provider.tools_need_forcing()
            reply = await provider.complete(HISTORY, [READ, COMMIT], max_output_tokens=64,
                                            tool_choice=forced_tool_choice("novel_body_commit"))
        finally:
            await provider.aclose()
    request = server.requests[-1]
    assert "tools" not in request and "tool_choice" not in request
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"] == COMMIT["function"]["parameters"]
    assert all(m["role"] in ("system", "user", "assistant") for m in request["messages"])
    assert "novel_body_commit" in request["messages"][-1]["content"]
    assert reply.stop_reason == "tool_calls" and reply.text is None
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("novel_body_commit", {"unitId": "u-1"})]


async def test_an_unforced_call_to_a_template_without_tools_goes_without_them() -> None:
    """SERVE-6, MODEL-3"""
    async with ChatServer([], responder=_answer(renders_tools=False, content="Prose.")) as server:
        provider = LocalProvider(_Server(server.base_url))
        try:
            reply = await provider.complete(HISTORY, [READ, COMMIT], max_output_tokens=64)
        finally:
            await provider.aclose()
    request = server.requests[-1]
    assert "tools" not in request and "response_format" not in request
    assert reply.text == "Prose." and reply.tool_calls == []


async def test_a_forced_reply_cut_at_the_cap_is_no_call() -> None:
    """SERVE-6: a JSON reply cut at max_tokens is not parsed into a call; the runner sees `length`."""
    responder = _answer(renders_tools=False, content='{"unitId": "u', finish="length")
    async with ChatServer([], responder=responder) as server:
        provider = LocalProvider(_Server(server.base_url))
        try:
            reply = await provider.complete(HISTORY, [COMMIT], max_output_tokens=4, tool_choice="required")
        finally:
            await provider.aclose()
    assert reply.stop_reason == "length" and reply.tool_calls == []


async def test_a_template_with_tools_gets_the_forced_tool_alone_as_required() -> None:
    """SERVE-6, MODEL-3: llama-server reads tool_choice as a string only."""
    async with ChatServer([], responder=_answer(renders_tools=True, content='{"unitId": "u-1"}')) as server:
        provider = LocalProvider(_Server(server.base_url))
        try:
            assert not await provider.tools_need_forcing()
            reply = await provider.complete(HISTORY, [READ, COMMIT], max_output_tokens=64,
                                            tool_choice=forced_tool_choice("novel_body_commit"))
        finally:
            await provider.aclose()
    request = server.requests[-1]
    assert request["tool_choice"] == "required"
    assert [t["function"]["name"] for t in request["tools"]] == ["novel_body_commit"]
    assert request["messages"][2].get("tool_calls") and request["messages"][3]["role"] == "tool"
    assert [c.name for c in reply.tool_calls] == ["novel_body_commit"]


def test_plain_messages_name_each_call_and_result_without_markup() -> None:
    """SERVE-6: no argument or markup a small model could copy into its prose."""
    plain = plain_messages(HISTORY)
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[2]["content"] == "(I called novel_outline_read.)"
    assert plain[3]["content"] == 'Result of novel_outline_read:\n{"story": "a bell"}'
    assert "chapterId" not in json.dumps(plain)


@pytest.mark.parametrize(("tools", "choice", "expected"), [
    ([READ, COMMIT], forced_tool_choice("novel_body_commit"), "novel_body_commit"),
    ([COMMIT], "required", "novel_body_commit"),
    ([READ, COMMIT], "required", None),  # which one is the model's to pick: not one forced call
    ([READ, COMMIT], None, None),
    ([READ], forced_tool_choice("novel_body_commit"), None),
    (None, "required", None),
])
def test_forced_tool_is_the_one_tool_a_choice_forces(tools: Any, choice: Any, expected: str | None) -> None:
    """MODEL-3"""
    found = forced_tool(tools, choice)
    assert (found or {}).get("name") == expected
