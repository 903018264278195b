"""What every actor is given: connections, subjects, settings, and the one event sink."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import asyncpg
import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from novelbus import store
from novelbus.bus import outbox
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


def once_key(event: Event) -> str | None:
    """The key of an event that must exist exactly once per novel (REL-7, REL-8), else None."""
    if isinstance(event, UnitCommitted):
        return f"unit.committed:{event.novel_id}:{event.unit_id}"
    if isinstance(event, ChapterCompleted):
        return f"chapter.completed:{event.novel_id}:{event.chapter_id}"
    if isinstance(event, NovelFinished):
        return f"novel.finished:{event.novel_id}"
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


@dataclass
class ActorContext:
    nc: NATS
    js: JetStreamContext
    pool: asyncpg.Pool
    subjects: Subjects
    settings: Settings = field(default_factory=Settings)

    async def emit(self, event: Event) -> None:
        """Append to the event ledger, then publish on `novel.events.<novel>.<type>` (BUS-3, BUS-6).

        The ledger row's sequence is the NATS message id, so a retried publish is de-duplicated.
        REL-7: an event that must exist once (`once_key`) is written once whoever emits it; a
        repeat re-publishes the first row under its message id only while the stream's
        de-duplication window still covers it (so a publish lost with a dying process is made
        good, and a late repeat adds nothing).
        PERF-2: the publish does not wait for its ack here; the task's next command, reply or
        work notice waits for all of them first (`bus.outbox`), so events stay ordered per novel.
        """
        tag = type_tag(event)
        payload = msgspec.to_builtins(event)
        key = once_key(event)
        if key is None:
            seq = await store.append_event(self.pool, event.novel_id, tag, payload)
        else:
            seq, first, age_s = await store.append_event_once(self.pool, event.novel_id, tag, payload, key)
            if not first and age_s > REPUBLISH_WITHIN_S:
                return
        data, headers = encode(event)
        headers["Nats-Msg-Id"] = f"{self.subjects.namespace}ev-{seq}"
        await outbox.publish(self.js, self.subjects.event(event.novel_id, tag), data, headers,
                             what=f"event {tag} seq {seq}")
