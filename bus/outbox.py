"""Events published without waiting on each ack, settled before anything causally later (PERF-2).

`publish` sends an event to JetStream and returns at once; the stream's ack comes back on this
connection's ack inbox (one wildcard subscription per connection, `_Acks`), and a missing or
failed ack is re-published with the same `Nats-Msg-Id` (which the stream de-duplicates) and in
the end left in the ledger only — as before. `settle` waits for every event the calling task
published and is called before that task sends anything a later step can react to: a command
(bus.client.request), a reply (bus.service), a work notice. So an event is stored in its stream
before any step that follows it can start, wherever that step runs, and events stay ordered per
novel exactly as when every publish waited for its ack — with one wait per step instead of one
per event, and usually none, because the acks arrive while the step works on.

PERF-2 (less work per unit): an event costs its publish, its ack and a future — no task of its
own. (nats-py's `publish_async` starts a task per call to wait on its in-flight semaphore; here a
timer per event watches for a late ack, and a task is started only for an event whose ack failed
or is late.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from novelbus.bus import tally
from novelbus.novel.retry import RetryPolicy

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 5.0
REPUBLISH = RetryPolicy(initial_interval_s=0.2, maximum_interval_s=1.0, maximum_attempts=4)
MAX_IN_FLIGHT = 4096  # unacked events per connection before `publish` waits (nats-py's bound was 4000)


class AckFailed(Exception):
    """The stream answered a publish with an error or a status (no stream, no responders)."""


class _Event:
    """One published event until its ack: what to re-publish if the ack fails or is late."""

    __slots__ = ("js", "subject", "data", "headers", "what", "ack", "timer", "retry")

    def __init__(self, js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str], what: str,
                 ack: asyncio.Future[None]) -> None:
        self.js, self.subject, self.data, self.headers, self.what = js, subject, data, headers, what
        self.ack = ack
        self.timer: asyncio.TimerHandle | None = None
        self.retry: asyncio.Task[None] | None = None


class _Acks:
    """The acks of one connection's event publishes: one subscription on a private inbox
    (`<inbox prefix>.<nuid>.*`, so a per-user inbox prefix — CLM-5 — is kept), a future per event."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox() + "."
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.next = 0
        self.subscribed: asyncio.Future[None] | None = None
        self.room: asyncio.Event | None = None  # set while fewer than MAX_IN_FLIGHT are unacked

    async def ready(self) -> None:
        if self.subscribed is None:
            self.subscribed = asyncio.get_running_loop().create_future()
            try:
                await self.nc.subscribe(self.prefix + "*", cb=self._on_ack)
            except BaseException as e:
                self.subscribed.set_exception(e)
                self.subscribed.exception()  # retrieved here; the next caller retries
                self.subscribed = None
                raise
            self.subscribed.set_result(None)
        elif not self.subscribed.done():
            await asyncio.shield(self.subscribed)
        while len(self.waiting) >= MAX_IN_FLIGHT:
            if self.room is None:
                self.room = asyncio.Event()
            self.room.clear()
            await self.room.wait()

    def expect(self) -> tuple[str, asyncio.Future[None]]:
        self.next += 1
        token = format(self.next, "x")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        return self.prefix + token, future

    def forget(self, reply: str) -> None:
        self.waiting.pop(reply[len(self.prefix):], None)
        if self.room is not None and len(self.waiting) < MAX_IN_FLIGHT:
            self.room.set()

    async def _on_ack(self, msg: Msg) -> None:
        future = self.waiting.pop(msg.subject[len(self.prefix):], None)
        if self.room is not None and len(self.waiting) < MAX_IN_FLIGHT:
            self.room.set()
        if future is None or future.done():
            return
        # A PubAck is `{"stream":…,"seq":…[,"duplicate":true]}`; an error is `{"error":{…}}`, and
        # a status message (e.g. 503, nobody stores the subject) has a `Status` header.
        if (msg.headers and msg.headers.get("Status")) or not msg.data or b'"error"' in msg.data:
            future.set_exception(AckFailed(msg.headers.get("Status", "error") if msg.headers else "error"))
        else:
            future.set_result(None)


