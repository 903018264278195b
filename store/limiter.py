"""The endpoints' slots in PostgreSQL (SERVE-1..4): one limit for every process of a deployment.

A call asks for a slot by inserting a ticket; a ticket is granted a slot number in one
transaction under the endpoint's advisory transaction lock, by whichever waiter looks next
(`novel.serving.grant` decides who and which number). Each ticket carries a lease its process
renews while it waits and while it holds the slot; a ticket whose lease lapsed (its process was
killed, or froze) is deleted by the next grant, so its slot comes back within a lease.

Why leases and not session advisory locks: a slot held by a lock needs a database connection
held for the whole model call (minutes, one per call in flight, from every process), and the
order of waiters and the slot numbers (SERVE-2, SERVE-3) would still need a table. A lease costs
a renewal every lease/3 seconds and bounds the return of a dead process's slot by the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from novelbus.novel import serving
from novelbus.novel.retry import RetryPolicy
from novelbus.store._db import Db, statement, transaction

ENV_LEASE_S = "NOVELBUS_SERVING_LEASE_S"
DEFAULT_LEASE_S = 15.0
LOCK_SPACE = 0x5E27E  # the first key of the endpoints' advisory transaction locks
# How often a waiting call looks again: soon at first, then every quarter second.
POLL = RetryPolicy(initial_interval_s=0.02, backoff_coefficient=1.5, maximum_interval_s=0.25)


def lease_from_env(env: dict[str, str] | None = None) -> float:
    """SERVE-1: NOVELBUS_SERVING_LEASE_S, seconds a slot of a killed process stays taken at most
    (default 15; 1 to 600)."""
    raw = ((os.environ if env is None else env).get(ENV_LEASE_S) or "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1.0 <= value <= 600.0:
        raise ValueError(f"{ENV_LEASE_S} must be a number of seconds from 1 to 600, got {raw!r}")
    return value


class TicketLost(Exception):
    """A waiting or held ticket's lease lapsed and the ticket is gone (the process stalled)."""


@dataclass
class Held:
    """A slot held: its number (llama.cpp's `id_slot`), the ticket, and whether the endpoint was
    marked down when it was granted. `tokens` is set by the caller: the call's tokens, counted
    against tokensPerMinute when the slot is given back."""

    slot: int
    ticket: int
    down: bool
    tokens: int = 0


@dataclass(frozen=True)
class EndpointState:
    endpoint: str
    held_until: Any
    down_since: Any
    last_ok: Any


@dataclass
class PgLimiter:
    """SERVE-1: the deployment's limiter, on the process's pool. One per process (`holder`
    names it in the tickets, for whoever looks at them)."""

    pool: Db
    lease_s: float = field(default_factory=lease_from_env)
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
    # A slot given back by this process wakes this process's waiters at once; the others look
    # again within POLL's longest wait.
    _freed: dict[str, asyncio.Event] = field(default_factory=dict, repr=False)

    @contextlib.asynccontextmanager
    async def slot(self, endpoint: str, *, capacity: int, group: str, asked: float | None = None,
                   requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
                   affinity: bool = True, reserve_s: float = 0.0) -> AsyncIterator[Held]:
        """Wait for a slot of `endpoint` (holding nothing meanwhile but a ticket), hold it for the
        block, give it back. `asked`: when this call first asked (epoch seconds), so a retry keeps
        its place (SERVE-2); `reserve_s`: a slot a chapter gave back is kept for its next call
        this long (SERVE-3)."""
        held: Held | None = None
        while held is None:
            ticket = await ask(self.pool, endpoint, self.holder, group, asked=asked, lease_s=self.lease_s)
            try:
                held = await self._wait(endpoint, ticket, capacity=capacity, rpm=requests_per_minute,
                                        tpm=tokens_per_minute, affinity=affinity, reserve_s=reserve_s)
            except TicketLost:
                continue  # the lease lapsed while this process stood still: ask again
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(release(self.pool, ticket, tokens=0))
                raise
        renewer = asyncio.create_task(self._renew(held.ticket))
        try:
            yield held
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            await asyncio.shield(release(self.pool, held.ticket, tokens=held.tokens))
            self._freed.pop(endpoint, asyncio.Event()).set()

    async def _wait(self, endpoint: str, ticket: int, *, capacity: int, rpm: int | None, tpm: int | None,
                    affinity: bool, reserve_s: float) -> Held:
        looks = 0
        while True:
            held = await try_take(self.pool, endpoint, ticket, capacity=capacity, rpm=rpm, tpm=tpm,
                                  affinity=affinity, lease_s=self.lease_s, reserve_s=reserve_s)
            if held is not None:
                return held
            looks += 1
            freed = self._freed.setdefault(endpoint, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), POLL.delay_s(looks))

    async def _renew(self, ticket: int) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(Exception):  # a missed renewal is retried; the lease has slack
                await renew(self.pool, ticket, lease_s=self.lease_s)

    async def hold(self, endpoint: str, seconds: float) -> None:
        await hold_endpoint(self.pool, endpoint, seconds)

    async def mark_down(self, endpoint: str) -> None:
        await mark_down(self.pool, endpoint)

    async def mark_up(self, endpoint: str) -> None:
        await mark_up(self.pool, endpoint)


