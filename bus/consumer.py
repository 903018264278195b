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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from novelbus.bus import tally
from novelbus.bus.codec import MessageError, decode
from novelbus.bus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

M = TypeVar("M")

DLQ_DETAIL_CHARS = 300


def error_code(e: BaseException) -> str:
    """An exception's stable code (`.code`), else its class name."""
    code = getattr(e, "code", None)
    return code if isinstance(code, str) and code else type(e).__name__


class DurablePullConsumer(Generic[M]):
    """Pull `message_type` messages from a durable consumer and run `handle` on each."""

    def __init__(self, js: JetStreamContext, *, stream: str, config: ConsumerConfig, message_type: type[M],
                 handle: Callable[[M], Awaitable[None]], dead_letter_subject: str, max_deliver: int,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, heartbeat_s: float = 5.0,
                 max_parallel: int = 64, batch: int = 32, fetch_timeout_s: float = 1.0,
                 before_ack: Callable[[], Awaitable[None]] | None = None) -> None:
        assert config.durable_name and config.filter_subject, "a durable consumer needs a name and a subject"
        self.js = js
        self.stream = stream
        self.config = config
        self.message_type = message_type
        self.handle = handle
        self.dead_letter_subject = dead_letter_subject
        self.max_deliver = max_deliver
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.heartbeat_s = heartbeat_s
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s
        self.before_ack = before_ack  # e.g. flush what the handler left to write (runs in its context)
        self.received = 0
        self._slots = asyncio.Semaphore(max_parallel)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._psub: JetStreamContext.PullSubscription | None = None

    async def start(self) -> None:
        self._psub = await self.js.pull_subscribe(self.config.filter_subject or "", durable=self.config.durable_name,
                                                  stream=self.stream, config=self.config)
        self._loop_task = asyncio.create_task(self._pull_loop(), name=f"pull-{self.config.durable_name}")

    async def stop(self) -> None:
        """Stop fetching, cancel the running handlers (their messages are redelivered), unsubscribe."""
        self._stopping = True  # the loop ends even if a cancel gets lost in a fetch (bus.tasks)
        if self._loop_task is not None:
            await cancel_and_wait([self._loop_task], recancel_s=0.5)  # nothing to clean up
        await cancel_and_wait(list(self._tasks))
        if self._psub is not None:
            with contextlib.suppress(Exception):
                await self._psub.unsubscribe()

    async def _pull_loop(self) -> None:
        assert self._psub is not None
        while not self._stopping:
            try:
                msgs = await self._psub.fetch(batch=self.batch, timeout=self.fetch_timeout_s)
            except (TimeoutError, NotFoundError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS away: wait and retry (REL-6)
                log.warning("fetch on %s failed (%s); retrying", self.config.durable_name, type(e).__name__)
                await asyncio.sleep(0.5)
                continue
            if self._stopping:  # fetched as the stop began: no handler; redelivered at once
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                return
            for msg in msgs:
                await self._slots.acquire()
                task = asyncio.create_task(self._run(msg))
                self._tasks.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _run(self, msg: Msg) -> None:
        self.received += 1
        try:
            message: M = decode(msg.data, self.message_type, msg.headers)
        except MessageError as e:
            await self._dead_letter(msg, e.code, str(e))
            return
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
                    await msg.nak(delay=min(self.max_backoff_s, self.backoff_s * 2**delivered))
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
        with contextlib.suppress(Exception):
            await msg.term()
