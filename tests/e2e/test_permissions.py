"""OPS-3, CLM-5, REL-5: deploy/nats.conf gives every actor its own NATS user. Only the driver and
the writer runner may publish commit requests and only the claim manager may subscribe to them;
a refused publish never reaches anyone. With that configuration a whole novel still runs, each
actor on its own user."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import connected, running
from novelbus.bus.client import connect
from novelbus.bus.notices import publish_notice
from novelbus.infra.nats import EmbeddedNats
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.waiting import novel_stopped, wait_until

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats.conf"
USERS = ("driver", "claims", "packer", "writer", "verifier", "usage", "operator", "scheduler", "monitor")
COMMIT = "novelbus.cmd.commit.claims-0"


@pytest.fixture
async def secured(tmp_home: Path, server_tracker: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, str]]:
    """An embedded NATS started with deploy/nats.conf; returns user -> URL with its password."""
    passwords = {u: secrets.token_hex(12) for u in USERS}
    for user, password in passwords.items():
        monkeypatch.setenv(f"NOVELBUS_NATS_{user.upper()}_PASSWORD", password)
    server = EmbeddedNats(tmp_home / "nats", config_file=CONFIG)
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


async def test_only_driver_and_writer_publish_commits_only_claims_subscribes(secured: dict[str, str]) -> None:
    """OPS-3"""
    conns = {u: Conn() for u in USERS}
    ncs = {u: await c.open(secured[u], u) for u, c in conns.items()}
    try:
        got: list[bytes] = []

        async def on_commit(msg: Any) -> None:
            got.append(msg.data)

        await ncs["claims"].subscribe("novelbus.cmd.commit.*", queue="commit-claims-0", cb=on_commit)
        await settle(ncs["claims"])

        for user in ("packer", "verifier", "usage", "claims", "operator"):  # unauthorised: refused, undelivered
            await ncs[user].publish(COMMIT, f"forged by {user}".encode())
            await refused(conns[user], "permissions violation for publish", COMMIT)
        assert got == []

        for user in ("driver", "writer"):  # the two that may
            await ncs[user].publish(COMMIT, f"from {user}".encode())
            await settle(ncs[user])
            assert conns[user].errors == [], user
        await wait_until(lambda: len(got) >= 2, 5, lambda: f"both allowed commits delivered, got {got}")
        assert sorted(got) == [b"from driver", b"from writer"]

        for user in ("packer", "writer", "driver", "operator"):  # nobody else may listen to commits
            await ncs[user].subscribe("novelbus.cmd.commit.>")
            await refused(conns[user], "permissions violation for subscription")
        await ncs["usage"].subscribe("_INBOX_driver.>")  # nor read another actor's replies
        await refused(conns["usage"], "permissions violation for subscription")
    finally:
        for nc in ncs.values():
            with contextlib.suppress(Exception):
                await nc.close()


async def test_a_novel_runs_with_one_nats_user_per_actor(secured: dict[str, str], new_database: Any) -> None:
    """OPS-3"""
    dsn = await new_database()
    subjects = Subjects("")  # deploy/nats.conf names the production subjects
    async with contextlib.AsyncExitStack() as stack:
        for name in ("claims", "packer", "writer", "verifier", "usage", "driver"):
            await stack.enter_async_context(running(secured[name], dsn, names=(name,), subjects=subjects))
        ctx = await stack.enter_async_context(connected(secured["operator"], dsn, subjects=subjects, name="op"))
        nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
        novel_id = await store.create_novel(ctx.pool, nf)
        await publish_notice(ctx, novel_id, reason="test")
        await novel_stopped(ctx.pool, novel_id, 90)
        novel = await store.get_novel(ctx.pool, novel_id)
        assert novel.status == "finished", novel.pause_reason
        assert set((await store.count_commits_per_unit(ctx.pool, novel_id)).values()) == {1}
        info = await ctx.js.stream_info(subjects.events_stream)
        assert info.state.messages > 0  # events published under the actors' own users
