"""A command service: one subject, one queue group, a handler per message type (BUS-2, BUS-4).

Decoding and validation happen once, here, at the edge; handlers get typed messages. Every
failure becomes an ErrorReply with a stable code, is counted, and the service keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from novelbus.bus import logs, metrics, outbox, tally
from novelbus.bus.codec import MessageError, decode, encode
from novelbus.messages.errors import INTERNAL, ErrorReply

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[msgspec.Struct]]


def error_reply_for(exc: BaseException) -> ErrorReply:
    """The one place that maps exceptions to stable error codes."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        missing = getattr(exc, "missing_blocks", None)  # PACK-4: the error's data travels as a field
        blocks = [str(b) for b in missing] if isinstance(missing, list) else []
        return ErrorReply(code=code, message=str(exc)[:500], missing_blocks=blocks)
    return ErrorReply(code=INTERNAL, message=f"internal error ({type(exc).__name__})")


class CommandService:
    def __init__(
        self, nc: NATS, subject: str, handlers: dict[type, Handler], *,
        queue: str, max_concurrency: int = 64,
    ) -> None:
        self.nc = nc
        self.subject = subject
        self.queue = queue
        self.label = queue  # who counts this service's round trips (bus.tally); its actor's name once started
        self.handlers = handlers
        self.kind: Any = functools.reduce(operator.or_, handlers.keys())
        self.stats: Counter[str] = Counter()
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._hops: dict[str, Any] = {}  # request type -> its hop-latency histogram (OPS-6)

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.subject, queue=self.queue, cb=self._on_message)
        await self.nc.flush()  # the server knows the subscription before anyone is told we are ready
        metrics.BINDINGS.add(self)  # OPS-7: readiness asks every started service and consumer

    @property
    def bound(self) -> bool:
        """Subscribed to its subject (OPS-7)."""
        return self._sub is not None

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed
                pass
            self._sub = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_message(self, msg: Msg) -> None:
        # Handlers run concurrently (bounded); the subscription callback must not block.
        await self._slots.acquire()
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _serve(self, msg: Msg) -> None:
        tally.actor.set(self.label)  # this task's own context: counts go to the serving actor
        started = time.perf_counter()
        served = "undecodable"
        try:
            try:
                request = decode(msg.data, self.kind, msg.headers)
                served = type(request).__name__
                logs.bind(request)  # OPS-8: this task's log lines carry the unit's correlation id
                novel_id = getattr(request, "novel_id", None) if tally.tracing else None
                tally.trace_key.set(f"{novel_id}@{self.label}" if isinstance(novel_id, str) else None)
                with tally.span(f"serve {type(request).__name__}"):
                    reply: msgspec.Struct = await self.handlers[type(request)](request)
                self.stats["served"] += 1
            except MessageError as e:
                self.stats[e.code] += 1
                reply = ErrorReply(code=e.code, message=str(e)[:500])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes an error reply
                reply = error_reply_for(e)
                self.stats[reply.code] += 1
                if reply.code == INTERNAL:
                    log.exception("handler failed on %s", self.subject)
            try:
                await outbox.settle()  # the handler's events are stored before its reply leaves
            except Exception as e:  # noqa: BLE001 - an event not written: the reply says so
                reply = error_reply_for(e)
                self.stats[reply.code] += 1
            if msg.reply:
                data, headers = encode(reply)
                await self.nc.publish(msg.reply, data, headers=headers)
                tally.mark("replied")
            elapsed = time.perf_counter() - started
            hop = self._hops.get(served)
            if hop is None:  # OPS-6: one labelled child per request type, looked up once
                hop = self._hops[served] = metrics.HOP_SECONDS.labels(self.label, served)
            hop.observe(elapsed)
            log.debug("%s served %s in %.1f ms: %s", self.label, served, elapsed * 1e3,
                      getattr(reply, "code", "ok"))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a broken reply path must not kill the service
            log.exception("could not reply on %s", self.subject)
