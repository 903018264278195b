"""REL-11: the embedded NATS binds loopback and requires credentials generated per home, kept in
files only their owner may read; a connection without them is refused."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError

from novelbus.bus.client import connect
from novelbus.infra import EmbeddedNats


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_embedded_nats_refuses_a_connection_without_the_home_credentials(
        tmp_home: Path, server_tracker: object) -> None:
    """REL-11"""
    server = EmbeddedNats(tmp_home / "nats")
    await server.start()
    try:
        assert server.pid is not None
        server_tracker.add_pid(server.pid)  # type: ignore[attr-defined]
        assert server.address.startswith("nats://127.0.0.1:")
        creds = tmp_home / "nats" / "credentials.json"
        auth = tmp_home / "nats" / "auth.conf"
        assert _mode(creds) == 0o600 and _mode(auth) == 0o600 and _mode(tmp_home / "nats") == 0o700
        password = json.loads(creds.read_text())["password"]
        assert len(password) >= 32 and password in server.url

        # the URL every command and actor is handed works
        nc = await connect(server.url, name="test-with-credentials")
        await nc.publish("probe", b"1")
        await nc.flush()
        await nc.close()
        # without credentials, or with a wrong password: refused
        for url in (server.address, server.url.replace(password, "x" * 40)):
            with pytest.raises((NatsError, OSError)) as refused:
                await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)
            assert "authorization" in str(refused.value).lower() or isinstance(refused.value, NatsError)
    finally:
        await server.stop()

    # the same home keeps its credentials across restarts; another home gets its own
    again = EmbeddedNats(tmp_home / "nats")
    other = EmbeddedNats(tmp_home / "other-nats")
    await again.start()
    await other.start()
    try:
        for s in (again, other):
            assert s.pid is not None
            server_tracker.add_pid(s.pid)  # type: ignore[attr-defined]
        assert password in again.url and password not in other.url
    finally:
        await again.stop()
        await other.stop()
