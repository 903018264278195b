"""The semantic detector's check of a candidate (ROLE-2): a helper of the commit verifier.

The verifier asks it, after the content gate, for every candidate of both shapes: a W1 draft
before the orchestrator commits it, and every commit (W1 and W2) the claim manager is about to
make with its token. A candidate becomes canon only once the detector passed it.

One check: read, in one statement, the request the candidate's context was frozen with (found by
the context hash the commit carries) and the record of an earlier check of this very candidate
in that context; a record found is the verdict (a redelivered or repeated commit, REL-2: the
detector is not asked twice, its event re-published under the same message id). Else freeze the
detection context at the candidate's asOf, with the same recalled evidence (`store.load_context`,
scenario `detection`), project it (`novel.roles.detector`), detect (`offline`: deterministic;
`model`: the provider with structured output, its usage under the mode `detector`), and write the
record, its `candidate.detected` event and the detection context's freeze (CTX-12) in one
statement (REL-7: a kill before the publish leaves the row, and the next check of the candidate
re-publishes it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from novelbus import store
from novelbus.actors.context import REPUBLISH_WITHIN_S, ActorContext
from novelbus.messages import events as ev
from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import business_hash
from novelbus.novel.detection import (
    DETECTOR_SCHEMA,
    DETECTOR_UNAVAILABLE,
    DETECTOR_UNPARSED,
    Claim,
    Detection,
    DetectorReplyError,
    detect_offline,
    detector_messages,
    parse_detector_reply,
    refusal_message,
)
from novelbus.novel.outline import NovelConfig
from novelbus.novel.roles import Candidate, role_inputs
from novelbus.novel.roles.detector import project
from novelbus.novel.text import effective_characters
from novelbus.store.context import refreeze
from novelbus.store.detections import (
    DetectionInputs,
    DetectionRecord,
    detection_inputs,
    save_detection_with_event,
)
from novelbus.writers.provider import ModelProvider, ProviderError, complete
from novelbus.writers.structured import mechanism_override, response_format

log = logging.getLogger(__name__)

DETECTOR_MAX_TOKENS = 1_024
DETECTOR_TIME_SHARE = 0.8  # of the verifier's request timeout


@dataclass(frozen=True)
class DetectorVerdict:
    """`code` None: the candidate may become canon. Else the refusal code and what the writer is
    told (claims by pointer; a model detector's claim text is never in it)."""

    code: str | None
    message: str = ""
    gaps: tuple[str, ...] = ()


def once_key_of_detection(novel_id: str, unit_id: str, context_hash: str | None, body_hash: str) -> str:
    return f"candidate.detected:{novel_id}:{unit_id}:{(context_hash or '-')[:32]}:{body_hash[:32]}"


def _verdict(record: DetectionRecord) -> DetectorVerdict:
    if record.outcome == "pass":
        return DetectorVerdict(None)
    detection = Detection(record.detector, [msgspec.convert(c, Claim) for c in record.claims])
    return DetectorVerdict(record.outcome, refusal_message(detection, model_text=record.detector == "model"),
                           tuple(record.gaps))


class CandidateDetector:
    """Checks candidates for the verifier; owns the detector model's provider (mode `model`)."""

    def __init__(self, ctx: ActorContext, provider: ModelProvider | None = None) -> None:
        self.ctx = ctx
        self._provider = provider
        self._owns_provider = provider is None
        self.checked = 0

    async def aclose(self) -> None:
        """Close the provider this detector made (an injected one is its owner's)."""
        close = getattr(self._provider, "aclose", None)
        if self._owns_provider and close is not None:
            await close()

    def provider(self) -> ModelProvider:
        if self._provider is None:
            from novelbus.writers.factory import make_provider  # noqa: PLC0415 - only the model mode needs it

            self._provider = make_provider(self.ctx.settings.model)
        return self._provider

    async def check(self, novel_id: str, unit_id: str, body: CommitBody, *, context_sha256: str | None,
                    claim_id: str | None = None, shape: str = "W2",
                    config: NovelConfig | None = None, inputs: DetectionInputs | None = None,
                    body_hash: str | None = None) -> DetectorVerdict:
        """The verdict on one candidate (`config`: the novel's, else read with the inputs;
        `inputs` and `body_hash`: already read and hashed for this candidate by the verifier,
        PERF-2)."""
        pool = self.ctx.pool
        body_hash = body_hash or business_hash(body)
        key = once_key_of_detection(novel_id, unit_id, context_sha256, body_hash)
        if inputs is None:
            inputs = await detection_inputs(pool, novel_id, unit_id, context_sha256, body_hash)
        config = config or inputs.config
        mode = config.detector
        if mode == "off":
            return DetectorVerdict(None)
        if inputs.record is not None:  # REL-2: this candidate was checked in this context already
            await self._republish(key)
            return _verdict(inputs.record)
        req = inputs.request or {}
        # PERF-2: the candidate's context as this process froze it for the writer's pack, under the
        # scenario `detection`, with no read; else read back at the same asOf and evidence.
        frozen = refreeze(context_sha256, scenario="detection") if inputs.request is not None else None
        if frozen is None:
            frozen = await store.load_context(
                pool, novel_id=novel_id, unit_id=unit_id, scenario="detection", purpose="production",
                profile=req.get("profile", config.continuityProfile), as_of=req.get("asOf"),
                evidence=tuple(req.get("evidence") or ()))
        candidate = Candidate(paragraphs=list(body.paragraphs), canon_changes=list(body.canon_changes),
                              scene_completion=body.scene_completion)
        projection = project(role_inputs("detector", frozen, candidate=candidate))
        try:
            if mode == "model":
                detection = await self._model(novel_id, unit_id, key, projection)
            else:
                detection = detect_offline(projection)
        except DetectorReplyError:
            return await self._unanswered(novel_id, unit_id, body, shape, DETECTOR_UNPARSED)
        except (ProviderError, TimeoutError) as e:
            log.info("detector call for %s/%s failed (%s)", novel_id, unit_id,
                     e.code if isinstance(e, ProviderError) else "timeout")
            return await self._unanswered(novel_id, unit_id, body, shape, DETECTOR_UNAVAILABLE)
        outcome = detection.refusal() or "pass"
        counts = detection.counts()
        record = DetectionRecord(
            detector=mode, outcome=outcome, supported=counts["supported"], contradicted=counts["contradicted"],
            unknown=counts["unknown"], gaps=detection.gaps(), claims=msgspec.to_builtins(detection.claims),
            detection_context_hash=frozen.context_sha256, claim_id=claim_id)
        event = ev.CandidateDetected(novel_id=novel_id, unit_id=unit_id, detector=mode, outcome=outcome,
                                     supported=counts["supported"], contradicted=counts["contradicted"],
                                     unknown=counts["unknown"])
        refused = None if outcome == "pass" else self._refused(novel_id, unit_id, body, shape, outcome)
        saved, seq, refused_seq = await save_detection_with_event(
            pool, self.ctx.ledger_entry(event), once_key=key, novel_id=novel_id, unit_id=unit_id,
            context_hash=context_sha256, body_hash=body_hash, record=record,
            refusal=self.ctx.ledger_entry(refused) if refused is not None else None,
            freeze=frozen)  # CTX-6, CTX-12: kept with the verdict read from it, so it can be verified
        if saved and seq is not None:
            await self.ctx.publish_recorded(event, seq)
            if refused is not None and refused_seq is not None:  # QUAL-3: counted like the gate's
                await self.ctx.publish_recorded(refused, refused_seq)
        elif not saved:  # a concurrent check of the same candidate wrote it first: its verdict counts
            await self._republish(key)
            first = (await detection_inputs(pool, novel_id, unit_id, context_sha256, body_hash)).record
            if first is not None:
                record = first
        self.checked += 1
        return _verdict(record)

    async def _unanswered(self, novel_id: str, unit_id: str, body: CommitBody, shape: str,
                          code: str) -> DetectorVerdict:
        """A model detector whose reply does not parse, or that failed or did not answer within
        its time: refused (never a pass), counted, and not recorded as a verdict on the candidate
        — its next check asks the detector again."""
        # CTX-12: no verdict is recorded from this context, so its freeze is not kept (nothing to verify).
        await self.ctx.emit(ev.CandidateDetected(novel_id=novel_id, unit_id=unit_id, detector="model",
                                                 outcome=code, supported=0, contradicted=0, unknown=0))
        await self.ctx.emit(self._refused(novel_id, unit_id, body, shape, code))
        self.checked += 1
        what = "reply could not be read" if code == DETECTOR_UNPARSED else "model did not answer"
        return DetectorVerdict(code, f"{code}: the detector's {what}, so the candidate was not checked and is "
                               "not committed; commit it again")

    @staticmethod
    def _refused(novel_id: str, unit_id: str, body: CommitBody, shape: str, code: str) -> ev.UnitRefused:
        """QUAL-3's refusal event, for a detector's refusal: code and counts only."""
        return ev.UnitRefused(novel_id=novel_id, unit_id=unit_id, code=code, shape=shape,
                              paragraph_count=len(body.paragraphs),
                              characters=sum(effective_characters(p) for p in body.paragraphs))

    async def _republish(self, key: str) -> None:
        """REL-7: the event written with the record, published again under its message id while
        the stream's de-duplication window covers it (a publish lost with a dying process)."""
        row = await store.event_by_once_key(self.ctx.pool, key)
        if row is None:
            return
        age = time.time() - row.created_at.timestamp()
        if age <= REPUBLISH_WITHIN_S:
            await self.ctx.publish_recorded(msgspec.convert(row.payload, ev.CandidateDetected), row.seq)

    async def _model(self, novel_id: str, unit_id: str, key: str, projection: dict[str, Any]) -> Detection:
        """The model detector: instructions and the projection, the claims schema as structured
        output (MODEL-2: the env override, the provider's known mechanism, else JSON mode); its
        usage recorded under the mode `detector`. A reply that does not parse raises
        DetectorReplyError (refused, never a pass); a provider failure propagates (the commit
        fails and is tried again, nothing is recorded)."""
        provider = self.provider()
        known = getattr(provider, "structured_mode", None)
        mechanism = mechanism_override() or (known if isinstance(known, str) else "json_object")
        messages = detector_messages(projection)
        started = time.monotonic()
        # Inside the verifier's request: the detector answers within most of its timeout, or the
        # candidate is refused `detector-unavailable` (the caller's retry would only ask again).
        reply = await asyncio.wait_for(
            complete(provider, messages, None, max_output_tokens=DETECTOR_MAX_TOKENS,
                     response_format=response_format(mechanism, DETECTOR_SCHEMA)),
            timeout=self.ctx.settings.request_timeout_s * DETECTOR_TIME_SHARE)
        await self._record_usage(novel_id, unit_id, key, provider, messages, reply, time.monotonic() - started)
        return parse_detector_reply(reply.text, projection)

    async def _record_usage(self, novel_id: str, unit_id: str, key: str, provider: ModelProvider,
                            messages: list[dict[str, Any]], reply: Any, seconds: float) -> None:
        sample: dict[str, Any] = {
            "unitId": unit_id, "mode": "detector", "provider": provider.label, "calls": 1,
            "inputChars": sum(len(str(m.get("content") or "")) for m in messages),
            "outputChars": len(reply.text or ""), "modelMs": round(seconds * 1000, 3),
        }
        usage = reply.usage
        if usage is not None:
            for name, value in (("inputTokens", usage.input_tokens), ("outputTokens", usage.output_tokens),
                                ("cachedTokens", usage.cached_tokens)):
                if value is not None:
                    sample[name] = value
        try:
            # once per reply: a retried check after a kill that got the same answer counts once
            digest = hashlib.sha256((reply.text or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]
            await store.record_turn_usage(self.ctx.pool, novel_id, "detector", sample,
                                          message_key=f"detector:{key}:{digest}")
        except Exception as e:  # noqa: BLE001 - usage is observation: it never blocks a verdict (USE-2)
            log.warning("detector usage of %s/%s not recorded (%s)", novel_id, unit_id, type(e).__name__)
