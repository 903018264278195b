"""The durable consumer's pull (BUS-2, REL-6, PERF-2): one open pull request serves many
deliveries, an expired request is renewed, and every message is still handled and acked once."""

from __future__ import annotations

import asyncio

import nats
from nats.js import JetStreamContext

from novelbus.bus.codec import encode
from novelbus.bus.consumer import DurablePullConsumer
from novelbus.bus.streams import driver_consumer_config, ensure_streams
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice
from tests.waiting import arrives, wait_until


async def _publish(js: JetStreamContext, s: Subjects, i: int) -> None:
    data, headers = encode(WorkNotice(novel_id="n-pull", notice_id=f"notice-{i}", reason="test"))
    headers["Nats-Msg-Id"] = f"n-pull:notice-{i}"
    await js.publish(s.work("n-pull"), data, headers=headers)


async def _pending(js: JetStreamContext, s: Subjects) -> tuple[int, int]:
    info = await js.consumer_info(s.work_stream, "driver")
    return info.num_pending, info.num_ack_pending


async def test_one_pull_request_serves_many_deliveries(nats_url: str, namespace: str) -> None:
    """BUS-2, PERF-2: 20 notices, each published after the previous one was handled (the driver's pattern): all
    handled once and acked, with 2 pull requests (32, topped up at half) — not one per message."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        s = Subjects(namespace)
        await ensure_streams(js, s, replicas=1)
        handled: list[str] = []
        done = asyncio.Event()

        async def handle(notice: WorkNotice) -> None:
            handled.append(notice.notice_id)
            done.set()

        consumer: DurablePullConsumer[WorkNotice] = DurablePullConsumer(
            nc, js, stream=s.work_stream, config=driver_consumer_config(s), message_type=WorkNotice,
            handle=handle, dead_letter_subject=s.dead_letter("work"), max_deliver=3, fetch_timeout_s=0.2)
        await consumer.start()
        try:
            for i in range(20):
                done.clear()
                await _publish(js, s, i)
                await arrives(done.wait(), 5, f"notice-{i} handled")

            async def acked() -> bool:
                return await _pending(js, s) == (0, 0)

            await wait_until(acked, 5, "the last notice acked")
            assert handled == [f"notice-{i}" for i in range(20)]
            assert consumer.pull_requests == 2, consumer.pull_requests
            assert 0 < consumer.waiting <= consumer.batch
        finally:
            await consumer.stop()
    finally:
        await nc.close()


async def test_an_expired_pull_request_is_renewed(nats_url: str, namespace: str) -> None:
    """REL-6, PERF-2: A pull request that expires (408) is asked again: a notice published after several
    expiries is still handled at once; the count of open asks stays within the batch."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        s = Subjects(namespace)
        await ensure_streams(js, s, replicas=1)
        handled: list[str] = []
        done = asyncio.Event()

        async def handle(notice: WorkNotice) -> None:
            handled.append(notice.notice_id)
            done.set()

        consumer: DurablePullConsumer[WorkNotice] = DurablePullConsumer(
            nc, js, stream=s.work_stream, config=driver_consumer_config(s), message_type=WorkNotice,
            handle=handle, dead_letter_subject=s.dead_letter("work"), max_deliver=3, fetch_timeout_s=0.2,
            pull_expires_s=0.8, pull_heartbeat_s=0.2)
        await consumer.start()
        try:
            await wait_until(lambda: consumer.pull_requests >= 3, 10,
                             lambda: f"three expired pull requests renewed, {consumer.pull_requests} asked")
            assert consumer.waiting <= consumer.batch
            await _publish(js, s, 1)
            await arrives(done.wait(), 1.0, "the notice after the expiries handled at once")
            assert handled == ["notice-1"]
        finally:
            await consumer.stop()
    finally:
        await nc.close()
