"""CTX-14: moving a data directory from `trust` to a password sends the server a SCRAM-SHA-256
verifier computed by the client, never the password: with every statement logged, the server's
log shows the ALTER ROLE and not the password, and the password then works."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

from novelbus.infra import Infrastructure


def _embedded(home: Path) -> Infrastructure:
    return Infrastructure(home=home, nats_url="nats://127.0.0.1:1", fast=True, environ={})


def _track(infra: Infrastructure, server_tracker: object) -> None:
    assert infra.postgres is not None and infra.postgres.pid is not None
    server_tracker.add_pid(infra.postgres.pid)  # type: ignore[attr-defined]


async def test_the_trust_to_password_migration_never_sends_the_password(
        tmp_home: Path, server_tracker: object) -> None:
    """CTX-14"""
    async with _embedded(tmp_home) as infra:
        _track(infra, server_tracker)
        conn = await asyncpg.connect(infra.admin_database_url)
        await conn.execute("ALTER SYSTEM SET log_statement = 'all'")  # kept for the next start
        await conn.close()
    # What an earlier version left: pg_hba.conf trusting everyone, no password file.
    hba = tmp_home / "pg" / "data" / "pg_hba.conf"
    hba.write_text(hba.read_text().replace("scram-sha-256", "trust"))
    (tmp_home / "pg" / "password").unlink()
    log = tmp_home / "pg" / "postgres.log"
    logged_before = len(log.read_text(errors="replace"))

    async with _embedded(tmp_home) as infra:
        _track(infra, server_tracker)
        password = (tmp_home / "pg" / "password").read_text().strip()
        assert urlsplit(infra.database_url).password == password
        conn = await asyncpg.connect(infra.database_url)  # the verifier the server stored takes it
        assert await conn.fetchval("SHOW log_statement") == "all"
        assert (await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'")).startswith(
            "SCRAM-SHA-256$4096:")
        await conn.close()
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
            await asyncpg.connect(infra.database_url.replace(password, "wrong-" + password[:8]))
    written = log.read_text(errors="replace")[logged_before:]
    altered = [line for line in written.splitlines() if "statement: ALTER ROLE" in line]
    assert altered and all("SCRAM-SHA-256$" in line for line in altered), written[-2000:]  # logging was on
    assert password not in written
