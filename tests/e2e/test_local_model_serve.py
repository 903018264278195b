"""SERVE-6 with the REAL embedded server: llama.cpp's `llama-server` (SmolLM2-135M).

One server of several slots serves requests at once (continuous batching: more than one busy
slot per decode), answers under a JSON schema, reports the prompt tokens a slot's cache reused,
and sizes its window from the model's GGUF header.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from novelbus.writers.structured import commit_schema, draft_schema, response_format
from tests.e2e.test_local_model import _need_local_model

pytestmark = [pytest.mark.timeout(900), pytest.mark.local_model]

PREFIX = " ".join(f"Rule {i}: the keeper writes the hour, the weather and the ships in the log." for i in range(60))


async def test_one_embedded_server_batches_requests_answers_a_schema_and_reports_its_cache() -> None:
    """SERVE-6: two requests at once are decoded together (llama-server's busy slots per decode
    above 1); a reply under `response_format: json_schema` is the schema's JSON, also under the
    largest draft and commit schemas (llama.cpp builds their grammars); the same prefix sent again
    to the slot that holds it is reported cached (`usage.prompt_tokens_details.cached_tokens`);
    and one slot's window is the model's training context from the GGUF header."""
    _need_local_model()
    from novelbus.infra.llama import LocalModelServer, training_context
    from novelbus.writers.local_provider import LocalProvider

    server = LocalModelServer(slots=2)
    assert server.context_window == training_context(server.weights) == 8192
    provider = LocalProvider(server)
    client = await provider.start()
    try:
        story = [{"role": "user", "content": "Tell a short story about a lighthouse keeper."}]
        await asyncio.gather(*(client.complete(story, None, max_output_tokens=48) for _ in range(2)))
        metrics = await server.metrics()
        assert metrics["n_busy_slots_per_decode"] > 1.0, metrics  # continuous batching

        schema = {"type": "object", "properties": {"hour": {"type": "integer"}}, "required": ["hour"],
                  "additionalProperties": False}
        ask = [{"role": "user", "content": "At what hour does the keeper light the lamp? Answer in JSON."}]
        reply = await client.complete(ask, None, max_output_tokens=32,
                                      response_format=response_format(provider.structured_mode, schema))
        assert isinstance(json.loads(reply.text or "")["hour"], int), reply.text
        for largest in (draft_schema(target_max=10**6), commit_schema("u-1", target_max=10**6)):
            reply = await client.complete(ask, None, max_output_tokens=1,
                                          response_format=response_format(provider.structured_mode, largest))
            assert reply.usage is not None and reply.usage.output_tokens == 1

        pinned = {"id_slot": 1, "cache_prompt": True}
        prompts = [[{"role": "system", "content": PREFIX}, {"role": "user", "content": q}]
                   for q in ("Who writes the log?", "What is in the log?")]
        first = await client.complete(prompts[0], None, max_output_tokens=1, extra_body=pinned)
        second = await client.complete(prompts[1], None, max_output_tokens=1, extra_body=pinned)
        assert first.usage is not None and second.usage is not None
        assert first.usage.input_tokens and first.usage.input_tokens > 600
        assert (second.usage.cached_tokens or 0) >= 0.9 * first.usage.input_tokens, second.usage
    finally:
        await provider.aclose()
    assert not server.running
