"""A stop ends what it stops, even when a cancel gets lost (REL-6: a stopping process does not hang).

Python 3.11's `asyncio.wait_for` drops a cancel that lands as its inner step finishes; nats-py's
`fetch` is built on it. A pull loop that lost its cancel would fetch on forever, and a stop
that awaits it would hang.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from novelbus.bus.consumer import DurablePullConsumer
from novelbus.bus.streams import driver_consumer_config, ensure_streams
from novelbus.bus.tasks import cancel_and_wait
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice
from tests.waiting import arrives


async def _deaf_once(ended: list[str]) -> None:
    """Swallows the first cancel (as the 3.11 wait_for race does), then waits like a loop would."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("ended")


async def test_cancel_and_wait_cancels_again_a_task_that_lost_its_cancel() -> None:
    """REL-6"""
    ended: list[str] = []
    task = asyncio.create_task(_deaf_once(ended))
    await asyncio.sleep(0)
    stuck = await asyncio.wait_for(cancel_and_wait([task], recancel_s=0.05), 5)
    assert stuck == set() and task.cancelled() and ended == ["ended"]


async def test_cancel_and_wait_gives_up_after_its_grace_and_says_which() -> None:
    """REL-6"""
    async def deaf() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(deaf())
    await asyncio.sleep(0)
    stuck = await cancel_and_wait([task], grace_s=0.3, recancel_s=0.05)
    assert stuck == {task} and not task.done()
    task.get_coro().close()  # type: ignore[union-attr]  # the deaf coroutine, closed by force
    await asyncio.sleep(0)


async def test_a_consumer_stops_although_its_fetch_swallowed_the_cancel(nats_url: str, namespace: str) -> None:
    """REL-6"""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        s = Subjects(namespace)
        await ensure_streams(js, s, replicas=1)

        async def handle(_: WorkNotice) -> None:
            return None

        consumer: DurablePullConsumer[WorkNotice] = DurablePullConsumer(
            nc, js, stream=s.work_stream, config=driver_consumer_config(s), message_type=WorkNotice,
            handle=handle, dead_letter_subject=s.dead_letter("work"), max_deliver=3, fetch_timeout_s=0.2)
        await consumer.start()
        assert consumer._sub is not None
        real_next = consumer._next_message
        swallowed: list[int] = []
        asking = asyncio.Event()

        async def next_message(*args: Any, **kwargs: Any) -> Any:
            asking.set()
            try:
                return await real_next(*args, **kwargs)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(1)
                return None  # what wait_for returns when the inner step finished with the cancel

        consumer._next_message = next_message  # type: ignore[method-assign]
        await arrives(asking.wait(), 10, "the pull loop asking for a message")  # it waits on its open pull request
        stopping = asyncio.create_task(consumer.stop())
        done, _ = await asyncio.wait([stopping], timeout=10)  # not wait_for: its cancel would help the stop
        if not done:
            await cancel_and_wait([stopping], recancel_s=0.1)
        assert done, "the consumer's stop hung: its pull loop lost the cancel and fetched on"
        assert swallowed == [1]
        assert consumer._loop_task is not None and consumer._loop_task.done()
    finally:
        await nc.close()