async def ask(pool: Db, endpoint: str, holder: str, group: str, *, asked: float | None, lease_s: float) -> int:
    """A new waiting ticket; `asked` (epoch seconds) defaults to now."""
    async with statement(pool) as conn:
        ticket: int = await conn.fetchval(
            "INSERT INTO serving_tickets (endpoint, holder, grp, asked_at, lease_until)"
            " VALUES ($1, $2, $3, coalesce(to_timestamp($4::float8), now()), now() + make_interval(secs => $5))"
            " RETURNING ticket", endpoint, holder, group, asked, lease_s)
    return ticket


async def try_take(pool: Db, endpoint: str, ticket: int, *, capacity: int, rpm: int | None, tpm: int | None,
                   affinity: bool, lease_s: float, reserve_s: float = 0.0) -> Held | None:
    """Renew this ticket's lease, drop lapsed tickets, grant free slots to the waiters the pure
    decision names (this one or others): this ticket's slot, or None while it waits."""
    async with transaction(pool) as conn:
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", LOCK_SPACE, endpoint)
        mine = await conn.fetchrow(
            "UPDATE serving_tickets SET lease_until = now() + make_interval(secs => $2)"
            " WHERE ticket = $1 RETURNING slot", ticket, lease_s)
        if mine is None:
            raise TicketLost(f"ticket {ticket} of endpoint {endpoint!r} lapsed")
        state = await conn.fetchrow(
            "SELECT coalesce(held_until > now(), false) AS held, down_since IS NOT NULL AS down,"
            " extract(epoch FROM now())::float8 AS now FROM serving_endpoints WHERE endpoint = $1", endpoint)
        down = bool(state and state["down"])
        if mine["slot"] is not None:  # another waiter's look granted it
            return Held(slot=mine["slot"], ticket=ticket, down=down)
        rows = await conn.fetch(
            "WITH gone AS (DELETE FROM serving_tickets WHERE endpoint = $1 AND lease_until < now() RETURNING ticket)"
            " SELECT ticket, grp, extract(epoch FROM asked_at)::float8 AS asked, slot FROM serving_tickets"
            " WHERE endpoint = $1 AND ticket NOT IN (SELECT ticket FROM gone)", endpoint)
        used = {r["slot"]: (r["last_grp"], r["used"], r["released"] or 0.0) for r in await conn.fetch(
            "SELECT slot, last_grp, extract(epoch FROM last_used)::float8 AS used,"
            " extract(epoch FROM released_at)::float8 AS released FROM serving_slots"
            " WHERE endpoint = $1", endpoint)}
        now = state["now"] if state is not None else await conn.fetchval("SELECT extract(epoch FROM now())::float8")
        requests_left = tokens_left = None
        if rpm is not None or tpm is not None:
            recent = await conn.fetchrow(
                "WITH old AS (DELETE FROM serving_calls WHERE endpoint = $1"
                " AND started_at < now() - make_interval(secs => $2))"
                " SELECT count(*) AS n, coalesce(sum(tokens), 0) AS tokens FROM serving_calls"
                " WHERE endpoint = $1 AND started_at >= now() - make_interval(secs => $2)",
                endpoint, serving.RATE_WINDOW_S)
            requests_left = None if rpm is None else rpm - int(recent["n"])
            tokens_left = None if tpm is None else tpm - int(recent["tokens"])
        holders = {r["slot"]: r["grp"] for r in rows if r["slot"] is not None}
        numbers = set(used) | set(holders) | set(range(capacity))
        unused = (None, 0.0, 0.0)
        slots = [serving.Slot(number=n, holder_group=holders.get(n), last_group=used.get(n, unused)[0],
                              last_used=used.get(n, unused)[1], released=used.get(n, unused)[2])
                 for n in sorted(numbers)]
        waiting = [serving.Waiter(ticket=r["ticket"], asked=r["asked"], group=r["grp"])
                   for r in rows if r["slot"] is None]
        budget = serving.Budget(capacity=capacity, held=bool(state and state["held"]),
                                requests_left=requests_left, tokens_left=tokens_left, now=now, reserve_s=reserve_s)
        grants = serving.grant(waiting, slots, budget, affinity=affinity)
        if not grants:
            return None
        tickets, numbers_granted = [g.ticket for g in grants], [g.slot for g in grants]
        await conn.execute(
            "WITH g AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS g(ticket, slot)),"
            " t AS (UPDATE serving_tickets s SET slot = g.slot, granted_at = now() FROM g"
            "       WHERE s.ticket = g.ticket RETURNING s.ticket, s.slot, s.grp),"
            " c AS (INSERT INTO serving_calls (ticket, endpoint) SELECT ticket, $3 FROM t"
            "       WHERE $4 ON CONFLICT DO NOTHING)"
            " INSERT INTO serving_slots (endpoint, slot, last_grp, last_used) SELECT $3, slot, grp, now() FROM t"
            " ON CONFLICT (endpoint, slot) DO UPDATE SET last_grp = excluded.last_grp, last_used = excluded.last_used",
            tickets, numbers_granted, endpoint, rpm is not None or tpm is not None)
        mine_granted = next((g.slot for g in grants if g.ticket == ticket), None)
        return None if mine_granted is None else Held(slot=mine_granted, ticket=ticket, down=down)


