"""QUAL-1..3 end to end: a scripted OpenAI-compatible model writes W1 novels of one chapter
and two scenes through all the actors (real NATS and PostgreSQL, `--model openai:…` and
NOVELBUS_MODEL_BASE_URL as a user sets them). Good English prose finishes; `...`, the scene's goal
copied, one sentence repeated and Chinese prose in an English novel each commit nothing, and each
novel pauses as `quality` naming its check. The model's requests carry the whole draft schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.pack import pack_fields
from novelbus.writers.factory import ENV_API_KEY, ENV_BASE_URL, ENV_OPENAI_API_KEY
from tests.writers.chat_server import ChatServer, Response, completion
from tests.writers.harness import FakeModel, drive, sample_with, writer_stack
from tests.writers.test_one_contract import prune

DATA = Path(__file__).resolve().parents[1] / "pure" / "data"
GOALS = ("Mara hears the harbour bell ring with no wind to move it, and she goes down to the quay.",
         "Mara holds the last ferry at the quay although the timetable says it must leave.")
NOVEL = {
    "title": "The Ferry Bell",
    "config": {"writerMode": "subagent", "writerShape": "W1",
               "length": {"kind": "target", "targetCharacters": 1600, "toleranceRatio": 0.4},
               "budgets": {"externalRetry": {"maxAttempts": 1, "backoffMs": 0}}},
    "outline": {
        "story": {"premise": "A ferry pilot hears the old harbour bell ring on a night with no wind.",
                  "theme": "duty"},
        "chapters": [{"chapterId": "bell", "order": 1, "title": "The Bell",
                      "purpose": "The bell rings and the pilot decides."}],
        "scenes": [
            {"sceneId": "ring", "chapterId": "bell", "order": 1, "goal": GOALS[0], "participants": ["mara"],
             "timeLocation": "the quay at dusk"},
            {"sceneId": "hold", "chapterId": "bell", "order": 2, "goal": GOALS[1], "participants": ["mara"],
             "timeLocation": "the wheelhouse at night"},
        ],
        "characters": [{"characterId": "mara", "name": "Mara", "identitySummary": "the ferry pilot"}],
    },
}


def _passage(name: str) -> list[str]:
    return [p for p in (DATA / name).read_text(encoding="utf-8").splitlines() if p.strip()]


def _good(goal: str) -> list[str]:
    return _passage("pride_and_prejudice.txt" if goal == GOALS[0] else "tale_of_two_cities.txt")


WRITERS: dict[str, Callable[[str], list[str]]] = {
    "good": _good,
    "ellipsis": lambda goal: ["...", "...", "..."],
    "goal": lambda goal: [goal, goal],
    "one-sentence": lambda goal: ["The rain fell on the slate roofs of the harbour town all night."] * 12,
    "chinese": lambda goal: _passage("kongyiji.txt"),
}


class ScriptedModel:
    """An OpenAI-compatible model that writes the same kind of draft every time, for any unit."""

    def __init__(self, kind: str) -> None:
        self.write = WRITERS[kind]

    def __call__(self, request: dict[str, Any]) -> Response:
        system = request["messages"][0]["content"]
        try:
            goal = pack_fields(system).get("scene", {}).get("goal", "")
        except Exception:  # noqa: BLE001 - the P6 probe's prompt is not a pack
            goal = GOALS[0]
        draft = {"paragraphs": self.write(goal),
                 "sceneCompletion": {"completed": True, "basis": "the scene's goal is reached"},
                 "canonChanges": []}
        return completion(content=json.dumps(draft, ensure_ascii=False),
                          usage={"prompt_tokens": 100, "completion_tokens": 100, "total_tokens": 200})


@pytest.fixture
def model_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    def point_at(server: ChatServer) -> None:
        monkeypatch.setenv(ENV_BASE_URL, server.base_url)
        monkeypatch.delenv(ENV_API_KEY, raising=False)
        monkeypatch.delenv(ENV_OPENAI_API_KEY, raising=False)
    return point_at


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        out.add(prefix + name)
        out |= _schema_paths(sub, prefix + name + ".")
    items = schema.get("items")
    if isinstance(items, dict):
        out |= _schema_paths(items, prefix)
    for alt in schema.get("anyOf", []):
        out |= _schema_paths(alt, prefix)
    return out


@pytest.mark.parametrize(("kind", "code"), [
    ("good", None), ("ellipsis", "no-letters"), ("goal", "copies-outline"),
    ("one-sentence", "repetition"), ("chinese", "wrong-script"),
])
async def test_only_readable_prose_becomes_canon_and_junk_pauses_the_novel_naming_the_check(
        kind: str, code: str | None, model_env: Any, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-1/2/3: the issue's table, as a user would run it."""
    async with ChatServer([], responder=ScriptedModel(kind)) as server:
        model_env(server)
        async with writer_stack(nats_url, new_database, namespace,
                                settings=Settings(model="openai:scripted-model")) as rt:
            d = await drive(rt, parse_novel_file(json.dumps(NOVEL)), timeout=120)
            pool = rt.ctx.pool
            snap = await store.load_snapshot(pool, d.novel_id)
            novel = await store.get_novel(pool, d.novel_id)
            refusals = await store.refusal_counts(pool, d.novel_id, tag_of(ev.UnitRefused))
            ledger = await store.list_events(pool, d.novel_id)
    drafts = [r for r in server.requests if "[[unit]]" in r["messages"][0]["content"]]
    assert drafts, "the model was asked for drafts"
    if code is None:
        assert isinstance(d.final, ev.NovelFinished), d.final
        assert len(snap.commits) == 2 and refusals == {}
    else:
        _assert_paused_naming(code, kind, d, snap, novel, refusals, ledger, drafts)
    for r in drafts:  # QUAL-1: the schema is the whole contract
        schema = r["response_format"]["json_schema"]["schema"]
        paths = _schema_paths(schema)
        assert {"sceneCompletion.nextAnchor", "canonChanges.foreshadowingId",
                "canonChanges.characterIds", "canonChanges.detail"} <= paths


