"""What every actor is given: connections, subjects, settings, and the one event sink."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from novelbus import store
from novelbus.bus import metrics, outbox
from novelbus.bus.codec import encode, type_tag
from novelbus.bus.service import CommandService
from novelbus.bus.streams import DUPLICATE_WINDOW_S
from novelbus.messages.events import (
    ChapterCompleted,
    Event,
    NovelFinished,
    UnitCommitted,
    UsageMissing,
    WriterAbandoned,
)
from novelbus.messages.subjects import Subjects

log = logging.getLogger(__name__)

# A repeated once-only event is re-published (same message id) only this long after the first
# row was written: well inside the streams' de-duplication window (bus.streams.DUPLICATE_WINDOW_S).
REPUBLISH_WITHIN_S = DUPLICATE_WINDOW_S / 2


def once_key_of_commit(novel_id: str, unit_id: str) -> str:
    """The once-key of a unit's `unit.committed` (REL-7)."""
    return f"unit.committed:{novel_id}:{unit_id}"


def once_key_of_finish(novel_id: str) -> str:
    """The once-key of a novel's `novel.finished` (REL-7)."""
    return f"novel.finished:{novel_id}"


def once_key(event: Event) -> str | None:
    """The key of an event that must exist exactly once per novel (REL-7, REL-8), else None."""
    if isinstance(event, UnitCommitted):
        return once_key_of_commit(event.novel_id, event.unit_id)
    if isinstance(event, ChapterCompleted):
        return f"chapter.completed:{event.novel_id}:{event.chapter_id}"
    if isinstance(event, NovelFinished):
        return once_key_of_finish(event.novel_id)
    if isinstance(event, UsageMissing):
        return f"usage.missing:{event.novel_id}:{event.claim_id}"
    if isinstance(event, WriterAbandoned):
        return f"writer.abandoned:{event.novel_id}:{event.run_id}"
    return None


class ServiceActor:
    """An actor whose work is its command services: start them all, stop them all."""

    services: list[CommandService]

    async def start(self) -> None:
        for svc in self.services:
            svc.label = getattr(self, "name", svc.label)
            await svc.start()

    async def stop(self) -> None:
        for svc in self.services:
            await svc.stop()


@dataclass(frozen=True)
class Settings:
    model: str = "offline"  # writer provider spec: offline | openai:<model>
    claims_instance: str = "claims-0"  # stable per claim-manager instance (CLM-5)
    request_timeout_s: float = 30.0
    writer_timeout_s: float = 900.0
    max_tool_rounds: int = 8
    read_tools_enabled: bool = True
    notice_backoff_s: float = 0.2
    # QUAL-5 / CTX-10: the deployment's raw vault directory (`up --raw-vault`, NOVELBUS_RAW_VAULT);
    # None: no raw call or refused candidate is kept, whatever a novel's config says.
    raw_vault: str | None = None


class LedgerBatch:
    """Appends events to the ledger, the events of concurrent flows together (PERF-2).

    Each `append` waits for its own seq, as before; while one INSERT is in flight, the events
    emitted meanwhile queue and go in the next one (one statement for all of them). An INSERT
    that fails is retried event by event, so one event's failure is only its own."""

    MAX_BATCH = 256

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queue: list[tuple[str | None, str, dict[str, Any], asyncio.Future[int]]] = []
        self.flushing = False
        self._flusher: asyncio.Task[None] | None = None

    async def append(self, novel_id: str | None, tag: str, payload: dict[str, Any]) -> int:
        return await self.enqueue(novel_id, tag, payload)

    def enqueue(self, novel_id: str | None, tag: str, payload: dict[str, Any]) -> asyncio.Future[int]:
        """Queue the row and return the future of its seq (the INSERT's error, if it fails)."""
        store.check_event(tag, payload)  # bad input fails here, before anything is written
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((novel_id, tag, payload, future))
        if not self.flushing:
            self.flushing = True
            self._flusher = asyncio.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        try:
            while self.queue:
                batch, self.queue = self.queue[:self.MAX_BATCH], self.queue[self.MAX_BATCH:]
                try:
                    seqs = await store.append_events(self.pool, [(n, t, p) for n, t, p, _ in batch])
                except Exception as e:  # noqa: BLE001 - each event on its own, so each gets its own outcome
                    if len(batch) == 1:
                        _settle_future(batch[0][3], exc=e)
                        continue
                    for n, t, p, future in batch:
                        try:
                            _settle_future(future, await store.append_event(self.pool, n, t, p))
                        except Exception as one:  # noqa: BLE001
                            _settle_future(future, exc=one)
                    continue
                for (_, _, _, future), seq in zip(batch, seqs, strict=True):
                    _settle_future(future, seq)
        finally:
            self.flushing = False


