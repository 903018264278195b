"""A durable JetStream pull consumer: fetch, heartbeat, nak with backoff, dead-letter (BUS-2, REL-6).

The transport loop every durable worker needs, kept apart from what it does with a message
(FastStream's pull subscriber is the model). The handler gets a decoded, typed message:

- a message that does not decode goes to the dead-letter subject at once;
- while the handler runs, an in-progress ack every `heartbeat_s` keeps the message ours;
- the handler returning acks it; raising naks it with an exponential backoff until
  `max_deliver` deliveries, then it is dead-lettered with its error code and detail;
- a failed dead-letter publish leaves the message on the stream (nak): never silently dropped.

Handlers run concurrently, at most `max_parallel` at a time, each owned by the consumer and
cancelled by `stop()`.

Pulling (PERF-2): one long-lived pull request for up to `batch` messages (expiring
after `pull_expires_s`, with server idle heartbeats every `pull_heartbeat_s`) stays open on the
server, topped up with another one when fewer than half of it is left — so a delivery costs the
message and its ack, not also a pull request and a status reply as a `fetch` per message did.
A request that ends (408 expired, 409 conflict/leader change) gives back what it still had
pending (`Nats-Pending-Messages`); no message nor heartbeat for two heartbeat intervals means
the requests were lost (a reconnect, a restarted server): ask again.

Only nats-py's public API is used for this: the consumer is looked up or created through the
JetStream manager, the deliveries arrive on a core subscription of a fresh inbox of the
connection (`nc.new_inbox()`, so a per-user inbox prefix holds, CLM-5), and the pull request is a
core publish to the JetStream API subject `<api prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`
(the server's protocol) with that inbox as its reply subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from novelbus.bus import logs, metrics, tally
from novelbus.bus.codec import MessageError, decode
from novelbus.bus.tasks import cancel_and_wait
from novelbus.novel.retry import RetryPolicy

log = logging.getLogger(__name__)

M = TypeVar("M")

DLQ_DETAIL_CHARS = 300
PULL_EXPIRES_S = 30.0  # a pull request's life on the server; then it is renewed (408 → ask again)
PULL_HEARTBEAT_S = 5.0  # the server's idle heartbeat on an open pull request
JS_API_PREFIX = "$JS.API"  # the JetStream API's subjects (no domain), as `nc.jetstream()` uses


def error_code(e: BaseException) -> str:
    """An exception's stable code (`.code`), else its class name."""
    code = getattr(e, "code", None)
    return code if isinstance(code, str) and code else type(e).__name__


