"""Least-privilege PostgreSQL roles (OPS-9): one LOGIN role per actor kind, with only the grants
its code needs, and a migration role that owns the schema.

`GRANTS` is the table, read off what each actor's code calls in the store (actors/*.py and the
store functions they reach): which tables a kind may SELECT, INSERT, UPDATE or DELETE, and which
step functions (store/functions.sql) it may EXECUTE. The step functions run as their owner, the
migration role (SECURITY DEFINER, set at the end of functions.sql): they take the novel-row lock
(`SELECT … FOR UPDATE`, which PostgreSQL lets only a role that may UPDATE the table take) and
write what a claim or a commit writes, so e.g. the claim manager commits through
`nb_commit_body` without any grant on `commits` or `novels` beyond reading them.

`apply_roles` brings a database to the table in one transaction: creates the roles missing
(`<prefix><kind>`, LOGIN, no other attribute), sets the passwords given as SCRAM verifiers
computed by the caller (a password is never sent), gives the migration role every object of the
schema, takes PUBLIC's rights on the schema and the step functions away, and revokes and grants
each actor role's privileges exactly as the table says. Applying it twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from novelbus.store._db import Conn

SELECT, INSERT, UPDATE, DELETE = "SELECT", "INSERT", "UPDATE", "DELETE"
PRIVILEGES = (SELECT, INSERT, UPDATE, DELETE)
DEFAULT_PREFIX = "novelbus_"
MIGRATE = "migrate"  # the migration role's kind: it owns the schema, runs `novelbus migrate` and the operator CLI

# Every table of this release's schema (store/migrations/); tests/store/test_grants.py holds it
# equal to the migrated catalog, so a new table cannot be left out of the table below unnoticed.
TABLES = (
    "canon_facts", "commits", "context_freeze", "detections", "events", "extracted_canon", "extracted_commits",
    "intents", "ledger_deletions", "notes", "novel_retention", "novels", "outline_revisions", "outline_scenes",
    "processed_messages", "requirements", "schema_functions", "schema_migrations", "serving_calls",
    "serving_endpoints", "serving_slots", "serving_tickets", "sessions", "studies", "study_adoptions",
    "study_arms", "study_decisions", "study_pairs", "study_registrations", "study_reviewers", "study_votes",
    "turn_ledger", "units", "usage_samples", "usage_totals", "writer_runs",
)
# The step functions of store/functions.sql: SECURITY DEFINER, EXECUTE only as granted here.
STEP_FUNCTIONS = ("nb_prepare_unit", "nb_prepare_lease_unit", "nb_claim_unit", "nb_commit_body",
                  "nb_commit_body_event", "nb_account_turn", "nb_record_turn_usage")


def _read(*tables: str) -> dict[str, frozenset[str]]:
    return {t: frozenset({SELECT}) for t in tables}


def _rows(spec: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """{"units": "SU"} -> {"units": {SELECT, UPDATE}}: a write reads too (its WHERE, RETURNING)."""
    letters = {"S": SELECT, "I": INSERT, "U": UPDATE, "D": DELETE}
    return {t: frozenset({SELECT, *(letters[c] for c in privs)}) for t, privs in spec.items()}


# What every actor process does: checks the schema at start and on /ready (OPS-10), writes its
# events to the ledger and reads them back to republish (BUS-6).
_PROCESS = {**_read("schema_migrations", "schema_functions"), **_rows({"events": "I"})}
# The novel as a snapshot reads it (store/snapshots.py, store/context.py, store/commit_index.py).
_SNAPSHOT = _read("novels", "outline_revisions", "units", "commits", "canon_facts", "notes", "extracted_commits",
                  "extracted_canon")
# A process that calls a model holds a slot of its endpoint for the call (SERVE-1, store/limiter.py).
_SERVING = _rows({"serving_endpoints": "IU", "serving_tickets": "IUD", "serving_slots": "IU", "serving_calls": "IUD"})


@dataclass(frozen=True)
class Grants:
    """One kind's privileges: per table, and the step functions it may execute."""

    tables: Mapping[str, frozenset[str]]
    functions: frozenset[str] = frozenset()
    why: str = ""

    def on(self, table: str) -> frozenset[str]:
        return self.tables.get(table, frozenset())


