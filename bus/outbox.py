"""Events published without waiting on each ack, settled before anything causally later (PERF-2).

`publish` sends an event to JetStream and returns at once; a small confirmer task waits for the
stream's ack (or re-publishes with the same `Nats-Msg-Id`, which the stream de-duplicates, and
in the end leaves the event in the ledger only — as before). `settle` waits for every event the
calling task published and is called before that task sends anything a later step can react to:
a command (bus.client.request), a reply (bus.service), a work notice. So an event is stored in
its stream before any step that follows it can start, wherever that step runs, and events stay
ordered per novel exactly as when every publish waited for its ack — with one wait per step
instead of one per event, and usually none, because the acks arrive while the step works on.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from nats.js import JetStreamContext

from novelbus.bus import tally

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 5.0
REPUBLISH_ATTEMPTS = 4

# The calling task's unconfirmed publishes (tasks are weakly held: a finished task's list goes).
_pending: weakref.WeakKeyDictionary[asyncio.Task[Any], list[asyncio.Task[None]]] = weakref.WeakKeyDictionary()
_confirmers: set[asyncio.Task[None]] = set()  # strong references until each confirmer is done


async def publish(js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str], *,
                  what: str = "event") -> None:
    """Send without waiting for the ack; `settle()` in the same task waits for it."""
    tally.count("publishes")
    try:
        ack: asyncio.Future[Any] | None = await js.publish_async(subject, data, headers=headers,
                                                                 wait_stall=ACK_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - NATS away or too many in flight: the confirmer retries
        log.debug("%s publish on %s deferred (%s)", what, subject, type(e).__name__)
        ack = None
    confirmer = asyncio.create_task(_confirm(js, ack, subject, data, headers, what))
    _confirmers.add(confirmer)
    confirmer.add_done_callback(_confirmers.discard)
    task = asyncio.current_task()
    if task is not None:
        _pending.setdefault(task, []).append(confirmer)


async def settle() -> None:
    """Wait until every publish of the calling task is acked (or given up on and logged)."""
    task = asyncio.current_task()
    waiting = _pending.pop(task, None) if task is not None else None
    if waiting:
        tally.count("publish_waits")
        with tally.span("event acks"):
            await asyncio.gather(*waiting, return_exceptions=True)


async def _confirm(js: JetStreamContext, ack: asyncio.Future[Any] | None, subject: str, data: bytes,
                   headers: dict[str, str], what: str) -> None:
    if ack is not None:
        try:
            await asyncio.wait_for(ack, ACK_TIMEOUT_S)
            return
        except Exception:  # noqa: BLE001 - no ack in time: publish again (de-duplicated by its id)
            pass
    for attempt in range(REPUBLISH_ATTEMPTS):
        try:
            await js.publish(subject, data, headers=headers, timeout=ACK_TIMEOUT_S)
            return
        except Exception as e:  # noqa: BLE001 - NATS away: retry, then keep the ledger row
            if attempt == REPUBLISH_ATTEMPTS - 1:
                log.warning("%s %s kept in the ledger only (%s)", what, headers.get("Nats-Msg-Id", ""),
                            type(e).__name__)
            else:
                await asyncio.sleep(0.2 * (attempt + 1))