class DurablePullConsumer(Generic[M]):
    """Pull `message_type` messages from a durable consumer and run `handle` on each."""

    def __init__(self, nc: NATS, js: JetStreamContext, *, stream: str, config: ConsumerConfig, message_type: type[M],
                 handle: Callable[[M], Awaitable[None]], dead_letter_subject: str, max_deliver: int,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, heartbeat_s: float = 5.0,
                 max_parallel: int = 64, batch: int = 32, fetch_timeout_s: float = 1.0,
                 before_ack: Callable[[], Awaitable[None]] | None = None,
                 pull_expires_s: float = PULL_EXPIRES_S, pull_heartbeat_s: float = PULL_HEARTBEAT_S,
                 api_prefix: str = JS_API_PREFIX) -> None:
        assert config.durable_name and config.filter_subject, "a durable consumer needs a name and a subject"
        self.nc = nc
        self.js = js
        self.stream = stream
        self.config = config
        self.message_type = message_type
        self.handle = handle
        self.dead_letter_subject = dead_letter_subject
        self.max_deliver = max_deliver
        self.backoff_s = backoff_s
        # a failed delivery n comes back after backoff_s × 2^n, at most max_backoff_s
        self.redelivery = RetryPolicy(initial_interval_s=min(2 * backoff_s, max_backoff_s),
                                      maximum_interval_s=max_backoff_s)
        self.heartbeat_s = heartbeat_s
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s  # the longest one wait for a message lasts (stop checks)
        assert 0 < 2 * pull_heartbeat_s < pull_expires_s, "heartbeats must come well inside a request's life"
        self.pull_expires_s = pull_expires_s
        self.pull_heartbeat_s = pull_heartbeat_s
        self.waiting = 0  # messages asked for by pull requests still open on the server
        self.pull_requests = 0
        self.before_ack = before_ack  # e.g. flush what the handler left to write (runs in its context)
        self.received = 0
        self._slots = asyncio.Semaphore(max_parallel)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        durable = config.durable_name
        self.next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"  # where pull requests go
        self._inbox = ""
        self._sub: Subscription | None = None
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()  # deliveries, heartbeats and statuses

    async def start(self) -> None:
        durable = self.config.durable_name or ""
        try:
            await self.js.consumer_info(self.stream, durable)
        except nats.js.errors.NotFoundError:  # first start: create it (as nats-py's pull_subscribe)
            await self.js.add_consumer(self.stream, config=dataclasses.replace(self.config, name=durable))
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._received)
        self._loop_task = asyncio.create_task(self._pull_loop(), name=f"pull-{self.config.durable_name}")
        metrics.BINDINGS.add(self)  # OPS-7: readiness asks every started service and consumer

    @property
    def bound(self) -> bool:
        """Subscribed to its deliveries with its pull loop running (OPS-7)."""
        return self._sub is not None and self._loop_task is not None and not self._loop_task.done()

    async def lag(self) -> int:
        """The consumer's messages not yet delivered, asked of the server (OPS-6, OPS-7: it exists)."""
        info = await self.js.consumer_info(self.stream, self.config.durable_name or "")
        pending = int(info.num_pending or 0)
        metrics.CONSUMER_LAG.labels(self.config.durable_name or "").set(pending)
        return pending

    async def stop(self) -> None:
        """Stop fetching, cancel the running handlers (their messages are redelivered), unsubscribe."""
        self._stopping = True  # the loop ends even if a cancel gets lost in a fetch (bus.tasks)
        if self._loop_task is not None:
            await cancel_and_wait([self._loop_task], recancel_s=0.5)  # nothing to clean up
        if self._sub is not None:
            # The pull request stays open on the server until the inbox goes: what it already
            # delivered and nobody took is given back at once (not after the ack wait).
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
            while not self._queue.empty():
                msg = self._queue.get_nowait()
                if not (msg.headers and msg.headers.get("Status")):
                    with contextlib.suppress(Exception):
                        await msg.nak()
        await cancel_and_wait(list(self._tasks))

    async def _received(self, msg: Msg) -> None:
        self._queue.put_nowait(msg)

    async def _ask(self) -> None:
        """Top up the open pull requests to `batch` messages (one request, no reply expected)."""
        assert self._sub is not None
        ask = self.batch - self.waiting
        request = {"batch": ask, "expires": int(self.pull_expires_s * 1e9),
                   "idle_heartbeat": int(self.pull_heartbeat_s * 1e9)}
        await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self._inbox)
        self.waiting += ask
        self.pull_requests += 1

    async def _next_message(self) -> Msg | None:
        """The next delivery, idle heartbeat or status on the deliver inbox; None after
        `fetch_timeout_s` without any."""
        try:
            async with asyncio.timeout(self.fetch_timeout_s):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def _pull_loop(self) -> None:
        heard = time.monotonic()  # the last message, heartbeat or status from the server
        while not self._stopping:
            try:
                if self.waiting <= self.batch // 2:
                    await self._ask()
                msg = await self._next_message()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS away: wait and ask again (REL-6)
                log.warning("pull on %s failed (%s); retrying", self.config.durable_name, type(e).__name__)
                self.waiting = 0
                await asyncio.sleep(0.5)
                continue
            if msg is None:
                if time.monotonic() - heard > 2 * self.pull_heartbeat_s + self.fetch_timeout_s:
                    self.waiting, heard = 0, time.monotonic()  # the requests are gone: ask again
                continue
            heard = time.monotonic()
            status = msg.headers.get("Status") if msg.headers else None
            if status:
                if status != "100":  # not an idle heartbeat: a request ended (408, 409, ...)
                    pending = (msg.headers or {}).get("Nats-Pending-Messages", "")
                    self.waiting = max(0, self.waiting - int(pending)) if pending.isdigit() else 0
                continue
            self.waiting = max(0, self.waiting - 1)
            if self._stopping:  # delivered as the stop began: no handler; redelivered at once
                with contextlib.suppress(Exception):
                    await msg.nak()
                return
            await self._slots.acquire()
            task = asyncio.create_task(self._run(msg))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _run(self, msg: Msg) -> None:
        self.received += 1
        with contextlib.suppress(Exception):  # OPS-6: the lag comes free with each delivery
            metrics.CONSUMER_LAG.labels(self.config.durable_name or "").set(msg.metadata.num_pending)
        try:
            message: M = decode(msg.data, self.message_type, msg.headers)
        except MessageError as e:
            await self._dead_letter(msg, e.code, str(e))
            return
        logs.bind(message)  # OPS-8: this task's log lines carry the novel's correlation id
        heartbeat = asyncio.create_task(self._heartbeat(msg))
        try:
            await self.handle(message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - bounded redelivery, then the dead-letter subject
            code = error_code(e)
            delivered = msg.metadata.num_delivered if msg.metadata else 1
            log.warning("message on %s failed (%s), delivery %s", msg.subject, code, delivered)
            if delivered >= self.max_deliver:
                await self._dead_letter(msg, code, str(e))
            else:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=self.redelivery.delay_s(delivered))
            return
        finally:
            heartbeat.cancel()
        with contextlib.suppress(Exception), tally.span("notice ack"):  # NATS away: redelivered
            if self.before_ack is not None:
                try:
                    await self.before_ack()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - what the handler wrote is not stored: again
                    log.warning("message on %s not acked (%s)", msg.subject, error_code(e))
                    await msg.nak(delay=self.backoff_s)
                    return
            await msg.ack()

    async def _heartbeat(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            while True:
                await asyncio.sleep(self.heartbeat_s)
                await msg.in_progress()

    async def _dead_letter(self, msg: Msg, code: str, detail: str) -> None:
        """Poison: the message goes to the dead-letter subject with its error, then leaves the stream."""
        meta = msg.metadata
        headers = {"Novelbus-Error": code, "Novelbus-Error-Detail": detail[:DLQ_DETAIL_CHARS],
                   "Novelbus-Subject": msg.subject, "Novelbus-Deliveries": str(meta.num_delivered if meta else 1)}
        if meta is not None:  # a repeated dead-lettering of one stream message is stored once
            headers["Nats-Msg-Id"] = f"dlq-{meta.stream}-{meta.sequence.stream}"
        try:
            await self.js.publish(self.dead_letter_subject, msg.data, headers=headers)
        except Exception as e:  # noqa: BLE001
            log.warning("dead-letter publish failed (%s); the message stays", type(e).__name__)
            with contextlib.suppress(Exception):
                await msg.nak(delay=5.0)
            return
        metrics.DEAD_LETTERED.labels(self.config.durable_name or "", code).inc()  # OPS-6
        with contextlib.suppress(Exception):
            await msg.term()
