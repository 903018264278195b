"""An OpenAI-compatible chat-completions provider on the official `openai` client (RUN-1).

Works against any server speaking the chat-completions wire format: the hosted API, vLLM,
llama.cpp server, Ollama. One request per call (`stream=False`); the client's own retry with
backoff handles 408/409/429/5xx and connection errors up to `max_retries` times.

Errors become `ProviderError` with a stable code and a message that names the server host and
the HTTP status, never prompt text, server-echoed bodies or keys.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec
import openai

from novelbus.messages.runs import Sampling
from novelbus.novel.serving import retry_after_s
from novelbus.writers.provider import (
    ChatMessage,
    ModelReply,
    ProviderError,
    ProviderErrorCode,
    StopReason,
    ToolCall,
    Usage,
)

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]

_FINISH: dict[str, StopReason] = {
    "stop": "completed",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "refused",
}


class OpenAIProvider:
    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str,
        timeout: float = 120,
        max_retries: int = 2,
        *,
        max_tokens_field: MaxTokensField | None = None,
        context_window: int | None = None,
    ) -> None:
        # `max_tokens` is what vLLM, llama.cpp and Ollama accept; hosted reasoning models want
        # `max_completion_tokens`. None: start with `max_tokens` and switch when the server's
        # 400 names it (QUAL-4); a configured field is used as it is.
        if not model:
            raise ProviderError("provider-config", "no model named")
        self.model = model
        self.base_url = base_url
        self.host = urlsplit(base_url).netloc or base_url
        self.label = f"openai-compatible model {model} at {self.host}"
        self.max_tokens_field: MaxTokensField = max_tokens_field or "max_tokens"
        self._detect_field = max_tokens_field is None
        self.context_window = context_window  # MODEL-5: tokens, when configured or known
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def discover_context_window(self) -> int | None:
        """MODEL-5: the window the server reports for this model in its model listing
        (`GET /models`: vLLM `max_model_len`, llama.cpp `meta.n_ctx`/`n_ctx_train`, others
        `context_length`/`max_context_length`), or None when it reports none or cannot be asked."""
        try:
            page = await self._client.models.list()
        except (openai.OpenAIError, ValueError):
            return None
        entries = [m.model_dump() for m in page.data]
        mine = [e for e in entries if e.get("id") == self.model] or (entries if len(entries) == 1 else [])
        for entry in mine:
            window = window_from_model_entry(entry)
            if window is not None:
                return window
        return None

    async def __aenter__(self) -> OpenAIProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
        sampling: Sampling | None = None,
        extra_body: dict[str, Any] | None = None,
        extra_headers: dict[str, str] | None = None,
    ) -> ModelReply:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": False,
            **sampling_fields(sampling),  # QUAL-4: the novel's temperature, top_p, seed, penalties
        }
        # SERVE-3: cache-affinity fields (id_slot, prompt_cache_key) and the routing header
        if extra_body:
            request["extra_body"] = extra_body
        if extra_headers:
            request["extra_headers"] = extra_headers
        if tools:
            request["tools"] = tools
            if tool_choice is not None:
                request["tool_choice"] = tool_choice
        if response_format is not None:
            request["response_format"] = response_format
        try:
            completion = await self._create(request, max_output_tokens)
        except openai.APIError as e:
            raise self._error(e) from None
        except ValueError:  # a body that is not JSON (json.JSONDecodeError) or not an object
            raise ProviderError(
                "provider-bad-reply", f"model server at {self.host} sent a reply that is not JSON"
            ) from None
        reply = self._reply(completion)
        usage = reply.usage
        if (reply.stop_reason == "tool_calls" and usage is not None and usage.output_tokens is not None
                and usage.output_tokens >= max_output_tokens):
            # Some servers (llama-cpp-python) report a tool call cut at max_tokens as finished.
            reply = msgspec.structs.replace(reply, stop_reason="length")
        return reply

    async def _create(self, request: dict[str, Any], max_output_tokens: int) -> Any:
        """One completion with the reply cap under `max_tokens_field`. QUAL-4: a server that
        refuses `max_tokens` naming it (reasoning models want `max_completion_tokens`) gets the
        same request once more with the other field, which this provider then keeps using."""
        field = self.max_tokens_field
        create: Any = self._client.chat.completions.create  # the request is built as a dict
        try:
            return await create(**request, **{field: max_output_tokens})
        except openai.BadRequestError as e:
            if self._detect_field and field == "max_tokens" and _names_max_tokens(e):
                self.max_tokens_field = "max_completion_tokens"
                return await create(**request, max_completion_tokens=max_output_tokens)
            raise

    # --- mapping -------------------------------------------------------------------------------

    def _error(self, e: openai.APIError) -> ProviderError:
        where = f"model server at {self.host}"
        wait = _retry_after(e)
        if isinstance(e, openai.RateLimitError):
            return ProviderError(
                "provider-rate-limited",
                f"{where} is rate-limiting requests (HTTP 429); retry later",
                retry_after_s=wait,
            )
        if isinstance(e, openai.APITimeoutError):
            return ProviderError("provider-unavailable", f"{where} did not answer in time")
        if isinstance(e, openai.APIConnectionError):
            return ProviderError(
                "provider-unavailable", f"cannot reach {where}: is the server running?"
            )
        if isinstance(e, openai.AuthenticationError | openai.PermissionDeniedError):
            return ProviderError(
                "provider-config",
                f"{where} refused the credentials (HTTP {e.status_code}): check "
                "NOVELBUS_MODEL_API_KEY / OPENAI_API_KEY",
            )
        if isinstance(e, openai.NotFoundError):
            return ProviderError(
                "provider-config",
                f"{where} answered 404: check the model name {self.model!r} and the base URL "
                "(it usually ends in /v1)",
            )
        if isinstance(e, openai.APIStatusError):
            kind: ProviderErrorCode = "provider-unavailable" if e.status_code >= 500 else "provider-bad-reply"
            detail = f" ({e.code})" if isinstance(e.code, str) and len(e.code) <= 64 else ""
            return ProviderError(kind, f"{where} answered HTTP {e.status_code}{detail}",
                                 retry_after_s=wait if e.status_code >= 500 else None)
        # APIResponseValidationError and anything else the client could not make sense of.
        return ProviderError("provider-bad-reply", f"{where} sent a reply the client cannot read")

    def _reply(self, completion: Any) -> ModelReply:
        choices = getattr(completion, "choices", None)
        if not choices:
            raise ProviderError(
                "provider-bad-reply", f"model server at {self.host} sent a reply with no choices"
            )
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise ProviderError(
                "provider-bad-reply", f"model server at {self.host} sent a choice with no message"
            )
        calls: list[ToolCall] = []
        for call in getattr(message, "tool_calls", None) or ():
            fn = getattr(call, "function", None)
            name = getattr(fn, "name", None)
            if not isinstance(name, str) or not name:
                raise ProviderError(
                    "provider-bad-reply",
                    f"model server at {self.host} sent a tool call with no name",
                )
            arguments = getattr(fn, "arguments", None)
            calls.append(
                ToolCall(
                    id=str(getattr(call, "id", None) or f"call-{len(calls) + 1}"),
                    name=name,
                    arguments=arguments if isinstance(arguments, str) else "",
                )
            )
        finish = getattr(choice, "finish_reason", None)
        if getattr(message, "refusal", None):
            stop: StopReason = "refused"
        elif finish is None:
            stop = "tool_calls" if calls else "completed"
        else:
            stop = _FINISH.get(str(finish), "error")
        text = getattr(message, "content", None)
        text = text if isinstance(text, str) else None
        in_text = False
        if not calls and text and TOOL_CALL_OPEN in text:
            # MODEL-3: a server that leaves Hermes-style calls inside the content.
            calls = text_tool_calls(text)
            if calls:
                in_text = True
                if stop == "completed":
                    stop = "tool_calls"
        return ModelReply(
            text=text,
            tool_calls=calls,
            usage=_usage(getattr(completion, "usage", None), getattr(completion, "timings", None)),
            stop_reason=stop,
            text_tool_calls=in_text,
        )


TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.DOTALL)


def text_tool_calls(text: str) -> list[ToolCall]:
    """Hermes-style tool calls a server left in the content: `<tool_call>{"name": …,
    "arguments": {…}}</tool_call>`. Anything that does not parse as such is not a call."""
    calls: list[ToolCall] = []
    for match in _TOOL_CALL_RE.finditer(text):
        try:
            value = json.loads(match.group(1), strict=False)
        except json.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        name = value.get("name")
        args = value.get("arguments", value.get("parameters", {}))
        if not isinstance(name, str) or not name:
            continue
        if isinstance(args, str):
            arguments = args
        else:
            arguments = json.dumps(args if args is not None else {}, ensure_ascii=False)
        calls.append(ToolCall(id=f"text-call-{len(calls) + 1}", name=name, arguments=arguments))
    return calls


def _names_max_tokens(e: openai.BadRequestError) -> bool:
    """The server's 400 is about `max_tokens` (its `param`, or its message naming it and
    `max_completion_tokens`, as the hosted API's reasoning models answer)."""
    if getattr(e, "param", None) == "max_tokens":
        return True
    text = str(getattr(e, "message", "") or "")
    return "max_tokens" in text and "max_completion_tokens" in text


