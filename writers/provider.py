"""The model provider protocol (RUN-1): one async interface, and the values that cross it.

A provider takes OpenAI-style chat messages plus optional function tools and returns one
`ModelReply`: text, tool calls, usage (or none) and a normalised stop reason. This module holds
only that contract; the providers live in their own modules (`writers.offline`,
`writers.openai_provider`) and `writers.factory.make_provider(spec)` builds one; chat messages
are shaped in `writers.chat`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from novelbus.messages.runs import Sampling
from novelbus.writers import metrics

StopReason = Literal["completed", "tool_calls", "length", "error", "refused"]
ProviderErrorCode = Literal[
    "provider-config", "provider-unavailable", "provider-bad-reply", "provider-rate-limited"
]

# An OpenAI-style chat message: {"role": "system"|"user"|"assistant"|"tool", "content": ...,
# "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}], "tool_call_id"}.
ChatMessage = dict[str, Any]


class ToolCall(msgspec.Struct, frozen=True):
    id: str
    name: str
    arguments: str  # JSON text exactly as the model sent it; parsed (and refused) by the runner


class Usage(msgspec.Struct, frozen=True):
    """Provider-reported token counts; any of them may be unknown (USE-2: fail-open)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class ModelReply(msgspec.Struct, frozen=True):
    text: str | None
    tool_calls: list[ToolCall] = []
    usage: Usage | None = None
    stop_reason: StopReason = "completed"
    # MODEL-3: the calls were parsed out of the text (Hermes-style `<tool_call>{…}</tool_call>`)
    text_tool_calls: bool = False


class ProviderError(Exception):
    """A provider failure with a stable code. Messages never carry prompt text or keys."""

    def __init__(self, code: ProviderErrorCode, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code: ProviderErrorCode = code
        self.message = message
        # SERVE-4: the seconds a 429/503's `Retry-After` asked for (None: it named none)
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# MODEL-2 / MODEL-3: per-call request options a provider may be asked for. Only given when set,
# so a provider that never needs them keeps the three-argument signature.
#   tool_choice:     "auto" | "required" | "none" | {"type": "function", "function": {"name": …}}
#   response_format: {"type": "json_schema", "json_schema": {...}} | {"type": "json_object"[, "schema"]}
#   sampling:        QUAL-4, the novel's temperature, top_p, seed, penalties (offline: ignored)
ToolChoice = str | dict[str, Any]


@runtime_checkable
class ModelProvider(Protocol):
    name: str
    label: str

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
    ) -> ModelReply: ...


async def complete(
    provider: ModelProvider,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    *,
    max_output_tokens: int,
    tool_choice: ToolChoice | None = None,
    response_format: dict[str, Any] | None = None,
    sampling: Sampling | None = None,
) -> ModelReply:
    """Call `provider.complete`, passing the MODEL-2/3 options and the QUAL-4 sampling settings
    only when they are set."""
    options: dict[str, Any] = {}
    if tool_choice is not None:
        options["tool_choice"] = tool_choice
    if response_format is not None:
        options["response_format"] = response_format
    if sampling is not None:
        options["sampling"] = sampling
    call: Any = provider.complete
    counted = metrics.enter_call()  # OPS-6: the outermost call of a run's wrappers counts, once
    try:
        reply: ModelReply = await call(messages, tools, max_output_tokens=max_output_tokens, **options)
    except BaseException as e:
        metrics.leave_call(counted, provider, None, getattr(e, "code", None) or type(e).__name__)
        raise
    metrics.leave_call(counted, provider, reply.usage, "ok")
    return reply


def context_window(provider: ModelProvider) -> int | None:
    """MODEL-5: the provider's context window in tokens, when known."""
    value = getattr(provider, "context_window", None)
    return value if isinstance(value, int) and value > 0 else None


async def measured_tool_tokens(
    provider: ModelProvider, tools: list[dict[str, Any]] | None
) -> int | None:
    """MODEL-5/6: the prompt tokens the server spends on `tools`, when the provider can measure
    them (the embedded local server: two one-token calls, cached); None: estimate them."""
    measure = getattr(provider, "measure_tool_tokens", None)
    if not tools or measure is None:
        return None
    value = await measure(tools)
    return value if isinstance(value, int) else None


async def tools_need_forcing(provider: ModelProvider) -> bool:
    """MODEL-3: the provider knows its model calls no tool unless forced (SERVE-6: the embedded
    server with a chat template that renders no tools), so a W2 run forces from its first call."""
    known = getattr(provider, "tools_need_forcing", None)
    return bool(await known()) if known is not None else False


class ProviderWrapper:
    """A provider wrapped for ONE run (sampling, recording, timing): it speaks for the provider
    it wraps — name, label, window (MODEL-5), structured mode (MODEL-2), tool-token measure —
    and passes each call through `complete`; subclasses add what they do around the call."""

    def __init__(self, provider: ModelProvider) -> None:
        self.inner = provider
        self.name = provider.name
        self.label = provider.label
        self.context_window = getattr(provider, "context_window", None)
        self.structured_mode = getattr(provider, "structured_mode", None)

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        return await complete(self.inner, messages, tools, max_output_tokens=max_output_tokens, **options)

    async def measure_tool_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        return await measured_tool_tokens(self.inner, tools)

    async def tools_need_forcing(self) -> bool:
        return await tools_need_forcing(self.inner)


def forced_tool_choice(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}
