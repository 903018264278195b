"""OPS-9: deploy/nats.conf's scheduler and monitor users. The scheduler publishes work notices and
reads no event; the monitor reads events (live and replayed from the stream) and can neither send
a steering request nor delete a stream."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from nats.js.api import DeliverPolicy
from nats.js.errors import Error as JetStreamError

from novelbus.bus.codec import encode
from novelbus.bus.streams import ensure_streams
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice
from tests.e2e.test_permissions import Conn, refused, secured, settle  # noqa: F401 - `secured` is the fixture

S = Subjects("")  # deploy/nats.conf names the production subjects


async def test_monitor_reads_events_but_cannot_steer_or_delete_a_stream_and_scheduler_only_publishes_notices(
        secured: dict[str, str]) -> None:  # noqa: F811 - the fixture imported above
    """OPS-9: the scheduler's notice is accepted into the work stream; its subscription to events
    is refused. The monitor gets a live event and replays it from the stream; its steering request,
    its work notice and its stream deletion are refused, and the stream is still there."""
    conns = {u: Conn() for u in ("operator", "driver", "scheduler", "monitor")}
    ncs = {u: await c.open(secured[u], u) for u, c in conns.items()}
    try:
        op_js = ncs["operator"].jetstream()
        await ensure_streams(op_js, S, replicas=1)

        live: list[Any] = []

        async def on_event(msg: Any) -> None:
            live.append(msg)

        await ncs["monitor"].subscribe(S.events_all, cb=on_event)
        await settle(ncs["monitor"])
        data, headers = encode(ev.NovelResumed(novel_id="n-perm"))
        await ncs["driver"].jetstream().publish(S.event("n-perm", "novel.resumed"), data, headers=headers)

        data, headers = encode(WorkNotice(novel_id="n-perm", notice_id="sched-1", reason="scheduled"))
        ack = await ncs["scheduler"].jetstream().publish(S.work("n-perm"), data, headers=headers)
        assert ack.stream == S.work_stream and ack.seq >= 1
        await ncs["scheduler"].subscribe(S.events_all)
        await refused(conns["scheduler"], "permissions violation for subscription", S.events_all)

        mon_js = ncs["monitor"].jetstream()
        sub = await mon_js.subscribe(S.events_all, stream=S.events_stream, ordered_consumer=True,
                                     deliver_policy=DeliverPolicy.ALL)
        replayed = await sub.next_msg(timeout=10)
        assert replayed.subject == S.event("n-perm", "novel.resumed")
        await sub.unsubscribe()
        assert [m.subject for m in live] == [S.event("n-perm", "novel.resumed")]

        await ncs["monitor"].publish(S.steer, b"{}")
        await refused(conns["monitor"], "permissions violation for publish", S.steer)
        await ncs["monitor"].publish(S.work("n-perm"), b"{}")
        await refused(conns["monitor"], "permissions violation for publish", S.work("n-perm"))
        with pytest.raises((JetStreamError, TimeoutError)):
            await mon_js.delete_stream(S.events_stream)
        await refused(conns["monitor"], "permissions violation for publish", f"$js.api.stream.delete.{S.events_stream}".lower())
        assert (await op_js.stream_info(S.events_stream)).state.messages >= 1  # still there
    finally:
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()