# QUAL-4: config.model.sampling's fields on the chat-completions wire.
SAMPLING_WIRE = {
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
}


def sampling_fields(sampling: Sampling | None) -> dict[str, Any]:
    """The request fields of `sampling` that are set (maxOutputTokens caps the reply elsewhere)."""
    if sampling is None:
        return {}
    out: dict[str, Any] = {}
    for attr, wire in SAMPLING_WIRE.items():
        value = getattr(sampling, attr)
        if value is not None:
            out[wire] = value
    return out


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _retry_after(e: openai.APIError) -> float | None:
    """SERVE-4: the seconds a refusal's `Retry-After` (or `retry-after-ms`) header asks for."""
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = retry_after_s(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000
    return retry_after_s(headers.get("retry-after"), time.time())


def _usage(usage: Any, timings: Any = None) -> Usage | None:
    """Provider usage, or None when the server reports none (USE-2: fail-open). SERVE-3: cached
    prompt tokens from `usage.prompt_tokens_details.cached_tokens`, else llama.cpp's
    `timings.cache_n`."""
    if usage is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    if isinstance(details, dict):
        cached, written = details.get("cached_tokens"), details.get("cache_write_tokens")
    else:
        cached, written = getattr(details, "cached_tokens", None), getattr(details, "cache_write_tokens", None)
    if _int_or_none(cached) is None and isinstance(timings, dict):
        cached = timings.get("cache_n")
    return Usage(
        input_tokens=_int_or_none(getattr(usage, "prompt_tokens", None)),
        output_tokens=_int_or_none(getattr(usage, "completion_tokens", None)),
        cached_tokens=_int_or_none(cached),
        cache_write_tokens=_int_or_none(written),
    )


_WINDOW_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window", "n_ctx")


def window_from_model_entry(entry: dict[str, Any]) -> int | None:
    """The context window in one model-listing entry (MODEL-5), or None: the first positive
    whole number under a known key, at the top level or in `meta` (llama.cpp)."""
    meta = entry.get("meta")
    places = [entry] + ([meta] if isinstance(meta, dict) else [])
    for place in places:
        for key in (*_WINDOW_KEYS, "n_ctx_train"):
            value = place.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 256:
                return value
    return None
