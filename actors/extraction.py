"""The extractor keeps canon (ROLE-3): after each commit, off the unit's path, once per commit.

The driver owns one `CanonKeeper`. A commit wakes it (`after_commit`); so do the driver's start
and its periodic sweep. Each pass reads the store's list of commits not extracted yet
(`store.pending_extractions`: novels whose `config.extractor` is not `off`), oldest first per
novel, and for each one: freezes the extractor's inputs (`store.load_role_inputs`, role
`extractor`: the commit's prose, the canon at or before the commit before it, the chapter's
canon for de-duplication), extracts — deterministically (`offline`) or with the model through
the provider interface and structured output (`model`, usage recorded under the mode
`extractor`) —, keeps what `novel.roles.extractor.accept` accepts, and writes the commit's
ledger row (bound to the SHA-256 of the frozen context, CTX-9), its facts, its
`canon.extracted` event row and the frozen context itself (CTX-12) in ONE statement
(`store.save_extraction`). A kill at any line loses nothing (the commit stays pending until that
statement lands, and the next pass does it) and doubles nothing (the ledger row is the commit's
key: a replay writes nothing). The event is published after the statement; one whose publisher
died first is published again from its ledger row at the next start (`republish_recent`), under
its ledger seq as message id, which the stream de-duplicates.

A unit's writer never waits for any of this: a later unit's pack recalls what was extracted by
the time its context is frozen (the extracted facts are read with the commit index, at or
before the context's asOf, `store.context`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import msgspec

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.bus.tasks import cancel_and_wait
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.novel.body import CanonChange
from novelbus.novel.context import ContextError, ContextLeakError, FrozenContext
from novelbus.novel.roles import RoleInputs, project
from novelbus.novel.roles.extractor import (
    ExtractionDraft,
    accept,
    known_canon,
    offline_extract,
)
from novelbus.store.extraction import PendingExtraction
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.provider import ModelProvider, ProviderError, complete
from novelbus.writers.structured import mechanism_override, response_format

log = logging.getLogger(__name__)

SWEEP_S = 30.0  # a pass over every novel this often (and at start)
RETRY_S = 2.0  # after a pass that failed (the store away), the next full pass this soon
BATCH = 200  # commits per store read
EXTRACTOR_MAX_TOKENS = 1_200
REPUBLISH_WITHIN_S = 60.0  # a `canon.extracted` row this recent is published again at start


class CanonKeeper:
    def __init__(self, ctx: ActorContext, *, provider: ModelProvider | None = None) -> None:
        self.ctx = ctx
        self._provider = provider
        self._wake = asyncio.Event()
        self._woken: set[str] = set()  # novels that committed since the last pass
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.extracted = 0  # commits this keeper extracted (tests, benchmarks)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="canon-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def after_commit(self, novel_id: str) -> None:
        """A commit of this novel landed: extract it soon (never awaited by the unit's flow)."""
        self._woken.add(novel_id)
        self._wake.set()

    async def _loop(self) -> None:
        """A pass over every novel at start and every SWEEP_S (what a dead process left, commits
        of other driver processes); between them, a pass over the novels that just committed
        (a read of their own commits only, PERF-2)."""
        with contextlib.suppress(Exception):
            await self.republish_recent()
        last_full = -SWEEP_S
        while True:
            full = time.monotonic() - last_full >= SWEEP_S
            novels = [None] if full else sorted(self._woken)
            self._woken.clear()
            if full:
                last_full = time.monotonic()
            try:
                for novel_id in novels:
                    await self.sweep(novel_id)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the store or NATS away: a full pass soon (REL-6)
                log.warning("canon extraction pass failed (%s)", type(e).__name__)
                last_full = time.monotonic() - SWEEP_S + RETRY_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, last_full + SWEEP_S - time.monotonic()))
            self._wake.clear()

    # --- the work -------------------------------------------------------------------------
    async def sweep(self, novel_id: str | None = None) -> int:
        """Extract every pending commit (of one novel, or all); the number extracted here."""
        done = 0
        stalled: set[str] = set()  # a novel whose commit failed waits for the next pass (order kept)
        async with self._lock:
            while True:
                pending = await store.pending_extractions(self.ctx.pool, novel_id=novel_id, limit=BATCH,
                                                          exclude_novel_ids=sorted(stalled))
                progress = 0
                for p in pending:
                    if p.novel_id in stalled:
                        continue
                    try:
                        if await self.extract(p):
                            done += 1
                        progress += 1
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - one novel's failure never stops the others
                        log.warning("extraction of %s/%s failed (%s); retried at the next pass",
                                    p.novel_id, p.commit_id, type(e).__name__)
                        stalled.add(p.novel_id)
                if len(pending) < BATCH or not progress:
                    return done

    async def republish_recent(self) -> None:
        """Publish again the recent `canon.extracted` rows (their emitter may have died between
        the statement and the publish); the stream stores each once (message id: its seq)."""
        for row in await store.recent_once_events(self.ctx.pool, tag_of(ev.CanonExtracted),
                                                  REPUBLISH_WITHIN_S):
            event = msgspec.convert(row.payload, ev.CanonExtracted)
            await self.ctx.publish_recorded(event, row.seq)

    async def extract(self, p: PendingExtraction) -> bool:
        """One commit: True when this call wrote its extraction (False: done already)."""
        pool = self.ctx.pool
        outcome, proposed, facts = "extracted", 0, list[CanonChange]()
        frozen: FrozenContext | None = None
        try:
            inputs = await store.load_role_inputs(pool, novel_id=p.novel_id, unit_id=p.unit_id, role="extractor",
                                                  purpose="production", profile=p.profile)
        except ContextLeakError:
            raise  # fail closed, and try again at the next pass
        except ContextError as e:  # the unit's scene left the outline, …: nothing to read it against
            log.info("commit %s/%s not extracted: %s", p.novel_id, p.commit_id, type(e).__name__)
            outcome = "no-context"
        else:
            frozen = inputs.frozen
            if p.mode == "model":
                outcome, proposed, facts = await self._model(p, inputs)
            else:
                facts = offline_extract(inputs)
                proposed = len(facts)
        event = ev.CanonExtracted(novel_id=p.novel_id, unit_id=p.unit_id, commit_id=p.commit_id,
                                  mode=p.mode, outcome=outcome, proposed=proposed, accepted=len(facts))
        seq = await store.save_extraction(
            pool, self.ctx.ledger_entry(event), once_key=f"{tag_of(ev.CanonExtracted)}:{p.novel_id}:{p.commit_id}",
            novel_id=p.novel_id, commit_id=p.commit_id, seq=p.seq, mode=p.mode, outcome=outcome,
            proposed=proposed, facts=facts, unit_id=p.unit_id,
            freeze=frozen)  # CTX-6, CTX-12: kept with the commit's extraction, so it can be verified
        if seq is None:
            return False
        await self.ctx.publish_recorded(event, seq)
        self.extracted += 1
        return True

    def provider(self) -> ModelProvider:
        if self._provider is None:
            from novelbus.writers.factory import make_provider  # noqa: PLC0415 - only the model mode needs it

            self._provider = make_provider(self.ctx.settings.model)
        return self._provider

    async def _model(self, p: PendingExtraction, inputs: RoleInputs) -> tuple[str, int, list[CanonChange]]:
        """The model extractor: the projection as the user message, the answer's schema as
        structured output; usage recorded under the mode `extractor` (once per commit)."""
        view = project("extractor", inputs)
        messages = [system_message("\n".join(view["instructions"])),
                    user_message(json.dumps(view, ensure_ascii=False))]
        started = time.monotonic()
        try:
            provider = self.provider()
            mechanism = mechanism_override() or "json_object"
            reply = await complete(provider, messages, None, max_output_tokens=EXTRACTOR_MAX_TOKENS,
                                   response_format=response_format(mechanism, view["answerSchema"]))
        except ProviderError as e:
            log.info("extractor call for %s/%s failed (%s)", p.novel_id, p.commit_id, e.code)
            return "provider-error", 0, []
        await self._record_usage(p, provider, messages, reply.text or "", reply.usage, time.monotonic() - started)
        draft = parse_draft(reply.text or "")
        if draft is None:
            return "bad-reply", 0, []
        cast = [c["characterId"] for c in view["cast"]]
        assert inputs.commit is not None
        return "extracted", len(draft.canon_changes), accept(draft.canon_changes, inputs.commit,
                                                             known_canon(inputs), cast)

    async def _record_usage(self, p: PendingExtraction, provider: ModelProvider, messages: list[dict[str, Any]],
                            text: str, usage: Any, seconds: float) -> None:
        input_chars = sum(len(str(m.get("content") or "")) for m in messages)
        sample: dict[str, Any] = {
            "unitId": p.unit_id, "mode": "extractor", "provider": provider.label, "calls": 1,
            "inputChars": input_chars, "outputChars": len(text), "modelMs": round(seconds * 1000, 3),
        }
        if usage is not None:
            for key, value in (("inputTokens", usage.input_tokens), ("outputTokens", usage.output_tokens),
                               ("cachedTokens", usage.cached_tokens)):
                if value is not None:
                    sample[key] = value
        try:
            await store.record_turn_usage(self.ctx.pool, p.novel_id, "extractor", sample,
                                          message_key=f"extractor:{p.novel_id}:{p.commit_id}")
        except Exception as e:  # noqa: BLE001 - usage is observation: it never blocks the canon (USE-2)
            log.warning("extractor usage of %s/%s not recorded (%s)", p.novel_id, p.commit_id, type(e).__name__)


def parse_draft(text: str) -> ExtractionDraft | None:
    """The model's answer as an ExtractionDraft, or None when it does not parse (never a guess)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        return msgspec.json.decode(text[start:end + 1], type=ExtractionDraft)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