async def renew(pool: Db, ticket: int, *, lease_s: float) -> bool:
    async with statement(pool) as conn:
        done = await conn.execute(
            "UPDATE serving_tickets SET lease_until = now() + make_interval(secs => $2) WHERE ticket = $1",
            ticket, lease_s)
    return bool(done == "UPDATE 1")


async def release(pool: Db, ticket: int, *, tokens: int) -> None:
    """Give the slot (or the waiting ticket) back; the call's tokens count for its minute."""
    async with statement(pool) as conn:
        await conn.execute(
            "WITH gone AS (DELETE FROM serving_tickets WHERE ticket = $1 RETURNING endpoint, slot),"
            " freed AS (UPDATE serving_slots s SET released_at = now() FROM gone"
            "           WHERE s.endpoint = gone.endpoint AND s.slot = gone.slot)"
            " UPDATE serving_calls SET tokens = $2 WHERE ticket = $1", ticket, max(0, tokens))


async def hold_endpoint(pool: Db, endpoint: str, seconds: float) -> None:
    """SERVE-4: no slot of `endpoint` is granted for `seconds` (a longer hold already set stays)."""
    async with statement(pool) as conn:
        await conn.execute(
            "INSERT INTO serving_endpoints (endpoint, held_until) VALUES ($1, now() + make_interval(secs => $2))"
            " ON CONFLICT (endpoint) DO UPDATE SET held_until ="
            " greatest(serving_endpoints.held_until, excluded.held_until)", endpoint, max(0.0, seconds))


async def mark_down(pool: Db, endpoint: str) -> None:
    """SERVE-4: the endpoint stayed down past its retry policy (the first time counts)."""
    async with statement(pool) as conn:
        await conn.execute(
            "INSERT INTO serving_endpoints (endpoint, down_since) VALUES ($1, now())"
            " ON CONFLICT (endpoint) DO UPDATE SET down_since = coalesce(serving_endpoints.down_since, now())",
            endpoint)


async def mark_up(pool: Db, endpoint: str) -> bool:
    """The endpoint answered again; True when it had been marked down."""
    async with statement(pool) as conn:
        done = await conn.execute(
            "UPDATE serving_endpoints SET down_since = NULL, last_ok = now()"
            " WHERE endpoint = $1 AND down_since IS NOT NULL", endpoint)
    return bool(done == "UPDATE 1")


async def endpoint_states(pool: Db) -> list[EndpointState]:
    async with statement(pool) as conn:
        rows = await conn.fetch("SELECT endpoint, held_until, down_since, last_ok FROM serving_endpoints"
                                " ORDER BY endpoint")
    return [EndpointState(r["endpoint"], r["held_until"], r["down_since"], r["last_ok"]) for r in rows]


async def slots_held(pool: Db, endpoint: str) -> int:
    """How many slots of `endpoint` are held now (lapsed leases not counted)."""
    async with statement(pool) as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM serving_tickets WHERE endpoint = $1 AND slot IS NOT NULL"
            " AND lease_until >= now()", endpoint)
    return n