def _grants(*parts: Mapping[str, frozenset[str]], functions: tuple[str, ...] = (), why: str) -> Grants:
    tables: dict[str, set[str]] = {}
    for part in parts:
        for t, privs in part.items():
            tables.setdefault(t, set()).update(privs)
    return Grants({t: frozenset(p) for t, p in tables.items()}, frozenset(functions), why)


GRANTS: dict[str, Grants] = {
    # DRV-*, PLAN-*, ROLE-*, REL-7: prepares and leases units, accounts turns, pauses and finishes
    # novels, applies steering (outline revisions, requirements), extracts canon (ROLE-3) and
    # settles the roles' usage, reconciles (abandoned runs, turns' usage), probes endpoints.
    "driver": _grants(_PROCESS, _SNAPSHOT, _SERVING, _rows({
        "novels": "U", "units": "U", "outline_revisions": "I", "outline_scenes": "ID", "requirements": "IU",
        "intents": "I", "turn_ledger": "U", "writer_runs": "U", "context_freeze": "I", "extracted_commits": "I",
        "extracted_canon": "I", "detections": "", "usage_totals": "", "usage_samples": ""}),
        functions=("nb_prepare_unit", "nb_prepare_lease_unit", "nb_account_turn", "nb_record_turn_usage"),
        why="prepares, leases and releases units; accounts turns; steering, extraction, reconciliation"),
    # CLM-*: claims, releases and recovers units, commits through nb_commit_body(_event).
    "claims": _grants(_PROCESS, _read("novels", "outline_revisions", "commits"), _rows({"units": "U"}),
                      functions=("nb_claim_unit", "nb_commit_body", "nb_commit_body_event"),
                      why="claims, releases and recovers units; commits a verified body"),
    # PACK-*, CTX-*: renders a unit's pack from its frozen context.
    "packer": _grants(_PROCESS, _SNAPSHOT, _rows({"context_freeze": "I"}),
                      why="freezes a unit's context and renders its pack"),
    # WRT-*: a writer run, its session, its read tools' snapshot (read-only connections).
    "writer": _grants(_PROCESS, _SNAPSHOT, _SERVING, _rows({"writer_runs": "IU", "sessions": "IU"}),
                      why="records writer runs and sessions; reads the novel for its tools"),
    # VER-*, ROLE-2: gates a candidate; the detector's and judge's findings and usage.
    "verifier": _grants(_PROCESS, _SNAPSHOT, _SERVING, _rows({"context_freeze": "I", "detections": "I",
                                                               "usage_totals": ""}),
                        functions=("nb_record_turn_usage",),
                        why="gates candidates; records detections and the detector's usage"),
    # USE-*: records a turn's usage sample.
    "usage": _grants(_PROCESS, _rows({"usage_totals": ""}), functions=("nb_record_turn_usage",),
                     why="records usage samples"),
    # A dashboard or a reporting job: reads the ledgers, writes nothing; not the sessions (a
    # writer's conversation, prose) nor the reviewers (token hashes).
    "monitor": _grants(_read(*(t for t in TABLES if t not in ("sessions", "study_reviewers"))),
                       why="reads everything but sessions and reviewers; writes nothing"),
}
KINDS = tuple(GRANTS)
ACTOR_KINDS = ("claims", "packer", "writer", "verifier", "usage", "driver")  # messages.subjects.ACTOR_NAMES
ALL_KINDS = (MIGRATE, *KINDS)

_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,40}")
_VERIFIER = re.compile(r"SCRAM-SHA-256\$\d+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+")


class RolesError(ValueError):
    """The roles cannot be applied as asked; the message names what is wrong (never a password)."""


def role_name(kind: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The PostgreSQL role of a kind: ``novelbus_driver``, ``novelbus_migrate``."""
    if kind not in ALL_KINDS:
        raise RolesError(f"unknown kind {kind!r}: one of {', '.join(ALL_KINDS)}")
    if not _PREFIX.fullmatch(prefix):
        raise RolesError(f"role prefix {prefix!r}: lowercase letters, digits and _, starting with a letter")
    return prefix + kind


def password_setting(kind: str) -> str:
    """The environment variable holding a kind's password: NOVELBUS_PG_<KIND>_PASSWORD."""
    role_name(kind)
    return f"NOVELBUS_PG_{kind.upper()}_PASSWORD"


@dataclass
class Applied:
    """What `apply_roles` did: roles created, passwords set, objects given to the migration role."""

    created: list[str] = field(default_factory=list)
    passwords: list[str] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)
    missing_tables: list[str] = field(default_factory=list)


