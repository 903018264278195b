"""The semantic detector gates canon in both shapes (ROLE-2), on real NATS and PostgreSQL: every
committed unit was detected first; a planted contradiction is refused (first as an evidence gap,
then — with the gap's evidence recalled into a fresh writer's context — as a contradiction naming
its pointer), and a fresh writer commits."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.detection import (
    CONTRADICTED,
    DETECTOR_UNAVAILABLE,
    DETECTOR_UNPARSED,
    EVIDENCE_GAP,
)
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.store.detections import list_detections
from novelbus.writers.offline import OfflineProvider, UnitBrief
from novelbus.writers.provider import ChatMessage, ModelReply, ProviderError, ToolCall, Usage
from tests.e2e.test_detector import harbor
from tests.writers.harness import drive, writer_stack

PLANTED = "Mara waved to Tom from the far end of the quay and called his name twice."


class Planting:
    """The offline writer, except that its first `plant` runs for scene `s2`'s unit add a paragraph
    in which Mara (drowned in scene 1) acts. Every call is kept."""

    name = "planting"
    label = "planting (test, no language model)"
    structured_mode = "prompt"

    def __init__(self, plant: int) -> None:
        self.inner = OfflineProvider()
        self.plant = plant
        self.runs: dict[str, int] = {}  # unit id -> fresh runs seen
        self.calls: list[tuple[str | None, int, list[ChatMessage]]] = []  # (unit, run, messages)

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        packs = [m["content"] for m in messages
                 if isinstance(m.get("content"), str) and "[[unit]]" in m["content"].split("\n")]
        unit = UnitBrief.from_pack(packs[-1]).unit_id if packs else None
        # A run's first call: nothing answered yet (later calls hold the model's turns).
        if unit is not None and not any(m.get("role") == "assistant" for m in messages):
            self.runs[unit] = self.runs.get(unit, 0) + 1
        run = self.runs.get(unit or "", 0)
        self.calls.append((unit, run, copy.deepcopy(messages)))
        reply = await self.inner.complete(messages, tools, max_output_tokens=max_output_tokens)
        if unit is None or not unit.startswith("s2") or run > self.plant:
            return reply
        if reply.tool_calls:
            calls = []
            for c in reply.tool_calls:
                args = json.loads(c.arguments)
                if "paragraphs" in args:
                    args["paragraphs"] = [*args["paragraphs"], PLANTED]
                calls.append(ToolCall(id=c.id, name=c.name, arguments=json.dumps(args)))
            return ModelReply(text=reply.text, tool_calls=calls, usage=reply.usage, stop_reason=reply.stop_reason)
        if reply.text and reply.text.lstrip().startswith("{"):
            draft = json.loads(reply.text)
            draft["paragraphs"] = [*draft["paragraphs"], PLANTED]
            return ModelReply(text=json.dumps(draft), usage=reply.usage, stop_reason=reply.stop_reason)
        return reply


@pytest.mark.parametrize("shape", ["W2", "W1"])
async def test_a_planted_contradiction_is_refused_and_a_fresh_writer_commits(
        nats_url: str, new_database: Any, namespace: str, shape: str) -> None:
    """ROLE-2: dispatch 1 names drowned Mara, no participant → evidence gap, refused; dispatch 2's
    context recalls her canon state (the pack shows it) and names her again → contradicted, the
    writer told the claim and its pointer (W2: the commit tool's result; W1: the repair turn);
    dispatch 3 (a fresh writer, unplanted) commits. Only the passed candidate is canon."""
    provider = Planting(plant=2)
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        driven = await drive(rt, harbor(writerShape=shape), timeout=90)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        pool = rt.ctx.pool
        units = {u.scene_id: u.unit_id for u in await store.list_units(pool, driven.novel_id)}
        u2 = units["s2"]
        outcomes = [r.outcome for r in await list_detections(pool, driven.novel_id, u2)]
        assert outcomes == [EVIDENCE_GAP, CONTRADICTED, "pass"], outcomes
        commit = await store.get_commit_for_unit(pool, driven.novel_id, u2)
        assert commit is not None and PLANTED not in commit.body.paragraphs
        records = await list_detections(pool, driven.novel_id, u2)
        # Dispatch 2 was frozen anew, with the gap's evidence: its context differs from dispatch 1's.
        assert records[0].detection_context_hash != records[1].detection_context_hash
        if shape == "W1":  # the full pack shows the recalled canon state (W2's trimmed pack has no canon block)
            packs = {run: str(msgs[0]["content"]) + str(msgs[1]["content"]) for unit, run, msgs in provider.calls
                     if unit == u2 and not any(m.get("role") == "assistant" for m in msgs)}
            assert "Mara: Mara drowned" not in packs[1] and "Mara: Mara drowned" in packs[2]
        # The writer was told the contradicted claim and its evidence pointer (W2: the commit tool's
        # result; W1: the repair turn).
        told = [str(m.get("content")) for unit, run, msgs in provider.calls if unit == u2 and run == 2
                for m in msgs if m.get("role") in ("tool", "user")]
        assert any("contradicted" in t and "commit-1#" in t and "Mara (mara)" in t for t in told), told
        # The ledger (what the stream keeps): one candidate.detected per candidate, one refusal each.
        ledger = await store.list_events(pool, driven.novel_id)
        detected = [(r.payload["unitId"], r.payload["outcome"]) for r in ledger if r.type == "candidate.detected"]
        assert {u for u, _ in detected} == set(units.values())
        assert [o for u, o in detected if u == u2] == [EVIDENCE_GAP, CONTRADICTED, "pass"]
        refused = [r.payload["code"] for r in ledger if r.type == "unit.refused" and r.payload["unitId"] == u2]
        assert refused == [EVIDENCE_GAP, CONTRADICTED]


@pytest.mark.parametrize("mode", ["subagent", "inline"])
async def test_an_offline_novel_with_the_roles_on_finishes_with_a_detection_per_committed_unit(
        nats_url: str, new_database: Any, namespace: str, mode: str) -> None:
    """ROLE-2 (with ROLE-3 on): the sample novel with `detector: offline`, `extractor: offline`,
    `canonSource: both` finishes, written by W2 subagents or by one inline session; every committed
    unit has a `candidate.detected` event and a passed detection record."""
    data = json.loads(sample_novel_bytes())
    data["config"].update({"detector": "offline", "extractor": "offline", "canonSource": "both",
                           "writerMode": mode})
    async with writer_stack(nats_url, new_database, namespace) as rt:
        driven = await drive(rt, parse_novel_file(json.dumps(data)), timeout=120)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        pool = rt.ctx.pool
        committed = driven.of(ev.UnitCommitted)
        detected = driven.of(ev.CandidateDetected)
        assert committed and {e.unit_id for e in committed} <= {e.unit_id for e in detected if e.outcome == "pass"}
        for e in committed:
            records = await list_detections(pool, driven.novel_id, e.unit_id)
            assert any(r.outcome == "pass" for r in records)


async def test_detector_off_checks_nothing(nats_url: str, new_database: Any, namespace: str) -> None:
    """ROLE-2: `detector: off` writes no record and no event; the planted candidate is committed."""
    provider = Planting(plant=1)
    async with writer_stack(nats_url, new_database, namespace, provider=provider) as rt:
        driven = await drive(rt, harbor(detector="off"), timeout=60)
        assert isinstance(driven.final, ev.NovelFinished)
        assert driven.of(ev.CandidateDetected) == []
        assert await list_detections(rt.ctx.pool, driven.novel_id) == []


def test_an_unknown_detector_value_names_the_field_and_the_allowed_values() -> None:
    data = copy.deepcopy(json.loads(sample_novel_bytes()))
    data["config"]["detector"] = "strict"
    with pytest.raises(ValueError, match=r"config\.detector: Input should be 'off', 'offline' or 'model'"):
        parse_novel_file(json.dumps(data))


class DetectorScript:
    """A detector model: replays `replies` (then an empty claims list), every call kept."""

    name = "detector-script"
    label = "detector script (test replies, no language model)"
    structured_mode = "json_object"

    def __init__(self, replies: list[str | BaseException]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[ChatMessage], dict[str, Any]]] = []

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        self.calls.append((messages, options))
        text = self.replies.pop(0) if self.replies else '{"claims": []}'
        if isinstance(text, BaseException):
            raise text
        return ModelReply(text=text, usage=Usage(input_tokens=100, output_tokens=10))


async def test_a_model_detector_reply_that_does_not_parse_is_refused_never_passed(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """ROLE-2: `detector: model` asks the model with structured output and exactly the projection;
    a reply that does not parse refuses the candidate (`detector-unparsed`, counted), the retried
    commit asks again and passes; the detector's usage is recorded under the mode `detector`."""
    detector = DetectorScript(["I think it is fine.",
                               json.dumps({"claims": [{"claim": "Tom waits", "verdict": "supported",
                                                       "evidence": ["outline:scene/s1#participants", "made-up"]}]})])
    kwargs = {"verifier": {"detector_provider": detector}}
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace), actor_kwargs=kwargs) as rt:
        driven = await drive(rt, harbor(detector="model"), timeout=90)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        outcomes = [e.outcome for e in driven.of(ev.CandidateDetected)]
        assert outcomes[:2] == [DETECTOR_UNPARSED, "pass"] and set(outcomes[2:]) == {"pass"}
        assert [e.code for e in driven.of(ev.UnitRefused)] == [DETECTOR_UNPARSED]
        messages, options = detector.calls[0]
        assert options.get("response_format", {}).get("type") == "json_object"
        sent = json.loads(messages[-1]["content"])
        assert set(sent) >= {"outline", "factEvidence", "proseEvidence", "candidate", "asOf"}
        assert "run-" not in messages[-1]["content"] and "dlg-" not in messages[-1]["content"]
        records = await list_detections(rt.ctx.pool, driven.novel_id)
        assert records[0].detector == "model" and records[0].claims[0]["evidence"] == [
            "outline:scene/s1#participants"]
        totals = (await store.usage_totals(rt.ctx.pool, driven.novel_id)).get("detector", {})
        assert totals.get("calls") == len(detector.calls) and totals.get("inputTokens") == 100 * len(detector.calls)


async def test_a_model_detector_that_fails_refuses_the_candidate_and_is_asked_again(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """ROLE-2: a detector model that fails (a provider error, or no answer in time) refuses the
    candidate as `detector-unavailable` — never a pass — and the retried commit asks again."""
    detector = DetectorScript([ProviderError("provider-unavailable", "down")])
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace),
                       actor_kwargs={"verifier": {"detector_provider": detector}}) as rt:
        driven = await drive(rt, harbor(detector="model"), timeout=90)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        ledger = await store.list_events(rt.ctx.pool, driven.novel_id)
        outcomes = [r.payload["outcome"] for r in ledger if r.type == "candidate.detected"]
        assert outcomes[:2] == [DETECTOR_UNAVAILABLE, "pass"]
        assert [r.payload["code"] for r in ledger if r.type == "unit.refused"] == [DETECTOR_UNAVAILABLE]
