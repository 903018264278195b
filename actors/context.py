"""What every actor is given: connections, subjects, settings, and the one event sink."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import asyncpg
import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from novelbus import store
from novelbus.bus import tally
from novelbus.bus.codec import encode, type_tag
from novelbus.bus.service import CommandService
from novelbus.messages.events import Event
from novelbus.messages.subjects import Subjects

log = logging.getLogger(__name__)


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
        """
        tag = type_tag(event)
        payload = msgspec.to_builtins(event)
        seq = await store.append_event(self.pool, event.novel_id, tag, payload)
        data, headers = encode(event)
        headers["Nats-Msg-Id"] = f"{self.subjects.namespace}ev-{seq}"
        subject = self.subjects.event(event.novel_id, tag)
        for attempt in range(5):
            try:
                tally.count("publishes")
                tally.count("publish_waits")
                await self.js.publish(subject, data, headers=headers, timeout=5)
                return
            except Exception as e:  # noqa: BLE001 - NATS away: retry, then keep the ledger row
                if attempt == 4:
                    log.warning("event %s seq %s kept in the ledger only (%s)", tag, seq, type(e).__name__)
                else:
                    await asyncio.sleep(0.2 * (attempt + 1))
