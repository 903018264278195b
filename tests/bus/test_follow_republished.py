"""BUS-3, REL-6, REL-7 on real NATS: an event published again under its message id (a late or lost
ack, a once-only event re-emitted) is stored once by the stream, and a live follower — a core
subscription, which receives every publish — hands it on once too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from novelbus.bus import events as follow
from novelbus.bus.client import connect
from novelbus.bus.codec import encode
from novelbus.bus.events import EventFollower
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from tests.waiting import wait_until


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await connect(nats_url, name="follow-test")
    try:
        yield conn
    finally:
        await conn.close()


async def _publish(nc: NATS, s: Subjects, event: ev.NovelEvent, msg_id: str | None) -> None:
    data, headers = encode(event)
    if msg_id is not None:
        headers["Nats-Msg-Id"] = msg_id
    await nc.publish(s.event(event.novel_id, "chapter.completed"), data, headers=headers)


async def _follow(nc: NATS, s: Subjects, sends: list[tuple[str, str | None]]) -> tuple[list[str], int]:
    seen: list[str] = []

    async def on_event(event: ev.NovelEvent) -> None:
        assert isinstance(event, ev.ChapterCompleted)
        seen.append(event.chapter_id)

    follower = EventFollower(nc, s, novel_id="n-1", types=(ev.ChapterCompleted,), on_event=on_event)
    async with follower:
        for chapter, msg_id in sends:
            await _publish(nc, s, ev.ChapterCompleted(novel_id="n-1", chapter_id=chapter), msg_id)
        await nc.flush()
        await wait_until(lambda: len(seen) + follower.duplicates >= len(sends), 10,
                         lambda: f"{len(sends)} sends back, {len(seen)} seen and {follower.duplicates} duplicates")
    return seen, follower.duplicates


async def test_a_live_follower_hands_on_a_republished_event_once(nc: NATS, namespace: str) -> None:
    """BUS-3"""
    s = Subjects(namespace)
    sends = [("ch-1", f"{namespace}ev-1"), ("ch-1", f"{namespace}ev-1"), ("ch-2", f"{namespace}ev-2"),
             ("ch-1", f"{namespace}ev-1"), ("ch-3", None), ("ch-3", None)]
    seen, duplicates = await _follow(nc, s, sends)
    # ev-1 once, ev-2 once; messages without an id are never taken for repeats
    assert seen == ["ch-1", "ch-2", "ch-3", "ch-3"]
    assert duplicates == 2


async def test_a_follower_forgets_ids_beyond_its_window(nc: NATS, namespace: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """BUS-3"""
    monkeypatch.setattr(follow, "RECENT_IDS", 2)
    s = Subjects(namespace)
    sends = [("ch-1", "a"), ("ch-2", "b"), ("ch-3", "c"), ("ch-1", "a"), ("ch-3", "c")]
    seen, duplicates = await _follow(nc, s, sends)
    # "a" fell out of the last two ids when "c" came, so its late repeat passes; "c" is still known
    assert seen == ["ch-1", "ch-2", "ch-3", "ch-1"]
    assert duplicates == 1