_acks: weakref.WeakKeyDictionary[NATS, _Acks] = weakref.WeakKeyDictionary()

# The calling task's unconfirmed publishes (tasks are weakly held: a finished task's list goes).
_pending: weakref.WeakKeyDictionary[asyncio.Task[Any], list[_Event]] = weakref.WeakKeyDictionary()
_retries: set[asyncio.Task[None]] = set()  # strong references until each re-publish is done


async def publish(nc: NATS, js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str], *,
                  what: str = "event") -> None:
    """Send without waiting for the ack; `settle()` in the same task waits for it."""
    tally.count("publishes")
    loop = asyncio.get_running_loop()
    acks = _acks.get(nc)
    if acks is None:
        acks = _acks[nc] = _Acks(nc)
    event = _Event(js, subject, data, headers, what, loop.create_future())
    try:
        await acks.ready()
        reply, ack = acks.expect()
        event.ack = ack
        try:
            await nc.publish(subject, data, reply=reply, headers=headers)
        except BaseException:
            acks.forget(reply)
            raise
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - NATS away or closed: re-published (or kept in the ledger)
        log.debug("%s publish on %s deferred (%s)", what, subject, type(e).__name__)
        if not event.ack.done():
            event.ack.set_exception(e)
        event.ack.exception()  # retrieved: the re-publish below handles it
        _republish_later(js, event)
    else:
        event.timer = loop.call_later(ACK_TIMEOUT_S, _late, acks, reply, event)
        event.ack.add_done_callback(functools.partial(_acked, js, event))
    task = asyncio.current_task()
    if task is not None:
        _pending.setdefault(task, []).append(event)


def _late(acks: _Acks, reply: str, event: _Event) -> None:
    if not event.ack.done():
        acks.forget(reply)
        event.ack.set_exception(TimeoutError("no ack in time"))


def _acked(js: JetStreamContext, event: _Event, future: asyncio.Future[None]) -> None:
    if event.timer is not None:
        event.timer.cancel()
        event.timer = None
    if future.cancelled() or future.exception() is not None:
        _republish_later(js, event)


def _republish_later(js: JetStreamContext, event: _Event) -> None:
    if event.retry is None:
        event.retry = asyncio.get_running_loop().create_task(_republish(js, event))
        _retries.add(event.retry)
        event.retry.add_done_callback(_retries.discard)


async def settle() -> None:
    """Wait until every publish of the calling task is acked (or given up on and logged)."""
    task = asyncio.current_task()
    events = _pending.pop(task, None) if task is not None else None
    if not events:
        return
    tally.count("publish_waits")
    with tally.span("event acks"):
        unacked = [e.ack for e in events if not e.ack.done()]
        if unacked:
            tally.count("ack_blocked")
            await asyncio.wait(unacked)
        for e in events:  # failed, and its done callback has not run yet: start the re-publish here
            if e.retry is None and (e.ack.cancelled() or e.ack.exception() is not None):
                _republish_later(e.js, e)
        retries = [e.retry for e in events if e.retry is not None and not e.retry.done()]
        if retries:
            await asyncio.gather(*retries, return_exceptions=True)


async def _republish(js: JetStreamContext, event: _Event) -> None:
    """The ack did not come (or said no): publish again under the same message id, waiting for
    the ack each time; after the last attempt the event is in the ledger only (logged)."""
    attempts = 0
    while True:
        try:
            await js.publish(event.subject, event.data, headers=event.headers, timeout=ACK_TIMEOUT_S)
            return
        except Exception as e:  # noqa: BLE001 - NATS away: retry, then keep the ledger row
            attempts += 1
            if not REPUBLISH.allows(attempts):
                log.warning("%s %s kept in the ledger only (%s)", event.what,
                            event.headers.get("Nats-Msg-Id", ""), type(e).__name__)
                return
            await asyncio.sleep(REPUBLISH.delay_s(attempts))
