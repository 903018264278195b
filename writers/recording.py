"""Every model call of one run, handed whole to a recorder (QUAL-5 / CTX-10: the raw vault).

The writer runner wraps its provider in a `RecordedProvider` only when the deployment and the
novel keep raw calls; the recorder (the actor's) writes them to the raw vault. Writers never
know where records go: no file, bus or store access here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderError,
    ProviderWrapper,
)

# (call number in the run from 1, the request as sent, the reply or None, the error or None)
CallRecorder = Callable[[int, dict[str, Any], dict[str, Any] | None, dict[str, Any] | None], Awaitable[None]]


def request_record(messages: list[ChatMessage], tools: list[dict[str, Any]] | None, max_output_tokens: int,
                   options: dict[str, Any]) -> dict[str, Any]:
    """The request as the provider was asked for it, as plain JSON values."""
    return {"messages": msgspec.to_builtins(messages), "tools": msgspec.to_builtins(tools),
            "maxOutputTokens": max_output_tokens,
            "options": {k: msgspec.to_builtins(v) for k, v in options.items()}}


class RecordedProvider(ProviderWrapper):
    """Wraps a provider for ONE run and hands each call's request and reply to `record`."""

    def __init__(self, provider: ModelProvider, record: CallRecorder) -> None:
        super().__init__(provider)
        self.record = record
        self.calls = 0

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        self.calls += 1
        seq = self.calls
        request = request_record(messages, tools, max_output_tokens, options)
        try:
            reply = await super().complete(messages, tools, max_output_tokens=max_output_tokens, **options)
        except ProviderError as e:
            await self.record(seq, request, None, {"code": e.code, "message": e.message})
            raise
        await self.record(seq, request, msgspec.to_builtins(reply), None)
        return reply
