"""OPS-9: TLS to NATS and `sslmode=verify-full` to PostgreSQL, with a self-signed CA made by
trustme for 127.0.0.1 and localhost. The actors write a unit over mutual TLS to NATS (every
connection the server holds is TLS, `/connz`) and over verified SSL to PostgreSQL (every backend
of the database is encrypted, `pg_stat_ssl`); a server certificate of another CA is refused at
once, naming TLS, on either side, and so is a NATS client without its certificate.

The embedded PostgreSQL wheel is built without OpenSSL, so the PostgreSQL half runs on a
PostgreSQL build that has it (Debian's under /usr/lib/postgresql, which `make test` installs, or
one on PATH) and is skipped, saying so, without one — unless NOVELBUS_REQUIRE_SSL_POSTGRES=1
(`make test` sets it), which makes that a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest
import pytest_asyncio
import trustme

from novelbus import store
from novelbus.actors.runtime import ServerUnreachable, connected, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import (
    ENV_NATS_TLS_CA,
    ENV_NATS_TLS_CERT,
    ENV_NATS_TLS_KEY,
    NatsTlsRefused,
    connect,
)
from novelbus.infra.nats import EmbeddedNats, nats_server_binary
from novelbus.infra.postgres import EmbeddedPostgres, _bin_dir
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from tests.e2e.conftest import run_novel
from tests.waiting import wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
DEPLOY_NATS_CONF = DOCS.parents[1] / "deploy" / "nats.conf"
REFUSAL_S = 30.0  # a refusal comes within a second or two; past this the client is retrying for ever


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, the servers' certificate and key (127.0.0.1, localhost), a client's, and
    another CA that signed none of them."""

    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def pki(server_tracker: Any) -> Pki:
    d = server_tracker.home("tls-pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("novelbus-client.test")
    pki = Pki(*(d / n for n in ("ca.pem", "other-ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    ca.cert_pem.write_to_path(str(pki.ca))
    other.cert_pem.write_to_path(str(pki.other_ca))
    server.cert_chain_pems[0].write_to_path(str(pki.server_cert))
    server.private_key_pem.write_to_path(str(pki.server_key))
    client.cert_chain_pems[0].write_to_path(str(pki.client_cert))
    client.private_key_pem.write_to_path(str(pki.client_key))
    return pki


def documented_nats_tls_conf(pki: Pki) -> str:
    """The server file of docs/operations.md ("NATS, the server"), with the test's certificates."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"\*\*NATS, the server\.\*\*.*?\n```\n(.*?)```", text, re.S)
    assert block is not None, f"no NATS server example in {DOCS}"
    conf = block.group(1)
    for example, path in (("/etc/nats/tls/server.pem", pki.server_cert), ("/etc/nats/tls/server.key", pki.server_key),
                          ("/etc/nats/tls/ca.pem", pki.ca)):
        assert example in conf, f"{example} not in the example of {DOCS}"
        conf = conf.replace(example, str(path))
    return conf


def test_the_documented_nats_tls_file_with_deploy_nats_conf_is_valid(pki: Pki, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-9: `nats-server -t` takes the docs' file beside the generated deploy/nats.conf."""
    shutil.copyfile(DEPLOY_NATS_CONF, tmp_path / "nats.conf")
    for name in set(re.findall(r"\$(NOVELBUS_\w+_PASSWORD)", DEPLOY_NATS_CONF.read_text(encoding="utf-8"))):
        monkeypatch.setenv(name, "test-only")
    (tmp_path / "nats-tls.conf").write_text(documented_nats_tls_conf(pki), encoding="utf-8")
    out = subprocess.run([str(nats_server_binary()), "-c", "nats-tls.conf", "-t"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "is valid" in out.stdout + out.stderr, out


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tls_nats(pki: Pki, server_tracker: Any) -> AsyncIterator[EmbeddedNats]:
    """An embedded NATS running the docs' tls block (without deploy/nats.conf's users): clients
    must speak TLS and show a certificate of the CA (`verify`)."""
    home = server_tracker.home("tls-nats")
    conf = home / "nats-tls.conf"
    tls_block = re.search(r"^tls \{.*?^\}", documented_nats_tls_conf(pki), re.S | re.M)
    assert tls_block is not None
    conf.write_text(tls_block.group(0) + "\n", encoding="utf-8")
    server = EmbeddedNats(home / "nats", config_file=conf)
    await server.start()
    assert server.pid is not None
    server_tracker.add_pid(server.pid)
    try:
        yield server
    finally:
        await server.stop()


def tls_url(server: EmbeddedNats) -> str:
    return server.address.replace("nats://", "tls://", 1)


@pytest.fixture
def nats_tls_settings(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> Pki:
    """The operator's settings for mutual TLS to NATS."""
    monkeypatch.setenv(ENV_NATS_TLS_CA, str(pki.ca))
    monkeypatch.setenv(ENV_NATS_TLS_CERT, str(pki.client_cert))
    monkeypatch.setenv(ENV_NATS_TLS_KEY, str(pki.client_key))
    return pki


async def nats_connections(server: EmbeddedNats) -> list[dict[str, Any]]:
    def get() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{server.monitor_url}/connz", timeout=5) as answer:
            return list(json.load(answer).get("connections") or [])
    return await asyncio.to_thread(get)


def one_unit_novel() -> NovelFile:
    return NovelFile.model_validate(generate_novel_file(1, 1, unit_chars=500))


async def written_over_tls(nats: EmbeddedNats, dsn: str, namespace: str) -> tuple[str, list[dict[str, Any]], Any]:
    """Run the actors on `nats` over TLS and `dsn`; write a one-unit novel. Returns its id, the NATS
    server's connections while the actors ran, and the runtime's pool (still open)."""
    async with running(tls_url(nats), dsn, subjects=Subjects(namespace)) as rt:
        novel_id, _ = await run_novel(rt, one_unit_novel(), timeout=90)
        commits = await store.count_commits_per_unit(rt.ctx.pool, novel_id)
        assert list(commits.values()) == [1], commits
        conns = await nats_connections(nats)
        encrypted = await rt.ctx.pool.fetchrow(
            "SELECT count(*) AS backends, count(*) FILTER (WHERE s.ssl) AS encrypted, "
            "       min(s.version) AS version "
            "FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.datname = current_database() AND a.backend_type = 'client backend'")
    return novel_id, conns, encrypted


def assert_all_tls(conns: list[dict[str, Any]]) -> None:
    actors = [c for c in conns if str(c.get("name", "")).startswith("novelbus")]
    assert actors, f"no actor connection on the TLS server: {conns}"
    plain = [c.get("name") for c in conns if not c.get("tls_version")]
    assert not plain, f"connections without TLS: {plain}"


async def test_actors_write_a_unit_over_mutual_tls_to_nats(
        tls_nats: EmbeddedNats, nats_tls_settings: Pki, new_database: Any, namespace: str) -> None:
    """OPS-9: NOVELBUS_NATS_TLS_CA / _CERT / _KEY and a tls:// URL: the whole flow runs, every
    connection the server holds is TLS."""
    _, conns, _ = await written_over_tls(tls_nats, await new_database(), namespace)
    assert_all_tls(conns)


async def test_nats_of_another_ca_is_refused_at_once_naming_tls(
        tls_nats: EmbeddedNats, nats_tls_settings: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-9: a service (no first-connect timeout) is refused, not left retrying for ever."""
    monkeypatch.setenv(ENV_NATS_TLS_CA, str(nats_tls_settings.other_ca))
    with pytest.raises(NatsTlsRefused) as refused:
        await asyncio.wait_for(connect(tls_url(tls_nats), name="wrong-ca"), REFUSAL_S)
    said = str(refused.value)
    assert said.startswith("TLS with NATS at 127.0.0.1:") and "CERTIFICATE_VERIFY_FAILED" in said, said
    assert ENV_NATS_TLS_CA in said, said


async def test_nats_refuses_a_client_without_its_certificate_naming_tls(
        tls_nats: EmbeddedNats, nats_tls_settings: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-9: the server verifies clients; one without NOVELBUS_NATS_TLS_CERT is refused at once."""
    monkeypatch.delenv(ENV_NATS_TLS_CERT)
    monkeypatch.delenv(ENV_NATS_TLS_KEY)
    with pytest.raises(NatsTlsRefused) as refused:
        await asyncio.wait_for(connect(tls_url(tls_nats), name="no-client-cert"), REFUSAL_S)
    said = str(refused.value)
    assert said.startswith("TLS with NATS at ") and "CERTIFICATE_REQUIRED" in said, said


# --- PostgreSQL with sslmode=verify-full ----------------------------------------------------


def with_openssl(bin_dir: Path) -> bool:
    """Whether the PostgreSQL build in `bin_dir` has SSL (its pg_config names OpenSSL)."""
    pg_config = bin_dir / "pg_config"
    if not (pg_config.is_file() and (bin_dir / "initdb").is_file()):
        return False
    configure = subprocess.run([str(pg_config), "--configure"], capture_output=True, text=True, check=False).stdout
    return "--with-openssl" in configure or "--with-ssl=openssl" in configure


def ssl_postgres_bin() -> Path | None:
    """The embedded wheel's PostgreSQL if it has SSL, else the one on PATH or Debian's if it has it."""
    candidates = [_bin_dir()]
    found = shutil.which("postgres")
    if found:
        candidates.append(Path(found).resolve().parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return next((d for d in candidates if with_openssl(d)), None)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ssl_postgres(pki: Pki, server_tracker: Any) -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL on 127.0.0.1 with ssl=on and the CA's server certificate (ALTER SYSTEM, as an
    operator would), its password still required."""
    bin_dir = ssl_postgres_bin()
    if bin_dir is None:
        why = "no PostgreSQL build with SSL here: the embedded wheel has none, and none is on PATH or in /usr/lib/postgresql"
        if os.environ.get("NOVELBUS_REQUIRE_SSL_POSTGRES") == "1":
            pytest.fail(why + " (NOVELBUS_REQUIRE_SSL_POSTGRES=1; `make test` installs Debian's postgresql)")
        pytest.skip(why)
    pg = EmbeddedPostgres(server_tracker.home("tls-pg"), fast=True, bin_dir=bin_dir)
    await pg.start()
    assert pg.pid is not None
    server_tracker.add_pid(pg.pid)
    try:
        owner = pg.pgdata.stat()  # the server's user must own its key, readable by it alone
        for source in (pki.server_cert, pki.server_key):
            target = pg.pgdata / source.name
            shutil.copyfile(source, target)
            os.chmod(target, 0o600)
            os.chown(target, owner.st_uid, owner.st_gid)
        admin = await asyncpg.connect(pg.admin_dsn)
        try:
            for setting, value in (("ssl_cert_file", pg.pgdata / pki.server_cert.name),
                                   ("ssl_key_file", pg.pgdata / pki.server_key.name), ("ssl", "on")):
                await admin.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
            assert await admin.fetchval("SELECT pg_reload_conf()")
        finally:
            await admin.close()

        async def serves_ssl() -> bool:
            try:
                conn = await asyncpg.connect(pg.dsn, ssl="require", timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                return False
            await conn.close()
            return True

        await wait_until(serves_ssl, 20, lambda: f"PostgreSQL never served SSL after the reload; log {pg.log_path}")
        yield pg
    finally:
        await pg.stop()


def verify_full(pg: EmbeddedPostgres, root: Path) -> str:
    """The store's DSN as docs/operations.md gives it: verify the server's certificate and name."""
    return f"{pg.dsn}?sslmode=verify-full&sslrootcert={quote(str(root))}"


async def test_a_unit_is_written_over_tls_to_nats_and_verified_ssl_to_postgres(
        tls_nats: EmbeddedNats, ssl_postgres: EmbeddedPostgres, nats_tls_settings: Pki, namespace: str) -> None:
    """OPS-9: every connection of the store to the database is encrypted, as pg_stat_ssl says."""
    _, conns, backends = await written_over_tls(tls_nats, verify_full(ssl_postgres, nats_tls_settings.ca), namespace)
    assert_all_tls(conns)
    assert backends["backends"] >= 1 and backends["encrypted"] == backends["backends"], dict(backends)
    assert str(backends["version"]).startswith("TLSv1."), dict(backends)


async def test_verify_full_refuses_a_postgres_certificate_of_another_ca_naming_tls(
        ssl_postgres: EmbeddedPostgres, pki: Pki) -> None:
    """OPS-9: the store and a whole process (`connected`, what every actor opens) are refused at
    once, the message naming TLS and never the password."""
    dsn = verify_full(ssl_postgres, pki.other_ca)
    with pytest.raises(store.DatabaseUnreachable) as refused:
        await asyncio.wait_for(store.connect(dsn, max_size=1), REFUSAL_S)
    said = str(refused.value)
    assert ": TLS: SSLCertVerificationError" in said and "CERTIFICATE_VERIFY_FAILED" in said, said
    password = (ssl_postgres.data_dir / "password").read_text(encoding="utf-8").strip()
    assert password not in said and quote(password, safe="") not in said
    with pytest.raises(ServerUnreachable, match="TLS: SSLCertVerificationError"):
        async with connected("nats://127.0.0.1:1", dsn, subjects=Subjects("t.")):
            pass
