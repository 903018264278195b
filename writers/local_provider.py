"""`--model local[:PATH.gguf]`: the embedded local model as a provider (MODEL-1).

The provider starts its llama.cpp server (`llama-server`) on first use — in the process that writes, so the
server is owned by it and never outlives it — and talks to it through the ordinary
OpenAI-compatible provider with the per-start API key. `aclose()` stops it. The server itself is
handed in (`LocalServer`; built by `infra.llama.open_local_server`, passed to
`writers.factory.make_provider` by the process that writes): writers/ imports no infra/ (ARCH).

Known facts about this server (SERVE-6; docs/models.md): it serves `slots` requests at once with
continuous batching, honours `response_format: json_schema` (grammar-constrained), and reports
the prompt tokens a slot's cache reused (`usage.prompt_tokens_details.cached_tokens`). So its
structured-draft mechanism (P6) is known without probing, and its window is one slot's context,
the model's training context unless configured.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from novelbus.messages.runs import Sampling
from novelbus.writers.chat import user_message
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ChatMessage, ModelReply, ProviderError, ToolCall

LOCAL_TIMEOUT_S = 900.0  # grammar-constrained generation on 2 cores takes tens of seconds
# SERVE-6: one reply takes at most this share of the model's window. A W2 run may hold a text
# answer cut at its cap (MODEL-3 then forces a read and the commit): with the pack, the read's
# result and the commit's reply it must still fit the window the GGUF header gives.
REPLY_SHARE_OF_WINDOW = 4


class LocalServer(Protocol):
    """An OpenAI-compatible model server this process starts and owns (MODEL-1). `start()` returns
    its base URL; it raises RuntimeError (infra's ServerStartError) with a message saying why."""

    model: str
    context_window: int
    slots: int
    api_key: str

    @property
    def running(self) -> bool: ...

    async def start(self) -> str: ...

    async def stop(self) -> None: ...


# Builds the server for `local[:PATH.gguf]`: (weights or None for the default, window or None).
LocalServerFactory = Callable[[Path | None, int | None], LocalServer]


def plain_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """SERVE-6: the conversation for a chat template that renders no tools. An assistant turn's
    tool calls become a line naming each tool and a tool's result a user turn naming its tool, so
    every turn stays in the prompt, byte-stable. The calls' arguments are left out: a small model
    copies whatever markup it sees into its next reply."""
    names: dict[str, str] = {}
    out: list[ChatMessage] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            parts = [message.get("content") or ""]
            for call in message["tool_calls"]:
                name = str((call.get("function") or {}).get("name", ""))
                names[str(call.get("id"))] = name
                parts.append(f"(I called {name}.)")
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "the tool")
            out.append({"role": "user", "content": f"Result of {name}:\n{message.get('content') or ''}"})
        else:
            out.append(message)
    return out


def forced_tool(tools: list[dict[str, Any]] | None, choice: object) -> dict[str, Any] | None:
    """The one function tool a call forces (MODEL-3: by name, or `required` with one tool offered),
    else None."""
    if not tools:
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        named = [t for t in tools if (t.get("function") or {}).get("name") == name]
        return named[0]["function"] if named else None
    if choice == "required" and len(tools) == 1:
        function: dict[str, Any] = tools[0].get("function") or {}
        return function
    return None


def forcing_request(function: dict[str, Any]) -> tuple[ChatMessage, dict[str, Any]]:
    """SERVE-6: a forced call as JSON-schema output — the instruction appended to the
    conversation and the `response_format` whose grammar holds the reply to the tool's parameters."""
    name = str(function.get("name", ""))
    about = str(function.get("description", "")).strip()
    ask = (f"Call the tool {name} now. Reply with its arguments only, as one JSON object."
           + (f" The tool: {about}" if about else ""))
    schema = function.get("parameters") or {"type": "object"}
    return user_message(ask), {"type": "json_schema",
                               "json_schema": {"name": name or "arguments", "schema": schema, "strict": False}}


class _LocalClient(OpenAIProvider):
    """The embedded server's OpenAI client; a reply never asks for more than the cap.

    With a model whose chat template renders tools (`native_tools`), llama-server makes the calls;
    it reads `tool_choice` as a string only, so a call forcing one tool by name (MODEL-3) is sent
    as `required` with that tool alone. With one whose template renders none (the default
    SmolLM2's), the server would silently drop the tools: a forced call is then asked for as
    JSON-schema output holding the tool's parameters and returned as that tool's call, an
    unforced one goes without tools (the model answers in text), and earlier calls and results are
    rendered as plain turns (`plain_messages`)."""

    max_output_tokens = 1 << 30
    native_tools = True

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        cap = min(max_output_tokens, self.max_output_tokens)
        choice = options.get("tool_choice")
        function = forced_tool(tools, choice)
        if self.native_tools or not tools:
            if function is not None and tools:
                tools, options = [{"type": "function", "function": function}], {**options, "tool_choice": "required"}
            return await super().complete(messages, tools, max_output_tokens=cap, **options)
        plain = plain_messages(messages)
        options = {k: v for k, v in options.items() if k != "tool_choice"}
        if function is None:
            return await super().complete(plain, None, max_output_tokens=cap, **options)
        ask, response_format = forcing_request(function)
        reply = await super().complete([*plain, ask], None, max_output_tokens=cap,
                                       **{**options, "response_format": response_format})
        if reply.stop_reason != "completed" or not reply.text:
            return reply  # cut at the cap or refused: no call (the runner sees why)
        call = ToolCall(id=f"call-{len(messages)}", name=str(function.get("name", "")), arguments=reply.text)
        return msgspec.structs.replace(reply, text=None, tool_calls=[call], stop_reason="tool_calls")


PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "A probe.",
                                                "parameters": {"type": "object", "properties": {}}}}


async def added_prompt_tokens(client: OpenAIProvider, tools: list[dict[str, Any]]) -> int | None:
    """Prompt tokens the server adds for `tools`: the reported prompt tokens of a one-token call
    with them against one without (None: the server did not say)."""
    probe = [user_message("Hi")]
    try:
        bare = await client.complete(probe, None, max_output_tokens=1)
        full = await client.complete(probe, tools, max_output_tokens=1)
    except ProviderError:
        return None
    if bare.usage is None or full.usage is None or bare.usage.input_tokens is None or full.usage.input_tokens is None:
        return None
    return max(0, full.usage.input_tokens - bare.usage.input_tokens)


async def renders_tools(client: OpenAIProvider) -> bool:
    """Whether the server's chat template puts offered tools in the prompt (unknown: assume it does)."""
    added = await added_prompt_tokens(client, [PROBE_TOOL])
    return added is None or added > 0


class LocalProvider:
    name = "local"
    structured_mode = "json_schema"  # MODEL-2: what llama-server honours (P6, known)

    def __init__(self, server: LocalServer, *, timeout: float | None = None) -> None:
        self.server = server
        self.timeout = timeout or LOCAL_TIMEOUT_S  # QUAL-4: NOVELBUS_MODEL_TIMEOUT_S when set
        self.context_window: int = self.server.context_window
        self.max_output_tokens = self.context_window // REPLY_SHARE_OF_WINDOW  # SERVE-6: from the model
        self.model = self.server.model
        self.label = (f"local model {self.model} (embedded llama-server, {self.server.slots} slots, "
                      f"window {self.context_window:,} tokens)")
        self._inner: _LocalClient | None = None
        self._lock: asyncio.Lock | None = None
        self._tool_tokens: dict[str, int] = {}
        self._closed = False  # after aclose() the server is never started again (no restart on exit)

    async def start(self) -> _LocalClient:
        """The client of the running server (started now when it is not), whose every call's reply
        is capped at `max_output_tokens` (SERVE-6), also for callers that talk to it directly."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._closed:
                raise ProviderError("provider-unavailable", "the local model server was stopped (shutting down)")
            if self._inner is None or not self.server.running:
                if self._inner is not None:
                    await self._inner.aclose()
                    self._inner = None
                try:
                    base_url = await self.server.start()
                except RuntimeError as e:  # infra's ServerStartError: the message says why
                    raise ProviderError("provider-unavailable", str(e)) from None
                inner = _LocalClient(self.model, base_url, self.server.api_key,
                                     timeout=self.timeout, max_retries=1, context_window=self.context_window)
                inner.max_output_tokens = self.max_output_tokens
                inner.native_tools = await renders_tools(inner)
                self._inner = inner
            return self._inner

    async def tools_need_forcing(self) -> bool:
        """MODEL-3: the model calls no tool unless forced — its chat template renders none, so
        every tool call is a forced one asked for as JSON-schema output (SERVE-6)."""
        return not (await self.start()).native_tools

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
        sampling: Sampling | None = None,
    ) -> ModelReply:
        inner = await self.start()
        return await inner.complete(messages, tools, max_output_tokens=max_output_tokens,
                                    tool_choice=tool_choice, response_format=response_format,
                                    sampling=sampling)

    async def measure_tool_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        """Prompt tokens the server adds for `tools` (its chat template may render them or not;
        none when it renders no tools at all). Cached per tool set."""
        inner = await self.start()
        if not inner.native_tools:
            return 0
        key = json.dumps([t.get("function", {}).get("name") for t in tools])
        if key not in self._tool_tokens:
            added = await added_prompt_tokens(inner, tools)
            if added is None:
                return None
            self._tool_tokens[key] = added
        return self._tool_tokens[key]

    async def aclose(self) -> None:
        self._closed = True
        if self._inner is not None:
            await self._inner.aclose()
            self._inner = None
        await self.server.stop()

    async def __aenter__(self) -> LocalProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