def _q(name: str) -> str:
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
    return f'"{name}"'


async def apply_roles(conn: Conn, verifiers: Mapping[str, str], *, prefix: str = DEFAULT_PREFIX) -> Applied:
    """Create or update the migration role and every kind's role with `GRANTS`, in one transaction
    (OPS-9). `verifiers` maps a kind to a SCRAM verifier (`infra.postgres.scram_verifier`); a
    role that exists keeps its password when none is given, a role to create needs one.

    Run it as a role that may create roles and change the schema objects' owner (a superuser, or
    the database's admin that owns them)."""
    for kind, verifier in verifiers.items():
        role_name(kind, prefix)
        if not _VERIFIER.fullmatch(verifier):  # digits and base64 only: safe as a SQL literal
            raise RolesError(f"{password_setting(kind)}: not a SCRAM-SHA-256 verifier")
    names = {k: role_name(k, prefix) for k in ALL_KINDS}
    done = Applied()
    async with conn.transaction():
        schema: str = await conn.fetchval("SELECT current_schema()")
        database: str = await conn.fetchval("SELECT current_database()")
        existing = {r["rolname"] for r in await conn.fetch(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])", list(names.values()))}
        lacking = [password_setting(k) for k, n in names.items() if n not in existing and k not in verifiers]
        if lacking:
            raise RolesError(f"no password for the roles to create: set {', '.join(lacking)}")
        for kind, name in names.items():
            if name not in existing:
                await conn.execute(f"CREATE ROLE {_q(name)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT")
                done.created.append(name)
            if kind in verifiers:  # CTX-14: ALTER ROLE takes no bind parameter; a verifier is stored as given
                await conn.execute(f"ALTER ROLE {_q(name)} PASSWORD '{verifiers[kind]}'")
                done.passwords.append(name)
        migrate = _q(names[MIGRATE])
        done.owned = await _give_schema(conn, schema, names[MIGRATE])
        await conn.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {_q(database)} TO {migrate}")
        await conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {_q(schema)} TO {migrate}")
        await conn.execute(f"REVOKE ALL ON SCHEMA {_q(schema)} FROM PUBLIC")
        present = {r["relname"] for r in await conn.fetch(
            "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')", schema)}
        done.missing_tables = [t for t in TABLES if t not in present]
        steps = await _functions(conn, schema, STEP_FUNCTIONS)
        for f in steps.values():
            for sig in f:
                await conn.execute(f"REVOKE ALL ON FUNCTION {sig} FROM PUBLIC")
        for kind, grants in GRANTS.items():
            role = _q(names[kind])
            await conn.execute(f"GRANT CONNECT ON DATABASE {_q(database)} TO {role}")
            await conn.execute(f"REVOKE ALL ON SCHEMA {_q(schema)} FROM {role}")
            await conn.execute(f"GRANT USAGE ON SCHEMA {_q(schema)} TO {role}")
            for what in ("TABLES", "SEQUENCES", "FUNCTIONS"):
                await conn.execute(f"REVOKE ALL ON ALL {what} IN SCHEMA {_q(schema)} FROM {role}")
            for table in TABLES:
                privs = grants.on(table)
                if privs and table in present:
                    listed = ", ".join(p for p in PRIVILEGES if p in privs)
                    await conn.execute(f"GRANT {listed} ON {_q(schema)}.{_q(table)} TO {role}")
            inserted = [t for t in TABLES if INSERT in grants.on(t) and t in present]
            for seq in await _sequences(conn, schema, inserted):
                await conn.execute(f"GRANT USAGE ON SEQUENCE {seq} TO {role}")
            for fn in sorted(grants.functions):
                for sig in steps.get(fn, []):
                    await conn.execute(f"GRANT EXECUTE ON FUNCTION {sig} TO {role}")
    return done


async def _give_schema(conn: Conn, schema: str, owner: str) -> list[str]:
    """ALTER … OWNER TO the migration role for every table, view, sequence, function and type of
    the schema it does not own yet (a table's own sequences follow the table)."""
    rows = await conn.fetch(
        "SELECT CASE WHEN c.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind, c.oid::regclass::text AS name"
        " FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')"
        "  AND c.relowner <> $2::regrole"
        "  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid"
        "                  AND d.deptype IN ('a', 'i'))"
        " UNION ALL SELECT 'ROUTINE', p.oid::regprocedure::text FROM pg_proc p"
        "  WHERE p.pronamespace = $1::regnamespace AND p.proowner <> $2::regrole"
        " UNION ALL SELECT 'TYPE', t.oid::regtype::text FROM pg_type t"
        "  WHERE t.typnamespace = $1::regnamespace AND t.typowner <> $2::regrole AND t.typtype IN ('e', 'd', 'c')"
        "   AND (t.typtype <> 'c' OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')"
        " ORDER BY 1 DESC, 2", schema, owner)
    for r in rows:
        await conn.execute(f"ALTER {r['kind']} {r['name']} OWNER TO {_q(owner)}")
    return [f"{r['kind'].lower()} {r['name']}" for r in rows]


