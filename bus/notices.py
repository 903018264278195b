"""Work notices on the durable work stream: the one way anything publishes one (BUS-2, REL-2)."""

from __future__ import annotations

import secrets
from typing import Protocol

from nats.js import JetStreamContext

from novelbus.bus import outbox, tally
from novelbus.bus.codec import encode
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice


class NoticeTarget(Protocol):
    """Anything holding a JetStream context and the subjects (an ActorContext, a CLI context)."""

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def subjects(self) -> Subjects: ...


async def publish_notice(target: NoticeTarget, novel_id: str, *, reason: str, dedupe: str | None = None) -> str:
    """Publish a durable work notice and return its id.

    The message id is `<novel>:<notice id>`, so the stream's duplicate window drops a repeat; a
    caller passing `dedupe` (e.g. `after-<unit>-<claim>`) makes a repeated publish a no-op."""
    notice_id = dedupe or f"notice-{secrets.token_hex(8)}"
    data, headers = encode(WorkNotice(novel_id=novel_id, notice_id=notice_id, reason=reason))
    headers["Nats-Msg-Id"] = f"{novel_id}:{notice_id}"
    await outbox.settle()  # the flow's events are stored before the notice that follows them
    tally.count("publishes")
    tally.count("publish_waits")
    tally.count("ack_blocked")  # a notice's publish always waits for its ack
    with tally.span("notice publish"):
        await target.js.publish(target.subjects.work(novel_id), data, headers=headers)
    return notice_id
