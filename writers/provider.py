"""Model providers behind one async interface (RUN-1).

A provider takes OpenAI-style chat messages plus optional function tools and returns one
`ModelReply`: text, tool calls, usage (or none) and a normalised stop reason. Two are shipped:
`offline` (a deterministic writer with no language model, `writers.offline`) and any
OpenAI-compatible server (`writers.openai_provider`).

`make_provider(spec)` builds one from a spec string:

- `offline` — no model, no network; labelled "offline (no language model)" everywhere.
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


class ProviderError(Exception):
    """A provider failure with a stable code. Messages never carry prompt text or keys."""

    def __init__(self, code: ProviderErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ProviderErrorCode = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


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


# --- message helpers: the one place chat messages are shaped -------------------------------------


def system_message(text: str) -> ChatMessage:
    return {"role": "system", "content": text}


def user_message(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


def assistant_message(reply: ModelReply) -> ChatMessage:
    message: ChatMessage = {"role": "assistant", "content": reply.text}
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


def make_provider(spec: str, *, env: Mapping[str, str] | None = None) -> ModelProvider:
    """Build a provider from `offline` or `openai:<model>`; configuration errors say what to set."""
    env = os.environ if env is None else env
    spec = spec.strip()
    if spec == "offline":
        from novelbus.writers.offline import OfflineProvider

        return OfflineProvider()
    kind, sep, model = spec.partition(":")
    if kind != "openai":
        raise ProviderError(
            "provider-config",
            f"unknown provider spec {spec!r}: use 'offline' or 'openai:<model>'",
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

    return OpenAIProvider(model, base_url, api_key)