def _assert_paused_naming(code: str, kind: str, d: Any, snap: Any, novel: Any, refusals: dict[str, int],
                          ledger: list[Any], drafts: list[dict[str, Any]]) -> None:
    assert isinstance(d.final, ev.NovelPaused), d.final
    assert d.final.reason == "quality" and d.final.detail.startswith(f"{code}:")
    assert novel.pause_reason == "quality"
    assert snap.commits == []  # nothing became canon
    limit = 3  # budgets.consecutiveFailureLimit's default: three failed turns
    assert refusals == {code: 2 * limit}  # each turn: the draft and its one repair
    refused = [e for e in ledger if e.type == "unit.refused"]
    assert len(refused) == 2 * limit
    # codes and counts only, never prose
    assert all(set(e.payload) == {"type", "novelId", "unitId", "code", "shape", "paragraphCount", "characters"}
               for e in refused)
    repairs = [r for r in drafts if len(r["messages"]) > 2]
    assert len(repairs) == limit  # one repair turn per failed turn ...
    told = repairs[0]["messages"][-1]["content"]
    assert code in told  # ... naming the check
    failed = [e for e in ledger if e.type == "unit.failed"]
    assert len(failed) == limit and all(e.payload["reason"] == f"quality:{code}" for e in failed)
    assert not any(any(p in json.dumps(e.payload, ensure_ascii=False) for p in WRITERS[kind](GOALS[0]) if len(p) > 8)
                   for e in ledger)


class SchemaHonouringModel:
    """The offline writer behind the wire, answering only what the request's draft schema allows
    (unknown fields dropped, strings and lists cut at their bounds): a grammar-constrained server."""

    def __init__(self) -> None:
        self.inner = FakeModel()

    async def __call__(self, request: dict[str, Any]) -> Response:
        status, headers, body = await self.inner(request)
        fmt = request.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema")
        reply = json.loads(body)
        message = reply["choices"][0]["message"]
        if schema is not None and message.get("content"):
            message["content"] = json.dumps(prune(json.loads(message["content"]), schema), ensure_ascii=False)
        return status, headers, json.dumps(reply).encode()


async def test_a_grammar_constrained_writer_resolves_required_foreshadowing_and_finishes(
        model_env: Any, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-1: the sample novel (required foreshadowing items) written in W1 by a server that can
    emit only what the draft schema allows: its foreshadowing changes survive, and the book finishes."""
    async with ChatServer([], responder=SchemaHonouringModel()) as server:
        model_env(server)
        async with writer_stack(nats_url, new_database, namespace,
                                settings=Settings(model="openai:grammar-model")) as rt:
            d = await drive(rt, sample_with("W1"), timeout=180)
            snap = await store.load_snapshot(rt.ctx.pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished), d.final
    resolved = {c.foreshadowing_id for commit in snap.commits for c in commit.canon_changes
                if c.kind == "foreshadowing" and c.foreshadowing_status == "resolved"}
    assert snap.outline is not None
    assert {f.id for f in snap.outline.foreshadowing if f.required} <= resolved
