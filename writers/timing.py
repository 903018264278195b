"""Model time of one writer run, so benchmarks can subtract it from orchestration time."""

from __future__ import annotations

import time
from typing import Any

from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ProviderWrapper,
)


class TimedProvider(ProviderWrapper):
    """Wraps a provider for ONE run and adds up the wall time spent inside `complete`."""

    def __init__(self, provider: ModelProvider) -> None:
        super().__init__(provider)
        self.elapsed_s = 0.0
        self.calls = 0

    @property
    def elapsed_ms(self) -> float:
        return self.elapsed_s * 1000.0

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        started = time.perf_counter()
        try:
            return await super().complete(messages, tools, max_output_tokens=max_output_tokens, **options)
        finally:
            self.elapsed_s += time.perf_counter() - started
            self.calls += 1
