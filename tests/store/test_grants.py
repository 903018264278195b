"""OPS-9: PostgreSQL roles per actor kind, on the real embedded PostgreSQL. `store.grants.GRANTS`
applied (`apply_roles`, `novelbus db roles --apply`) gives each kind exactly its grants, again
and again; the six actors, each connected as its own role, write a novel to its end; no role
writes another's tables, the monitor writes nothing; the step functions keep who may execute
them when functions.sql is applied again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import yaml

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.actors.runtime import Runtime, connected, running
from novelbus.bus.steering import SteeringClient
from novelbus.infra.postgres import scram_verifier
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.store import grants
from tests.store.helpers import novel_file
from tests.waiting import drive, no_unit_in_flight, wait_until

REPO = Path(__file__).resolve().parents[2]


def dsn_as(dsn: str, user: str, password: str) -> str:
    u = urlsplit(dsn)
    return urlunsplit(u._replace(netloc=f"{user}:{password}@{u.netloc.rpartition('@')[2]}"))


class Roles:
    """A database migrated by its superuser, then given roles under a prefix private to the test
    (roles are the cluster's, databases the test's); dropped at the end."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.prefix = f"t{uuid.uuid4().hex[:10]}_"
        self.passwords = {k: secrets.token_urlsafe(16) for k in grants.ALL_KINDS}

    def role(self, kind: str) -> str:
        return grants.role_name(kind, self.prefix)

    def dsn(self, kind: str) -> str:
        return dsn_as(self.admin_dsn, self.role(kind), self.passwords[kind])

    async def apply(self) -> grants.Applied:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            return await grants.apply_roles(conn, {k: scram_verifier(p) for k, p in self.passwords.items()},
                                            prefix=self.prefix)
        finally:
            await conn.close()

    async def held(self) -> dict[str, dict[str, object]]:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            return await grants.held_privileges(conn, prefix=self.prefix)
        finally:
            await conn.close()

    async def drop(self) -> None:
        names = ", ".join(f'"{self.role(k)}"' for k in grants.ALL_KINDS)
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            present = await conn.fetch("SELECT rolname FROM pg_roles WHERE rolname LIKE $1", self.prefix + "%")
            if present:
                await conn.execute(f"REASSIGN OWNED BY {names} TO CURRENT_USER")
                await conn.execute(f"DROP OWNED BY {names}")
                await conn.execute(f"DROP ROLE {names}")
        finally:
            await conn.close()


@pytest.fixture
async def roles(new_database: Callable[[], Awaitable[str]]) -> AsyncIterator[Roles]:
    dsn = await new_database()
    pool = await store.connect(dsn, max_size=2)
    try:
        await store.migrate(pool)
    finally:
        await pool.close()
    r = Roles(dsn)
    try:
        yield r
    finally:
        await r.drop()


