"""bus.outbox on real NATS (BUS-3, REL-2, REL-6, PERF-2): events go out without a wait per ack,
`settle` returns once every event of the calling task is stored, in the order published; a late
ack is made good by a re-publish the stream de-duplicates (stored once); an ack that says no is
re-published and in the end left to the ledger (logged), without hanging `settle`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import urlsplit

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from novelbus.bus import outbox, tally
from novelbus.bus.client import connect
from novelbus.bus.streams import ensure_streams
from novelbus.messages.subjects import Subjects
from tests.waiting import wait_until


@pytest.fixture
async def bus(nats_url: str, namespace: str) -> AsyncIterator[tuple[NATS, JetStreamContext, Subjects]]:
    nc = await connect(nats_url, name="outbox-test")
    try:
        js = nc.jetstream()
        s = Subjects(namespace)
        await ensure_streams(js, s, replicas=1)
        yield nc, js, s
    finally:
        for name in (s.work_stream, s.events_stream, s.dlq_stream):
            try:
                await js.delete_stream(name)
            except Exception:  # noqa: BLE001 - best effort
                pass
        await nc.close()


async def _stored(js: JetStreamContext, s: Subjects, novel: str) -> list[str]:
    """Message ids stored for `novel` in the events stream, in stream order."""
    sub = await js.subscribe(s.events_of(novel), stream=s.events_stream, ordered_consumer=True)
    ids: list[str] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                return ids
            ids.append((msg.headers or {}).get("Nats-Msg-Id", ""))
    finally:
        await sub.unsubscribe()


async def _publish(nc: NATS, js: JetStreamContext, s: Subjects, novel: str, ids: list[str]) -> None:
    for mid in ids:
        await outbox.publish(nc, js, s.event(novel, "tool.started"), b"{}", {"Nats-Msg-Id": mid})


async def test_settle_returns_with_every_event_stored_in_publish_order(
        bus: tuple[NATS, JetStreamContext, Subjects]) -> None:
    """BUS-3"""
    nc, js, s = bus
    await outbox.settle()  # nothing pending: returns at once

    async def flow(novel: str) -> None:
        for step in range(5):
            await _publish(nc, js, s, novel, [f"{novel}-{step}-{i}" for i in range(3)])
            await outbox.settle()
            assert not outbox._pending.get(asyncio.current_task())  # type: ignore[arg-type]

    await asyncio.gather(*(flow(f"n{k}") for k in range(4)))  # concurrent flows, each its own settle
    for k in range(4):
        assert await _stored(js, s, f"n{k}") == [f"n{k}-{step}-{i}" for step in range(5) for i in range(3)]
    assert not outbox._acks[nc].waiting  # every ack matched its event


async def test_acks_come_to_the_connections_own_inbox(
        bus: tuple[NATS, JetStreamContext, Subjects], nats_url: str) -> None:
    """CLM-5: With a user, replies go to `_INBOX_<user>.>`, which only that user may read (CLM-5)."""
    nc, js, s = bus
    await _publish(nc, js, s, "inbox", ["inbox-1"])
    await outbox.settle()
    user = urlsplit(nats_url).username
    assert user, "the embedded NATS requires credentials (REL-11)"
    assert outbox._acks[nc].prefix.startswith(f"_INBOX_{user}."), outbox._acks[nc].prefix


async def test_a_late_ack_is_made_good_by_a_republish_stored_once(
        bus: tuple[NATS, JetStreamContext, Subjects], monkeypatch: pytest.MonkeyPatch) -> None:
    """REL-2"""
    nc, js, s = bus
    monkeypatch.setattr(outbox, "ACK_TIMEOUT_S", 0.0)  # every ack counts as late: each event is re-published
    ids = [f"late-{i}" for i in range(4)]
    await _publish(nc, js, s, "late", ids)
    events = list(outbox._pending[asyncio.current_task()])  # type: ignore[index]
    await outbox.settle()
    assert all(e.retry is not None and e.retry.done() for e in events)  # the late path ran for each
    assert await _stored(js, s, "late") == ids  # de-duplicated by Nats-Msg-Id: once each, in order


async def test_an_ack_that_says_no_is_retried_then_left_to_the_ledger(
        bus: tuple[NATS, JetStreamContext, Subjects], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """REL-6"""
    nc, js, s = bus
    monkeypatch.setattr(outbox, "REPUBLISH", replace(outbox.REPUBLISH, maximum_attempts=2))
    monkeypatch.setattr(outbox, "ACK_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="novelbus.bus.outbox"):
        # no stream stores this subject: the server answers 503 (no responders) at once
        await outbox.publish(nc, js, f"{s.namespace}nowhere.x", b"{}", {"Nats-Msg-Id": "lost-1"}, what="event x")
        event = outbox._pending[asyncio.current_task()][0]  # type: ignore[index]
        async with asyncio.timeout(10):  # (not wait_for: settle must run in this task)
            await outbox.settle()
    with pytest.raises(outbox.AckFailed):
        event.ack.result()
    assert any("lost-1 kept in the ledger only" in r.getMessage() for r in caplog.records)


async def test_a_settle_counts_as_blocked_only_when_an_ack_is_still_in_flight(
        bus: tuple[NATS, JetStreamContext, Subjects]) -> None:
    """PERF-1: `publish_waits` counts settles with events to confirm; `ack_blocked` those that really waited
    (PERF-2: how many serial ack waits a unit has, beside how many settles)."""
    nc, js, s = bus

    def counted(kind: str) -> int:
        return sum(n for (k, _), n in tally.snapshot().items() if k == kind)

    waits, blocked = counted("publish_waits"), counted("ack_blocked")
    await _publish(nc, js, s, "blk", ["blk-1"])
    await outbox.settle()  # nothing suspended since the publish: it is not even sent, its ack cannot be in
    await _publish(nc, js, s, "blk", ["blk-2"])
    event = outbox._pending[asyncio.current_task()][-1]  # type: ignore[index]
    await wait_until(event.ack.done, 10, "the ack of blk-2")  # the ack comes before the settle
    await outbox.settle()
    assert (counted("publish_waits") - waits, counted("ack_blocked") - blocked) == (2, 1)


async def test_settle_waits_for_the_republish_of_an_ack_that_failed_just_before_it(
        bus: tuple[NATS, JetStreamContext, Subjects]) -> None:
    """REL-6: An ack that fails in the same loop iteration as `settle` starts (its done callback not yet
    run) is re-published before `settle` returns — not after the step that follows it."""
    nc, js, s = bus
    await _publish(nc, js, s, "n-race", ["n-race-0"])
    event = outbox._pending[asyncio.current_task()][-1]  # type: ignore[index]
    event.ack.set_exception(outbox.AckFailed("test: said no"))  # callbacks scheduled, not yet run
    await outbox.settle()
    assert event.retry is not None and event.retry.done() and event.retry.exception() is None
    assert await _stored(js, s, "n-race") == ["n-race-0"]  # published and re-published: stored once
