"""ROLE-3: the model extractor — the projection is the model's input, its answer goes through the
trusted acceptance, a reply that does not parse is recorded as such, usage under `extractor`."""

from __future__ import annotations

import json
from typing import Any

from novelbus import store
from novelbus.actors.extraction import CanonKeeper
from novelbus.actors.runtime import Runtime
from novelbus.novel.roles import project
from novelbus.writers.openai_provider import OpenAIProvider
from tests.e2e.conftest import run_novel
from tests.e2e.test_extractor import novel
from tests.writers.chat_server import ChatServer, Response, completion

BAD_REPLY_AT = 1  # the second request gets an answer that is not JSON


def answer(request: dict[str, Any], index: int) -> Response:
    """A model that proposes, for the commit it is shown: one sound fact, one without a source,
    one citing another commit, one repeating known canon; at BAD_REPLY_AT, prose instead of JSON."""
    usage = {"prompt_tokens": 100 + index, "completion_tokens": 20, "total_tokens": 120 + index}
    if index == BAD_REPLY_AT:
        return completion(content="Here are the facts: Wren is brave.", usage=usage)
    view = json.loads(request["messages"][-1]["content"])
    pointer = view["pendingProse"]["paragraphs"][0]["pointer"]
    commit = pointer.split("#")[0]
    cast = [c["characterId"] for c in view["cast"]]
    proposals: list[dict[str, Any]] = [
        {"kind": "event", "summary": f"Something happens in {commit}", "sources": [pointer], "characterIds": cast[:1]},
        {"kind": "event", "summary": "An inference with no source", "sources": []},
        {"kind": "event", "summary": "A fact from elsewhere", "sources": ["commit-999#0"]},
    ]
    if view["knownCanon"]:
        known = view["knownCanon"][0]
        proposals.append({"kind": known["kind"], "summary": known["summary"], "sources": [pointer],
                          "characterIds": known["characterIds"]})
    return completion(content=json.dumps({"canonChanges": proposals}), usage=usage)


async def test_the_model_extractor_keeps_only_sourced_new_facts_and_records_its_usage(stack: Runtime) -> None:
    """ROLE-3: each commit's extractor call carries exactly the extractor projection and asks for
    structured output; of its proposals only the sourced, new one is kept; an unparsable reply is
    the outcome `bad-reply` with no fact; usage is recorded under the mode `extractor`."""
    driver: Any = stack.actor("driver")
    await driver.canon.stop()  # this test runs its own keeper, against its own model
    driver.canon.after_commit = lambda novel_id: None
    novel_id, _ = await run_novel(stack, novel(extractor="model", canon_source="both"))
    pool = stack.ctx.pool
    commits = await store.list_commits(pool, novel_id)
    calls = 0

    def respond(request: dict[str, Any]) -> Response:
        nonlocal calls
        calls += 1
        return answer(request, calls - 1)

    async with ChatServer([], responder=respond) as server:
        provider = OpenAIProvider("test-model", server.base_url, "test-key")
        keeper = CanonKeeper(stack.ctx, provider=provider)
        assert await keeper.sweep(novel_id) == len(commits)
        requests = list(server.requests)
    assert len(requests) == len(commits)
    ledger = await store.list_extractions(pool, novel_id)
    assert [r.outcome for r in ledger] == ["bad-reply" if i == BAD_REPLY_AT else "extracted"
                                           for i in range(len(commits))]
    assert all(r.mode == "model" for r in ledger)
    facts = await store.extracted_canon(pool, novel_id)
    for i, c in enumerate(commits):
        kept = facts.get(c.commit_id, [])
        if i == BAD_REPLY_AT:
            assert kept == [] and ledger[i].proposed == 0
            continue
        assert [f.summary for f in kept] == [f"Something happens in {c.commit_id}"], kept
        assert kept[0].sources == [f"{c.commit_id}#0"]
        assert ledger[i].proposed >= 3 and ledger[i].accepted == 1
    # the model got the projection, and nothing else, as its user message; structured output asked
    last = commits[-1]
    inputs = await store.load_role_inputs(pool, novel_id=novel_id, unit_id=last.unit_id, role="extractor",
                                          purpose="production", profile="bounded")
    assert json.loads(requests[-1]["messages"][-1]["content"]) == json.loads(json.dumps(project("extractor", inputs)))
    assert requests[-1]["response_format"]["type"] == "json_object"
    totals = (await store.usage_totals(pool, novel_id))["extractor"]
    assert totals["calls"] == len(commits) and totals["samples"] == len(commits)
    assert totals["inputTokens"] == sum(100 + i for i in range(len(commits)))