async def acl_snapshot(dsn: str) -> list[tuple[str, str]]:
    """Every ACL and owner of the schema's tables, sequences and functions, and of the schema."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT c.relname AS name, coalesce(c.relacl::text, '') || ' ' || c.relowner::regrole::text AS acl"
            " FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'S')"
            " UNION ALL SELECT p.oid::regprocedure::text, coalesce(p.proacl::text, '') || ' '"
            "  || p.proowner::regrole::text || ' ' || p.prosecdef::text || ' ' || coalesce(p.proconfig::text, '')"
            " FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace"
            " UNION ALL SELECT nspname, coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = current_schema()"
            " ORDER BY 1")
        return [(r["name"], r["acl"]) for r in rows]
    finally:
        await conn.close()


async def test_the_table_names_every_table_and_step_function_of_the_schema(roles: Roles) -> None:
    """OPS-9: a table or step function added by a migration must get its line in `GRANTS`."""
    conn = await asyncpg.connect(roles.admin_dsn)
    try:
        tables = {r["relname"] for r in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'")}
        definer = {r["proname"] for r in await conn.fetch(
            "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND prosecdef")}
    finally:
        await conn.close()
    assert tables == set(grants.TABLES)
    assert definer == set(grants.STEP_FUNCTIONS)  # functions.sql makes exactly these SECURITY DEFINER
    for kind, g in grants.GRANTS.items():
        assert set(g.tables) <= tables and g.functions <= definer, kind


async def test_applied_roles_hold_exactly_the_table_and_applying_again_changes_nothing(roles: Roles) -> None:
    """OPS-9"""
    first = await roles.apply()
    assert sorted(first.created) == sorted(roles.role(k) for k in grants.ALL_KINDS)
    assert first.owned and not first.missing_tables  # every object went to the migration role
    assert grants.differences(await roles.held()) == []
    before = await acl_snapshot(roles.admin_dsn)
    again = await roles.apply()
    assert again.created == [] and again.owned == []
    assert await acl_snapshot(roles.admin_dsn) == before
    held = await roles.held()
    assert held["usage"]["tables"]["events"] == {"SELECT", "INSERT"}
    assert held["monitor"]["functions"] == frozenset() and all(
        p == {"SELECT"} for p in held["monitor"]["tables"].values())  # type: ignore[union-attr]


async def test_differences_name_a_grant_too_many(roles: Roles) -> None:
    """OPS-9: a grant beyond the table is reported, naming the kind, the table and the privilege."""
    await roles.apply()
    conn = await asyncpg.connect(roles.admin_dsn)
    try:
        await conn.execute(f'GRANT UPDATE ON commits TO "{roles.role("usage")}"')
        await conn.execute(f'GRANT EXECUTE ON FUNCTION nb_commit_body_event TO "{roles.role("writer")}"')
    finally:
        await conn.close()
    lines = grants.differences(await roles.held())
    assert "usage: commits: extra UPDATE" in lines
    assert any(line.startswith("writer: functions ['nb_commit_body_event']") for line in lines), lines
    await roles.apply()
    assert grants.differences(await roles.held()) == []  # applying takes them back


# What a role may not do: another kind's table, or a write through a step function not its own.
REFUSED = [
    ("usage", "INSERT INTO commits (novel_id, commit_id) VALUES ('n', 'c')"),
    ("usage", "UPDATE commits SET body = body"),
    ("usage", "UPDATE units SET attempt = attempt"),
    ("writer", "UPDATE units SET attempt = attempt"),
    ("writer", "INSERT INTO detections (novel_id) VALUES ('n')"),
    ("writer", "SELECT * FROM nb_commit_body_event('n', 'u', 'h', '{}', 'b', 1, 'c', 'r', '[]', '[]', 't', '{}', 'k')"),
    ("claims", "INSERT INTO commits (novel_id, commit_id) VALUES ('n', 'c')"),
    ("claims", "UPDATE novels SET turns = turns"),
    ("claims", "SELECT 1 FROM novels FOR UPDATE"),
    ("claims", "INSERT INTO writer_runs (run_id) VALUES ('r')"),
    ("packer", "UPDATE units SET attempt = attempt"),
    ("packer", "INSERT INTO sessions (session_id) VALUES ('s')"),
    ("verifier", "UPDATE units SET attempt = attempt"),
    ("verifier", "INSERT INTO commits (novel_id, commit_id) VALUES ('n', 'c')"),
    ("driver", "INSERT INTO commits (novel_id, commit_id) VALUES ('n', 'c')"),
    ("driver", "INSERT INTO sessions (session_id) VALUES ('s')"),
    ("driver", "DELETE FROM events"),
    ("monitor", "INSERT INTO events (type, payload) VALUES ('x', '{}')"),
    ("monitor", "UPDATE novels SET turns = turns"),
    ("monitor", "DELETE FROM usage_samples"),
    ("monitor", "SELECT * FROM sessions"),
    ("monitor", "SELECT * FROM nb_account_turn('n', 't', 'committed', 1, 's', 'u', 'h')"),
    ("monitor", "CREATE TABLE monitor_was_here (x int)"),
]


async def test_no_role_writes_another_kinds_tables(roles: Roles) -> None:
    """OPS-9: each statement refused with `permission denied`, as the role it names (any other
    outcome — done, or another error, which PostgreSQL raises only past the privilege check — is
    listed; what ran is rolled back)."""
    await roles.apply()
    allowed: list[str] = []
    for kind, sql in REFUSED:
        conn = await asyncpg.connect(roles.dsn(kind))
        try:
            async with conn.transaction():
                await conn.execute(sql)
                allowed.append(f"{kind}: {sql}")
                raise RolledBack
        except asyncpg.InsufficientPrivilegeError:
            pass
        except RolledBack:
            pass
        except asyncpg.PostgresError as e:
            allowed.append(f"{kind}: {sql} (past the privilege check: {type(e).__name__})")
        finally:
            await conn.close()
    assert allowed == []


class RolledBack(Exception):
    """Raised inside the transaction so a statement that ran keeps nothing."""


# A novel of the defaults (inline), one written by subagent runs, and one with the offline extractor and detector (ROLE-2, ROLE-3): the
# driver's extraction and the verifier's detections and their usage run as those roles too.
CONFIGS = {"plain": {}, "subagent": {"writerMode": "subagent"}, "roles": {"extractor": "offline", "canonSource": "both", "detector": "offline"}}


@pytest.mark.parametrize("config", sorted(CONFIGS))
async def test_the_actors_each_as_its_own_role_write_a_novel_to_its_end(
        config: str, roles: Roles, nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """OPS-9: claims, packer, writer, verifier, usage and driver, each connected as its own role
    (nothing more), and the operator as the migration role: the novel finishes, one commit per
    unit, every turn's usage recorded."""
    await roles.apply()
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("NOVELBUS_MIGRATE", "check")  # the migration role migrates, the actors only check
    async with actors_as_their_roles(roles, nats_url, Subjects(namespace)) as ctx:
        driven = await drive(Runtime(ctx=ctx), novel_file(**CONFIGS[config]), timeout=60)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        counts = await store.count_commits_per_unit(ctx.pool, driven.novel_id)
        assert counts and set(counts.values()) == {1}
        await no_unit_in_flight(Runtime(ctx=ctx), driven.novel_id)  # every turn's usage recorded
        sampled = await ctx.pool.fetchval("SELECT sum(samples) FROM usage_totals WHERE novel_id = $1", driven.novel_id)
        assert sampled is not None and sampled >= len(counts)  # each turn's, and the roles' calls
        if config == "roles":  # the extractor reads each commit after it lands, off the unit's path
            async def all_extracted() -> bool:
                extracted = await ctx.pool.fetchval("SELECT count(*) FROM extracted_commits WHERE novel_id = $1",
                                                    driven.novel_id)
                return bool(extracted == len(counts))

            await wait_until(all_extracted, 30, "every commit extracted, as its own role")
            detected = await ctx.pool.fetchval("SELECT count(*) FROM detections WHERE novel_id = $1", driven.novel_id)
            assert detected >= len(counts)
    assert refusals(caplog) == []  # no actor was refused anything on the way, not even once


