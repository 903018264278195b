"""The embedded PostgreSQL binds loopback and requires a password generated per data directory
(as REL-11 does for NATS), kept in a file only its owner may read; a connection without it, or
with a wrong one, is refused; the password never reaches a log line the project writes."""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from novelbus.infra import Infrastructure, ServerStartError, dsn_with_database, redact_url

_REFUSED = (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _without_password(dsn: str, password: str | None = None) -> str:
    parts = urlsplit(dsn)
    auth = parts.username if password is None else f"{parts.username}:{password}"
    return f"{parts.scheme}://{auth}@{parts.hostname}:{parts.port}{parts.path}"


async def _select_one(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


async def test_embedded_postgres_refuses_connections_without_the_home_password(
        tmp_home: Path, server_tracker: object, caplog: pytest.LogCaptureFixture) -> None:
    """REL-11"""
    caplog.set_level(logging.DEBUG)
    lines: list[str] = []
    async with Infrastructure(home=tmp_home, nats_url="nats://127.0.0.1:1", fast=True,
                              log=lines.append, environ={}) as infra:
        assert infra.postgres is not None and infra.postgres.pid is not None
        server_tracker.add_pid(infra.postgres.pid)  # type: ignore[attr-defined]
        pwfile = tmp_home / "pg" / "password"
        assert _mode(pwfile) == 0o600
        password = pwfile.read_text().strip()
        assert len(password) >= 32
        dsn = infra.database_url
        assert urlsplit(dsn).password == password and urlsplit(dsn).hostname == "127.0.0.1"

        # the DSN the infra hands out works, and so does one derived for another database
        assert await _select_one(dsn) == 1
        assert await _select_one(dsn_with_database(dsn, "postgres")) == 1
        assert await _select_one(infra.admin_database_url) == 1

        # without the password, and with a wrong one: refused
        for bad in (_without_password(dsn), _without_password(dsn, "wrong-" + password[:8])):
            with pytest.raises(_REFUSED):
                await _select_one(bad)
        hba = (tmp_home / "pg" / "data" / "pg_hba.conf").read_text()
        rules = [ln.split() for ln in hba.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert rules and all(r[-1] == "scram-sha-256" for r in rules)
    # no log line the project writes holds the password (redacted instead)
    assert any(redact_url(dsn) in line for line in lines)
    written = "\n".join(lines + [r.getMessage() for r in caplog.records])
    assert password not in written
    assert password not in (tmp_home / "pg" / "postgres.log").read_text(errors="replace")
    assert not (tmp_home / "pg" / ".initdb-pwfile").exists()


async def test_a_data_dir_initialised_with_trust_is_migrated_keeping_its_data(
        tmp_home: Path, server_tracker: object) -> None:
    """REL-11"""
    async with Infrastructure(home=tmp_home, nats_url="nats://127.0.0.1:1", fast=True,
                              environ={}) as infra:
        assert infra.postgres is not None and infra.postgres.pid is not None
        server_tracker.add_pid(infra.postgres.pid)  # type: ignore[attr-defined]
        conn = await asyncpg.connect(infra.database_url)
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before')")
        await conn.close()
    # What an earlier version left: pg_hba.conf trusting everyone, no password file.
    hba = tmp_home / "pg" / "data" / "pg_hba.conf"
    hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
    old_password = (tmp_home / "pg" / "password").read_text().strip()
    (tmp_home / "pg" / "password").unlink()

    async with Infrastructure(home=tmp_home, nats_url="nats://127.0.0.1:1", fast=True,
                              environ={}) as infra:
        assert infra.postgres is not None and infra.postgres.pid is not None
        server_tracker.add_pid(infra.postgres.pid)  # type: ignore[attr-defined]
        password = (tmp_home / "pg" / "password").read_text().strip()
        assert password != old_password and _mode(tmp_home / "pg" / "password") == 0o600
        conn = await asyncpg.connect(infra.database_url)
        assert await conn.fetchval("SELECT v FROM kept") == "before"
        await conn.close()
        with pytest.raises(_REFUSED):
            await _select_one(_without_password(infra.database_url))
        with pytest.raises(_REFUSED):
            await _select_one(_without_password(infra.database_url, old_password))
        assert "trust" not in "".join(
            ln for ln in hba.read_text().splitlines() if not ln.lstrip().startswith("#"))
    assert password not in (tmp_home / "pg" / "postgres.log").read_text(errors="replace")


async def test_a_replaced_password_file_gives_a_clear_error(
        tmp_home: Path, server_tracker: object) -> None:
    """REL-11"""
    async with Infrastructure(home=tmp_home, nats_url="nats://127.0.0.1:1", fast=True,
                              environ={}) as infra:
        assert infra.postgres is not None and infra.postgres.pid is not None
        server_tracker.add_pid(infra.postgres.pid)  # type: ignore[attr-defined]
    (tmp_home / "pg" / "password").unlink()
    with pytest.raises(ServerStartError, match=r"refused the password in .*pg/password") as err:
        async with Infrastructure(home=tmp_home, nats_url="nats://127.0.0.1:1", fast=True,
                                  environ={}):
            pass
    assert (tmp_home / "pg" / "password").read_text().strip() not in str(err.value)
