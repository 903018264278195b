"""Stopping tasks for sure: cancel again until each has ended (every stop path uses this).

One `task.cancel()` is not enough on Python 3.11: an `asyncio.wait_for` inside the task (nats-py's
`fetch` and `next_msg`, request/reply, asyncpg) returns its result and drops the cancel when its
inner step finishes in the same loop iteration as the cancel arrives. A loop that then goes on
(`while True: fetch …`) never ends, and a stop that awaits it waits forever. So a stop cancels,
waits, and cancels again whatever is still running, up to a bound. The wait between cancels
leaves a task time for its own clean-up (a driver's cancelled flow settles its claim within
5 s), so by default it is longer than that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

RECANCEL_EVERY_S = 6.0  # longer than any clean-up a cancelled task of ours runs (≤ 5 s)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, grace_s: float | None = None,
                          recancel_s: float = RECANCEL_EVERY_S) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` and wait until they end, cancelling again every `recancel_s` those still running.

    Returns the tasks still running after `grace_s` (None: wait as long as it takes). Their
    results and exceptions are consumed; the caller's own cancel still interrupts the wait."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    deadline = None if grace_s is None else time.monotonic() + grace_s
    while pending:
        for task in pending:
            task.cancel()
        wait_s = recancel_s if deadline is None else min(recancel_s, deadline - time.monotonic())
        if wait_s <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=wait_s)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" noise
    return pending
