"""Following novel events: the one watcher the monitor, the demo and the benches use (BUS-3).

Events are decoded once, here, into the typed `NovelEvent` union; an event this version cannot
read is skipped (a newer actor may publish types an older follower does not know).

- live (default): a core NATS subscription on `novel.events.<novel|*>.>` — or, with `types`,
  one subscription per event type, so a follower of a busy server sees only what it asks for;
- `replay=True`: an ordered JetStream consumer on the events stream from its first message
  (`new_only=True`: from now), so starting late misses nothing.

Either hand `on_event` (called for each event, in order) or iterate the follower.

An event whose ack was late or lost is published again under the same `Nats-Msg-Id` (REL-6,
REL-7): the stream stores it once, but a live core subscription receives every publish. The
follower therefore hands on each message id once, among the last `RECENT_IDS` it has seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from novelbus.bus.codec import MessageError, decode
from novelbus.messages.events import NovelEvent
from novelbus.messages.subjects import Subjects

log = logging.getLogger(__name__)

OnEvent = Callable[[NovelEvent], Awaitable[None]]

# Message ids a follower remembers to drop a re-published event: minutes of one novel's events,
# tens of seconds of a whole loaded server's (a re-publish follows its first within seconds).
RECENT_IDS = 65_536


class EventFollower:
    """Async context manager: subscribed inside the `async with`, unsubscribed on leaving it."""

    def __init__(self, nc: NATS, subjects: Subjects, *, novel_id: str | None = None,
                 types: Iterable[type[NovelEvent]] = (), on_event: OnEvent | None = None,
                 js: JetStreamContext | None = None, replay: bool = False, new_only: bool = False) -> None:
        if replay and js is None:
            raise ValueError("replaying events needs a JetStream context (js=...)")
        self.nc = nc
        self.js = js
        self.subjects = subjects
        self.novel_id = novel_id
        self.tags = [t.__struct_config__.tag for t in types]
        self.on_event = on_event
        self.replay = replay
        self.new_only = new_only
        self._subs: list[Subscription] = []
        self._queue: asyncio.Queue[NovelEvent] = asyncio.Queue()
        self._seen: OrderedDict[str, None] = OrderedDict()  # recent Nats-Msg-Ids, oldest first
        self.duplicates = 0  # re-published events dropped

    def subject_list(self) -> list[str]:
        if self.tags:
            return [self.subjects.event(self.novel_id or "*", str(tag)) for tag in self.tags]
        return [self.subjects.events_of(self.novel_id)]

    async def __aenter__(self) -> EventFollower:
        for subject in self.subject_list():
            sub: Subscription
            if self.replay:
                assert self.js is not None
                policy = DeliverPolicy.NEW if self.new_only else DeliverPolicy.ALL
                sub = await self.js.subscribe(subject, stream=self.subjects.events_stream, ordered_consumer=True,
                                              deliver_policy=policy, cb=self._on_msg)
            else:
                sub = await self.nc.subscribe(subject, cb=self._on_msg)
            self._subs.append(sub)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    def _first_time(self, msg: Msg) -> bool:
        msg_id = msg.headers.get("Nats-Msg-Id") if msg.headers else None
        if msg_id is None:
            return True
        if msg_id in self._seen:
            self.duplicates += 1
            return False
        self._seen[msg_id] = None
        if len(self._seen) > RECENT_IDS:
            self._seen.popitem(last=False)
        return True

    async def _on_msg(self, msg: Msg) -> None:
        if not self._first_time(msg):  # a re-publish of an event already handed on
            return
        try:
            event: NovelEvent = decode(msg.data, NovelEvent, msg.headers)
        except MessageError as e:  # a follower skips what it cannot read
            log.debug("event on %s skipped (%s)", msg.subject, e.code)
            return
        if self.on_event is not None:
            await self.on_event(event)
        else:
            self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[NovelEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[NovelEvent]:
        while True:
            yield await self._queue.get()