@contextlib.asynccontextmanager
async def actors_as_their_roles(roles: Roles, nats_url: str, subjects: Subjects) -> AsyncIterator[ActorContext]:
    """The six actors, each in a runtime of its own connected as its kind's role; the operator's
    context as the migration role."""
    async with contextlib.AsyncExitStack() as stack:
        for kind in grants.ACTOR_KINDS:
            await stack.enter_async_context(running(nats_url, roles.dsn(kind), names=(kind,), subjects=subjects))
        yield await stack.enter_async_context(connected(nats_url, roles.dsn(grants.MIGRATE), subjects=subjects))


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage().lower()
            or "InsufficientPrivilege" in r.getMessage() + str(r.exc_info)]


async def test_steering_as_the_driver_role_revises_and_configures_and_the_novel_finishes(
        roles: Roles, nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """OPS-9: the driver's steering writes (an outline revision and the scenes it lists, the
    novel's config) and reads (revisions, requirements, the planning view) under its role."""
    await roles.apply()
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("NOVELBUS_MIGRATE", "check")
    async with actors_as_their_roles(roles, nats_url, Subjects(namespace)) as ctx:
        novel_id = await store.create_novel(ctx.pool, novel_file())
        steer = SteeringClient(ctx.nc, ctx.subjects)
        state = await steer.outline(novel_id)
        revised = await steer.revise(novel_id, {"story": {"premise": "A quieter book."}},
                                     expected_revision=state.revision, reason="a quieter book")
        assert revised.revision != state.revision
        configured = await steer.config(novel_id, {"budgets.maxTurns": 150})
        assert configured.changed == ["budgets.maxTurns"]
        assert len((await steer.revisions(novel_id)).revisions) == 2
        assert (await steer.requirements(novel_id)).requirements == []
        driven = await drive(Runtime(ctx=ctx), novel_id, timeout=60)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        assert (await steer.planning(novel_id)).novel_id == novel_id
    assert refusals(caplog) == []


async def test_applying_functions_sql_again_keeps_who_may_execute_a_step_function(roles: Roles) -> None:
    """OPS-9: `novelbus migrate` as the migration role re-creates the step functions when
    functions.sql changed; the grants of `GRANTS` come back with them, PUBLIC's do not."""
    await roles.apply()
    pool = await store.connect(roles.dsn(grants.MIGRATE), max_size=1)
    try:
        await pool.execute("DELETE FROM schema_functions")  # as if this release's functions.sql were new
        plan = await store.schema.apply(pool)
        assert plan.functions is not None  # it was applied again, by the migration role
    finally:
        await pool.close()
    assert grants.differences(await roles.held()) == []
    conn = await asyncpg.connect(roles.admin_dsn)
    try:
        public = await conn.fetchval(
            "SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a WHERE p.proname = ANY($1::text[])"
            " AND a.grantee = 0", list(grants.STEP_FUNCTIONS))
        owners = {r[0] for r in await conn.fetch(
            "SELECT DISTINCT proowner::regrole::text FROM pg_proc WHERE proname = ANY($1::text[])",
            list(grants.STEP_FUNCTIONS))}
    finally:
        await conn.close()
    assert public == 0 and owners == {roles.role(grants.MIGRATE)}


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", **env})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_db_roles_apply_takes_the_passwords_from_the_environment_and_never_prints_them(roles: Roles) -> None:
    """OPS-9: `novelbus db roles` differs (exit 1) before, `--apply` without a password to create
    a role with is refused naming its variable (exit 2), with them it applies, and then the
    database holds exactly the table (exit 0)."""
    base = {"NOVELBUS_DATABASE_URL": roles.admin_dsn}
    code, out, err = await cli("db", "roles", "--prefix", roles.prefix, "--quiet", env=base)
    assert code == 1 and "differs: driver: no role" in err, err
    code, out, err = await cli("db", "roles", "--apply", "--prefix", roles.prefix, env=base)
    assert code == 2 and "NOVELBUS_PG_DRIVER_PASSWORD" in err and "NOVELBUS_PG_MIGRATE_PASSWORD" in err, err
    passwords = {grants.password_setting(k): p for k, p in roles.passwords.items()}
    code, out, err = await cli("db", "roles", "--apply", "--prefix", roles.prefix, env={**base, **passwords})
    assert code == 0, err
    assert f"created role {roles.role('usage')}" in out and "every role holds exactly its grants" in out
    assert f"{roles.role('usage')}" in out and "nb_record_turn_usage" in out  # the table, printed
    assert not any(p in out + err for p in roles.passwords.values())
    conn = await asyncpg.connect(roles.dsn("usage"))  # the password set as a verifier logs in
    try:
        assert await conn.fetchval("SELECT current_user") == roles.role("usage")
    finally:
        await conn.close()


@pytest.mark.parametrize("path", ["deploy/compose.yaml", "deploy/three-host/compose.yaml"])
def test_each_actor_service_of_the_compose_files_connects_as_its_own_role(path: str) -> None:
    """OPS-9: every `actor NAME` service's DSN names `novelbus_NAME` and that role's password;
    the others (cli, panel, migrate) the migration role."""
    services = yaml.safe_load((REPO / path).read_text(encoding="utf-8"))["services"]
    seen: dict[str, str] = {}
    for name, s in services.items():
        url = (s.get("environment") or {}).get("NOVELBUS_DATABASE_URL")
        if url is None:
            continue
        command = s.get("command") or []
        kind = command[1] if command[:1] == ["actor"] else grants.MIGRATE
        if url.startswith("${"):  # the whole URL from .env: the migration role's (example.env)
            assert kind == grants.MIGRATE, name
            continue
        user, _, rest = url.removeprefix("postgresql://").partition(":")
        seen[name] = user
        assert user == grants.role_name(kind), (name, user)
        if path == "deploy/compose.yaml" or kind != grants.MIGRATE:
            assert rest.startswith("${" + grants.password_setting(kind)), (name, rest)
    assert set(grants.ACTOR_KINDS) <= {u.removeprefix(grants.DEFAULT_PREFIX) for u in seen.values()}


def test_a_supervised_actor_gets_its_own_database_url_when_one_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-9: `up --processes` hands NOVELBUS_DATABASE_URL_<ACTOR> to that actor's process only."""
    from novelbus.infra.supervise import Supervisor

    monkeypatch.setenv("NOVELBUS_DATABASE_URL_WRITER", "postgresql://novelbus_writer:pw@db:5432/novelbus")
    sup = Supervisor(nats_url="nats://127.0.0.1:4222", database_url="postgresql://novelbus_migrate:pw@db:5432/novelbus")
    assert sup.env("writer")["NOVELBUS_DATABASE_URL"] == "postgresql://novelbus_writer:pw@db:5432/novelbus"
    assert sup.env("usage")["NOVELBUS_DATABASE_URL"] == "postgresql://novelbus_migrate:pw@db:5432/novelbus"


async def test_a_restart_recovers_a_claim_in_flight_under_the_roles(
        roles: Roles, nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """OPS-9, REL-1: a unit leased by driver-0 (as the driver role) and claimed by claims-0 (as the
    claims role) when both died; started again as their roles, the claim manager recovers its
    claim and the driver releases its lease (their start-up sweeps, REL-7's reconciliation
    among them), and the novel finishes with one commit per unit."""
    await roles.apply()
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("NOVELBUS_MIGRATE", "check")
    operator = await store.connect(roles.dsn(grants.MIGRATE), max_size=1)
    driver = await store.connect(roles.dsn("driver"), max_size=1)
    claims = await store.connect(roles.dsn("claims"), max_size=1)
    try:
        novel_id = await store.create_novel(operator, novel_file())
        unit_id = (await store.prepare_and_lease_unit(
            driver, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None, intent_id="in-1", notice_id=None,
            holder="driver-0", seconds=60)).unit_id
        await store.claim_unit(claims, novel_id, unit_id, "in-1", mode="inline", claimed_by="claims-0")
        assert [u.state for u in await store.list_units(operator, novel_id)] == ["claimed"]
    finally:
        for pool in (operator, driver, claims):
            await pool.close()
    async with actors_as_their_roles(roles, nats_url, Subjects(namespace)) as ctx:
        driven = await drive(Runtime(ctx=ctx), novel_id, timeout=60)
        assert isinstance(driven.final, ev.NovelFinished), driven.final
        counts = await store.count_commits_per_unit(ctx.pool, novel_id)
        assert counts and set(counts.values()) == {1}
        await no_unit_in_flight(Runtime(ctx=ctx), novel_id)
    assert refusals(caplog) == []
