"""The probe's injected calls never turn a text answer cut at max_tokens into a failed run."""

from __future__ import annotations

from typing import Any

from novelbus.app.probe import FORBIDDEN_TOOL, run_probes
from novelbus.writers.offline import OfflineProvider
from novelbus.writers.provider import ChatMessage, ModelReply


class RamblesFirst(OfflineProvider):
    """The offline writer, except that every unforced call with tools answers in prose until
    max_tokens cuts it (as the embedded 135M model often does on its first W2 call)."""

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        if tools and options.get("tool_choice") is None:
            return ModelReply(text="The bell rang over the quay. " * 40, stop_reason="length")
        return await super().complete(messages, tools, max_output_tokens=max_output_tokens, **options)


async def test_a_first_reply_cut_at_max_tokens_is_recovered_and_the_injected_calls_refused(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """MODEL-3, MODEL-4: A model whose first W2 reply is prose cut at its token limit still passes
    P1–P3 when the runner's tool-choice policy then forces its research and its commit: the probe
    injects its forbidden claim call and its out-of-scope commit into the next, forced replies
    (injected into the cut reply, they made a recoverable answer end run A as stop-reason:length)."""
    dsn = await new_database()
    report = await run_probes(RamblesFirst(), model="offline", nats_url=nats_url, database_url=dsn,
                              namespace=namespace)
    statuses = {p: report.results[p].status for p in ("P1", "P2", "P3")}
    assert statuses == dict.fromkeys(("P1", "P2", "P3"), "pass"), report.results
    assert FORBIDDEN_TOOL in report.results["P2"].evidence
    assert "forced by the tool-choice policy" in report.results["P3"].evidence
