"""QUAL-1 with a real grammar server: the embedded llama.cpp server (SmolLM2-135M) takes the
largest W1 draft schema as a grammar and answers a valid draft, and under the same schema, with a
foreshadowing change asked for, it writes one that resolves the outline item by its id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from novelbus.novel.commitcheck import parse_draft_lenient
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.provider import complete
from novelbus.writers.structured import draft_schema, response_format
from tests.e2e.test_local_model import _need_local_model

pytestmark = [pytest.mark.timeout(900), pytest.mark.local_model]

SYSTEM = ("You write fiction. The scene: Mara finds the page torn from the keeper's log. Its payoff: "
          "foreshadowing item torn-log-page. Reply with the JSON draft only.")
USER = "Write two short paragraphs of the scene now."


def _asking_for_the_payoff(schema: dict[str, Any]) -> dict[str, Any]:
    """The draft schema with one foreshadowing change required (what a pack's foreshadowingDue
    asks for in words), its fields as the one definition has them."""
    changes = schema["properties"]["canonChanges"]
    changes["minItems"] = 1
    changes["maxItems"] = 1
    item = changes["items"]
    item["properties"]["kind"] = {"enum": ["foreshadowing"]}
    item["properties"]["foreshadowingId"] = {"enum": ["torn-log-page"]}
    item["properties"]["foreshadowingStatus"] = {"enum": ["resolved"]}
    item["required"] = [*item["required"], "foreshadowingId", "foreshadowingStatus"]
    return schema


async def test_the_embedded_grammar_server_takes_the_draft_schema_and_resolves_foreshadowing() -> None:
    """QUAL-1: the grammar llama.cpp builds from the largest draft schema works (the server answers,
    it does not die), and a grammar-constrained draft can carry foreshadowingId."""
    _need_local_model()
    from novelbus.infra.llama import open_local_server
    from novelbus.writers.local_provider import LocalProvider

    provider = LocalProvider(open_local_server(None, None))
    await provider.start()
    try:
        messages = [system_message(SYSTEM), user_message(USER)]
        largest = draft_schema(target_max=10**6)
        reply = await complete(provider, messages, None, max_output_tokens=1_500,
                               response_format=response_format(provider.structured_mode, largest))
        assert reply.stop_reason == "completed", reply.stop_reason
        parse_draft_lenient(reply.text or "")

        asked = _asking_for_the_payoff(draft_schema(target_max=600))
        reply = await complete(provider, messages, None, max_output_tokens=1_500,
                               response_format=response_format(provider.structured_mode, asked))
        assert reply.stop_reason == "completed", reply.stop_reason
        body = parse_draft_lenient(reply.text or "")
        change = body.canon_changes[0]
        assert (change.kind, change.foreshadowing_id, change.foreshadowing_status) == (
            "foreshadowing", "torn-log-page", "resolved"), json.dumps(reply.text)
    finally:
        await provider.aclose()