async def _functions(conn: Conn, schema: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    rows = await conn.fetch("SELECT proname, oid::regprocedure::text AS sig FROM pg_proc"
                            " WHERE pronamespace = $1::regnamespace AND proname = ANY($2::text[]) ORDER BY 2",
                            schema, list(names))
    found: dict[str, list[str]] = {}
    for r in rows:
        found.setdefault(r["proname"], []).append(r["sig"])
    return found


async def _sequences(conn: Conn, schema: str, tables: list[str]) -> list[str]:
    """The sequences behind these tables' serial columns (nextval needs USAGE; identity columns none)."""
    rows = await conn.fetch(
        "SELECT DISTINCT s.oid::regclass::text AS name FROM pg_class s"
        " JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.deptype = 'a'"
        " JOIN pg_class t ON t.oid = d.refobjid"
        " WHERE s.relkind = 'S' AND t.relnamespace = $1::regnamespace AND t.relname = ANY($2::text[]) ORDER BY 1",
        schema, tables)
    return [r["name"] for r in rows]


async def held_privileges(conn: Conn, *, prefix: str = DEFAULT_PREFIX) -> dict[str, dict[str, Any]]:
    """What each kind's role may do now, read from the catalog: {kind: {"exists", "tables":
    {table: privileges}, "functions": names, "present": the schema's tables}} — what `novelbus db
    roles` compares with `GRANTS`."""
    schema: str = await conn.fetchval("SELECT current_schema()")
    present = frozenset(r["relname"] for r in await conn.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')", schema))
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        name = role_name(kind, prefix)
        exists = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", name)
        tables: dict[str, frozenset[str]] = {}
        functions: set[str] = set()
        if exists:
            rows = await conn.fetch(
                "SELECT c.relname, array_remove(ARRAY[CASE WHEN has_table_privilege($2, c.oid, 'SELECT') THEN 'SELECT' END,"
                "  CASE WHEN has_table_privilege($2, c.oid, 'INSERT') THEN 'INSERT' END,"
                "  CASE WHEN has_table_privilege($2, c.oid, 'UPDATE') THEN 'UPDATE' END,"
                "  CASE WHEN has_table_privilege($2, c.oid, 'DELETE') THEN 'DELETE' END], NULL) AS privs"
                " FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')",
                schema, name)
            tables = {r["relname"]: frozenset(r["privs"]) for r in rows if r["privs"]}
            functions = {r["proname"] for r in await conn.fetch(
                "SELECT DISTINCT proname FROM pg_proc WHERE pronamespace = $1::regnamespace"
                " AND proname = ANY($3::text[]) AND has_function_privilege($2, oid, 'EXECUTE')",
                schema, name, list(STEP_FUNCTIONS))}
        out[kind] = {"exists": bool(exists), "tables": tables, "functions": frozenset(functions), "present": present}
    return out


def differences(held: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each way the held privileges differ from `GRANTS`, one line each (empty: as the table says)."""
    lines: list[str] = []
    for kind, grants in GRANTS.items():
        h = held.get(kind)
        if h is None or not h["exists"]:
            lines.append(f"{kind}: no role")
            continue
        for table in sorted((set(TABLES) & h["present"]) | set(h["tables"])):  # a table not migrated yet: later
            want, have = grants.on(table), h["tables"].get(table, frozenset())
            if want != have:
                extra, lack = sorted(have - want), sorted(want - have)
                said = "; ".join(x for x in (f"extra {', '.join(extra)}" if extra else "",
                                             f"lacks {', '.join(lack)}" if lack else "") if x)
                lines.append(f"{kind}: {table}: {said}")
        if grants.functions != h["functions"]:
            lines.append(f"{kind}: functions {sorted(h['functions'])}, the table says {sorted(grants.functions)}")
    return lines