def _settle_future(future: asyncio.Future[int], seq: int = 0, *, exc: BaseException | None = None) -> None:
    if future.done():  # the emitter was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(seq)


@dataclass
class ActorContext:
    nc: NATS
    js: JetStreamContext
    pool: asyncpg.Pool
    subjects: Subjects
    settings: Settings = field(default_factory=Settings)
    ledger: LedgerBatch | None = field(default=None, repr=False)
    # Read-only connections (INFRA-4, `store.connect_read_only`): the read tools' snapshot in one
    # statement (PERF-2). None: those reads open a read-only transaction on `pool` instead.
    read_pool: asyncpg.Pool | None = field(default=None, repr=False)

    async def emit(self, event: Event, *, once: str | None = None) -> None:
        """Append to the event ledger, then publish on `novel.events.<novel>.<type>` (BUS-3, BUS-6).

        The ledger row's sequence is the NATS message id, so a retried publish is de-duplicated.
        REL-7: an event that must exist once (`once_key`) is written once whoever emits it; a
        repeat re-publishes the first row under its message id only while the stream's
        de-duplication window still covers it (so a publish lost with a dying process is made
        good, and a late repeat adds nothing).
        PERF-2: concurrent flows' ledger rows share one INSERT (LedgerBatch); the publish does not
        wait for its ack here: the task's next command, reply or work notice waits for all of
        them first (`bus.outbox`), so events stay ordered per novel.
        The ledger row is written before `emit` returns: callers outside a command or notice
        (the CLI, the panel) rely on it.
        `once`: the once-key of an event that is once per request rather than per its own fields
        (a refusal answered again to a retried request is the same refusal).
        """
        tag = type_tag(event)
        payload = msgspec.to_builtins(event)
        key = once or once_key(event)
        if key is None:
            if self.ledger is None:
                self.ledger = LedgerBatch(self.pool)
            seq = await self.ledger.append(event.novel_id, tag, payload)
        else:
            seq, first, age_s = await store.append_event_once(self.pool, event.novel_id, tag, payload, key)
            if not first and age_s > REPUBLISH_WITHIN_S:
                return
        await self.publish_recorded(event, seq)

    async def republish_once(self, key: str, kind: type[Event]) -> bool:
        """Emit again, from its ledger row, a once-only event whose emitter may have died between
        writing the row and publishing it (an interrupted flow, REL-7): `emit` re-publishes the
        first row under its message id while the stream's de-duplication window covers it, so the
        stream holds it once either way. False if no row exists yet (reconciliation writes it)."""
        row = await store.event_by_once_key(self.pool, key)
        if row is None:
            return False
        await self.emit(msgspec.convert(row.payload, kind))
        return True

    @staticmethod
    def ledger_entry(event: Event) -> tuple[str, dict[str, Any]]:
        """(type, payload) of an event's ledger row, for a store function that writes it in the
        same statement as the step it reports (PERF-2); then `publish_recorded` with its seq."""
        return type_tag(event), msgspec.to_builtins(event)

    async def publish_recorded(self, event: Event, seq: int) -> None:
        """The publish half of `emit`, for an event whose ledger row (seq) is already written."""
        tag = type_tag(event)
        metrics.observe_event(event, seq)  # OPS-6: units by outcome, counted from what is published
        data, headers = encode(event)
        headers["Nats-Msg-Id"] = f"{self.subjects.namespace}ev-{seq}"
        await outbox.publish(self.nc, self.js, self.subjects.event(event.novel_id, tag), data, headers,
                             what=f"event {tag} seq {seq}")
