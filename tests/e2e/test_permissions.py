"""OPS-3, OPS-9, CLM-5, REL-5: the NATS configuration `bus.permissions` generates (committed as
deploy/nats.conf, tests/deploy/test_nats_permissions.py) gives every actor kind its own user. On a
real nats-server started with it: each command subject is served by one actor and sent only by
those that need it — only the writer runner publishes commit requests, only the claim manager
subscribes to them —, a refused publish never reaches anyone, no actor and not the operator may
delete a stream; and a whole novel still runs, each actor on its own user, the extractor and
the detector included."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import connected, running
from novelbus.bus.client import connect
from novelbus.bus.codec import encode
from novelbus.bus.consumer import DurablePullConsumer
from novelbus.bus.dead_letters import list_dead_letters, purge_novel, show_dead_letter
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.bus.permissions import USERS, nats_conf
from novelbus.bus.streams import WORK_MAX_DELIVER, driver_consumer_config, ensure_streams
from novelbus.infra.nats import EmbeddedNats
from novelbus.messages import events as ev
from novelbus.messages.subjects import ACTOR_NAMES, Subjects
from novelbus.messages.work import WorkNotice
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.waiting import novel_stopped, wait_until

COMMIT = "novelbus.cmd.commit.claims-0"
# What the design says (docs/operations.md), written out here rather than read from the generator:
# each command subject's one server, and the users that send it.
SERVER = {"novelbus.cmd.claims": "claims", "novelbus.cmd.claims.claims-0": "claims", COMMIT: "claims",
          "novelbus.cmd.packs": "packer", "novelbus.cmd.runs": "writer", "novelbus.cmd.verify": "verifier",
          "novelbus.cmd.usage": "usage", "novelbus.cmd.steer": "driver"}
SENDERS = {"novelbus.cmd.claims": {"driver"}, "novelbus.cmd.claims.claims-0": {"driver", "claims"},
           COMMIT: {"writer"}, "novelbus.cmd.packs": {"driver"}, "novelbus.cmd.runs": {"driver"},
           "novelbus.cmd.verify": {"driver", "claims"}, "novelbus.cmd.usage": {"driver"},
           "novelbus.cmd.steer": {"operator"}}


@pytest.fixture
async def secured(tmp_home: Path, server_tracker: Any,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, str]]:
    """An embedded NATS started with the generated configuration; returns user -> URL with its password."""
    passwords = {u: secrets.token_hex(12) for u in USERS}
    for user, password in passwords.items():
        monkeypatch.setenv(f"NOVELBUS_NATS_{user.upper()}_PASSWORD", password)
    config = tmp_home / "nats.conf"
    config.write_text(nats_conf(), encoding="utf-8")
    server = EmbeddedNats(tmp_home / "nats", config_file=config)
    await server.start()
    assert server.pid is not None
    server_tracker.add_pid(server.pid)
    try:
        host = server.url.removeprefix("nats://")
        yield {u: f"nats://{u}:{p}@{host}" for u, p in passwords.items()}
    finally:
        await server.stop()


class Conn:
    def __init__(self) -> None:
        self.errors: list[str] = []

    async def open(self, url: str, name: str) -> Any:
        async def on_error(e: Exception) -> None:
            self.errors.append(str(e).lower())

        self.nc = await connect(url, name=name, error_cb=on_error)
        return self.nc


async def settle(nc: Any) -> None:
    """Until the server has handled everything `nc` sent: it answers a flush's PING after the
    commands before it, and a refusal (-ERR) before that answer."""
    await nc.flush()


async def refused(conn: Conn, *needles: str) -> None:
    """Until the server's refusal naming every one of `needles` reached the connection's error callback."""
    await wait_until(lambda: any(all(n in e for n in needles) for e in conn.errors), 5,
                     lambda: f"a refusal naming {needles}; errors: {conn.errors}")


def refusals(conn: Conn, kind: str, subject: str) -> int:
    return sum(f"permissions violation for {kind}" in e and f'"{subject.lower()}"' in e for e in conn.errors)


async def test_each_actor_serves_only_its_commands_and_sends_only_those_it_needs(secured: dict[str, str]) -> None:
    """OPS-9, OPS-3, CLM-5: every actor kind's user may ensure the streams and subscribe to its own
    command subjects, and is refused another actor's; a request from each user that sends a
    command is answered by its server (allow_responses, private inboxes), every other user's
    publish to it is refused and reaches no one."""
    conns = {u: Conn() for u in USERS}
    ncs = {u: await c.open(secured[u], u) for u, c in conns.items()}
    try:
        for actor in ACTOR_NAMES:
            await ensure_streams(ncs[actor].jetstream(), Subjects(""), replicas=1)
        got: dict[str, list[bytes]] = {subject: [] for subject in SERVER}

        def answer(subject: str) -> Any:
            async def on_request(msg: Any) -> None:
                got[subject].append(msg.data)
                if msg.reply:
                    await msg.respond(b"served by " + SERVER[subject].encode())
            return on_request

        for subject, server in SERVER.items():
            for user in USERS:
                await ncs[user].subscribe(subject, cb=answer(subject) if user == server else None)
        for user in USERS:
            await settle(ncs[user])
        for user in USERS:  # every subscription but the server's own was refused
            for subject, server in SERVER.items():
                want = 0 if user == server else 1
                await wait_until(lambda u=user, s=subject, w=want: refusals(conns[u], "subscription", s) == w, 5,
                                 lambda u=user, s=subject: f"{u} subscribing to {s}: errors {conns[u].errors}")

        for subject, senders in SENDERS.items():
            for user in senders:
                reply = await ncs[user].request(subject, f"from {user}".encode(), timeout=5)
                assert reply.data == b"served by " + SERVER[subject].encode(), (user, subject)
            for user in set(USERS) - senders:
                await ncs[user].publish(subject, f"forged by {user}".encode())
                await refused(conns[user], "permissions violation for publish", f'"{subject}"')
            for user in USERS:
                await settle(ncs[user])
            assert sorted(got[subject]) == sorted(f"from {u}".encode() for u in senders), subject

        for user in USERS:  # nobody reads another user's replies
            other = "driver" if user != "driver" else "claims"
            await ncs[user].subscribe(f"_INBOX_{other}.>")
            await refused(conns[user], "permissions violation for subscription", f"_inbox_{other}.>")
    finally:
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()


async def test_no_actor_and_not_the_operator_may_delete_a_stream(secured: dict[str, str]) -> None:
    """OPS-9: the stream deletion request of every actor kind's user and of the operator is
    refused by the server, and every stream is still there."""
    s = Subjects("")
    conns = {u: Conn() for u in (*ACTOR_NAMES, "operator")}
    ncs = {u: await c.open(secured[u], u) for u, c in conns.items()}
    try:
        op_js = ncs["operator"].jetstream()
        await ensure_streams(op_js, s, replicas=1)
        for user, nc in ncs.items():
            for stream in (s.work_stream, s.events_stream, s.dlq_stream):
                await nc.publish(f"$JS.API.STREAM.DELETE.{stream}", b"", reply=nc.new_inbox())
                await refused(conns[user], "permissions violation for publish",
                              f"$js.api.stream.delete.{stream}".lower())
        for stream in (s.work_stream, s.events_stream, s.dlq_stream):
            assert (await op_js.stream_info(stream)).config.name == stream
    finally:
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()


async def test_the_driver_pulls_and_dead_letters_and_the_operator_reads_and_purges_under_their_users(
        secured: dict[str, str]) -> None:
    """OPS-9, OPS-11, OPS-12: the driver's user binds its durable work consumer, pulls and acks a
    scheduler's notice and dead-letters a malformed one; the operator's user reads the driver's
    consumer (status), replays the events stream, lists and shows the dead letter and purges the
    novel's messages (novel delete) — and may not delete the driver's consumer."""
    s = Subjects("")
    conns = {u: Conn() for u in ("driver", "scheduler", "operator")}
    ncs = {u: await c.open(secured[u], u) for u, c in conns.items()}
    consumer = None
    try:
        driver_js, op_js = ncs["driver"].jetstream(), ncs["operator"].jetstream()
        await ensure_streams(driver_js, s, replicas=1)
        handled: list[WorkNotice] = []

        async def handle(notice: WorkNotice) -> None:
            handled.append(notice)

        consumer = DurablePullConsumer(ncs["driver"], driver_js, stream=s.work_stream,
                                       config=driver_consumer_config(s), message_type=WorkNotice, handle=handle,
                                       dead_letter_subject=s.dead_letter("work"), max_deliver=WORK_MAX_DELIVER)
        await consumer.start()
        sched_js = ncs["scheduler"].jetstream()
        await sched_js.publish(s.work("n-op"), b"not a notice")
        data, headers = encode(WorkNotice(novel_id="n-op", notice_id="sched-op", reason="scheduled"))
        await sched_js.publish(s.work("n-op"), data, headers=headers)
        data, headers = encode(ev.NovelResumed(novel_id="n-op"))
        await driver_js.publish(s.event("n-op", "novel.resumed"), data, headers=headers)

        await wait_until(lambda: [n.notice_id for n in handled] == ["sched-op"], 10, lambda: f"handled {handled}")
        letters = await wait_until(lambda: list_dead_letters(op_js, s), 10, "the malformed notice dead-lettered")
        assert [(d.subject, d.reason) for d in letters] == [(s.work("n-op"), "bad-message")]
        assert (await show_dead_letter(op_js, s, letters[0].seq)).seq == letters[0].seq
        info = await op_js.consumer_info(s.work_stream, driver_consumer_config(s).durable_name or "")
        assert info.num_waiting >= 1  # `status`: a driver is listening
        async with EventFollower(ncs["operator"], s, novel_id="n-op", js=op_js, replay=True) as follower:
            first = await asyncio.wait_for(anext(aiter(follower)), 10)
        assert isinstance(first, ev.NovelResumed)

        removed = await purge_novel(op_js, s, "n-op")
        assert removed == {s.events_stream: 1, s.work_stream: 2, s.dlq_stream: 1}, removed
        assert await list_dead_letters(op_js, s) == []

        await ncs["operator"].publish(f"$JS.API.CONSUMER.DELETE.{s.work_stream}.driver", b"",
                                      reply=ncs["operator"].new_inbox())
        await refused(conns["operator"], "permissions violation for publish", "$js.api.consumer.delete")
        assert (await op_js.consumer_info(s.work_stream, "driver")).name == "driver"
        assert conns["driver"].errors == [] and conns["scheduler"].errors == []
    finally:
        if consumer is not None:
            await consumer.stop()
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()


async def test_a_novel_runs_with_one_nats_user_per_actor(secured: dict[str, str], new_database: Any) -> None:
    """OPS-3, OPS-9: each actor in its own connection with its own user, the operator creating and
    noticing the novel; it finishes with one commit per unit, and the roles running in the
    actors' processes (the extractor in the driver's, the detector in the verifier's) publish
    their events under those users."""
    dsn = await new_database()
    subjects = Subjects("")  # deploy/nats.conf names the production subjects
    async with contextlib.AsyncExitStack() as stack:
        for name in ("claims", "packer", "writer", "verifier", "usage", "driver"):
            await stack.enter_async_context(running(secured[name], dsn, names=(name,), subjects=subjects))
        ctx = await stack.enter_async_context(connected(secured["operator"], dsn, subjects=subjects, name="op"))
        nf = parse_novel_file(sample_novel_bytes())
        config = nf.config.model_copy(update={"extractor": "offline", "canonSource": "both", "detector": "offline"})
        nf = nf.model_copy(update={"novelId": None, "config": config})
        novel_id = await store.create_novel(ctx.pool, nf)
        await publish_notice(ctx, novel_id, reason="test")
        await novel_stopped(ctx.pool, novel_id, 90)
        novel = await store.get_novel(ctx.pool, novel_id)
        assert novel.status == "finished", novel.pause_reason
        assert set((await store.count_commits_per_unit(ctx.pool, novel_id)).values()) == {1}
        info = await ctx.js.stream_info(subjects.events_stream, subjects_filter=subjects.events_of(novel_id))
        types = {subject.split(".", 3)[3] for subject in info.state.subjects or {}}
        for event in (ev.UnitCommitted, ev.CanonExtracted, ev.CandidateDetected, ev.NovelFinished):
            assert event.__struct_config__.tag in types, (event, sorted(types))
