"""`--model local[:PATH.gguf]`: the embedded local model as a provider (MODEL-1).

The provider starts its llama-cpp-python server on first use — in the process that writes, so the
server is owned by it and never outlives it — and talks to it through the ordinary
OpenAI-compatible provider with the per-start API key. `aclose()` stops it. The server itself is
handed in (`LocalServer`; built by `infra.llama.open_local_server`, passed to
`writers.factory.make_provider` by the process that writes): writers/ imports no infra/ (ARCH).

Known facts about this server (measured; see the README "Writer models"): it rejects
`response_format: json_schema`, accepts `json_object` + `schema` and a named `tool_choice`
(both grammar-constrained), reports usage but no cached tokens. So its structured-draft mechanism
(P6) is known without probing and its window is the `n_ctx` it was started with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from novelbus.messages.runs import Sampling
from novelbus.writers.chat import user_message
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ChatMessage, ModelReply, ProviderError

LOCAL_TIMEOUT_S = 900.0  # grammar-constrained generation on 2 cores takes tens of seconds


class LocalServer(Protocol):
    """An OpenAI-compatible model server this process starts and owns (MODEL-1). `start()` returns
    its base URL; it raises RuntimeError (infra's ServerStartError) with a message saying why."""

    model: str
    context_window: int
    api_key: str

    @property
    def running(self) -> bool: ...

    async def start(self) -> str: ...

    async def stop(self) -> None: ...


# Builds the server for `local[:PATH.gguf]`: (weights or None for the default, window or None).
LocalServerFactory = Callable[[Path | None, int | None], LocalServer]


class LocalProvider:
    name = "local"
    structured_mode = "json_object+schema"  # MODEL-2: what this server honours (P6, known)

    def __init__(self, server: LocalServer, *, timeout: float | None = None) -> None:
        self.server = server
        self.timeout = timeout or LOCAL_TIMEOUT_S  # QUAL-4: NOVELBUS_MODEL_TIMEOUT_S when set
        self.context_window: int = self.server.context_window
        self.model = self.server.model
        self.label = (f"local model {self.model} (embedded llama-cpp-python server, "
                      f"window {self.context_window:,} tokens)")
        self._inner: OpenAIProvider | None = None
        self._lock: asyncio.Lock | None = None
        self._tool_tokens: dict[str, int] = {}
        self._closed = False  # after aclose() the server is never started again (no restart on exit)

    async def start(self) -> OpenAIProvider:
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
                self._inner = OpenAIProvider(self.model, base_url, self.server.api_key,
                                             timeout=self.timeout, max_retries=1,
                                             context_window=self.context_window)
            return self._inner

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
        """Prompt tokens the server adds for `tools` (its chat template may render them or not):
        the reported prompt tokens of a tiny request with and without them. Cached per tool set."""
        key = json.dumps([t.get("function", {}).get("name") for t in tools])
        if key not in self._tool_tokens:
            probe = [user_message("Hi")]
            try:
                bare = await self.complete(probe, None, max_output_tokens=1)
                full = await self.complete(probe, tools, max_output_tokens=1)
            except ProviderError:
                return None
            if bare.usage is None or full.usage is None:
                return None
            if bare.usage.input_tokens is None or full.usage.input_tokens is None:
                return None
            self._tool_tokens[key] = max(0, full.usage.input_tokens - bare.usage.input_tokens)
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
