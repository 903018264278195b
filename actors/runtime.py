"""The runtime owns actors: connects, migrates, ensures streams, starts and stops them in order.

Each actor can run alone in its own OS process (`novelbus actor NAME`) or all together in one
(`novelbus up`, `novelbus demo`); the code path is the same (ARCH-1).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from nats.aio.client import Client as NATS

from novelbus import store
from novelbus.actors.claims import ClaimManager
from novelbus.actors.context import ActorContext, Settings
from novelbus.actors.driver import Driver
from novelbus.actors.packer import PackRenderer
from novelbus.actors.serving import EndpointProbe
from novelbus.actors.usage import UsageSampler
from novelbus.actors.verifier import CommitVerifier
from novelbus.actors.writer import WriterRunner
from novelbus.bus.client import NatsUnreachable, connect
from novelbus.bus.streams import ensure_streams
from novelbus.messages.subjects import ACTOR_NAMES, Subjects
from novelbus.store.limiter import PgLimiter
from novelbus.store.schema import ensure_schema
from novelbus.writers import endpoints

log = logging.getLogger(__name__)
CLOSE_GRACE_S = 10.0  # how long closing the database pool may wait for connections in use


class ServerUnreachable(ConnectionError):
    """NATS or PostgreSQL could not be reached (or refused us) when connecting; the message names
    the server (host and port, never credentials) and the error."""

# Start order: servers of commands first, the driver (their client) last.


class Actor(Protocol):
    name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def build_actor(name: str, ctx: ActorContext, **kwargs: Any) -> Actor:
    factories: dict[str, Any] = {
        "claims": ClaimManager, "packer": PackRenderer, "writer": WriterRunner,
        "verifier": CommitVerifier, "usage": UsageSampler, "driver": Driver,
    }
    if name not in factories:
        raise ValueError(f"unknown actor {name!r}; choose from {', '.join(ACTOR_NAMES)}")
    return factories[name](ctx, **kwargs.get(name, {}))  # type: ignore[no-any-return]


@dataclass
class Runtime:
    ctx: ActorContext
    actors: list[Actor] = field(default_factory=list)

    def actor(self, name: str) -> Actor:
        for a in self.actors:
            if a.name == name:
                return a
        raise KeyError(name)


def freeze_heap() -> None:
    """A service process calls this once its actors run (PERF-2): what start-up built — modules,
    schemas, pools, the actors — lives as long as the process, so the cycle collector stops
    walking it (`gc.freeze`). A full collection then looks only at what came later: its pause
    falls from ~100 ms to a few tens here, and its CPU with it. Nothing is freed late that would
    have been freed: the heap is collected first, and reference counting frees as before."""
    gc.collect()
    gc.freeze()


@contextlib.asynccontextmanager
async def connected(nats_url: str, database_url: str, *, subjects: Subjects, settings: Settings | None = None,
                    name: str = "novelbus", pool_size: int | None = None,
                    nats_wait: float | None = None) -> AsyncIterator[ActorContext]:
    """Connections + migrations + streams: what every actor process and CLI command needs.

    A database that cannot be reached or refuses us raises `ServerUnreachable` at once; NATS is
    waited for (services: forever, REL-6; with ``nats_wait``, that many seconds)."""
    try:
        pool = await store.connect(database_url, max_size=pool_size)
    except store.DatabaseUnreachable as e:
        raise ServerUnreachable(str(e)) from e
    nc: NATS | None = None
    read_pool = None
    try:
        await ensure_schema(pool)  # OPS-10: migrate (NOVELBUS_MIGRATE=auto) or check, and refuse a newer schema
        # INFRA-4: read-only connections for the read tools' snapshot; none opened until used
        read_pool = await store.connect_read_only(database_url)
        try:
            nc = await connect(nats_url, name=name, first_connect_timeout=nats_wait)
        except NatsUnreachable as e:
            raise ServerUnreachable(str(e)) from e
        js = nc.jetstream()
        await ensure_streams(js, subjects)
        with endpoints.installed(PgLimiter(pool)):  # SERVE-1: every model call's slot, deployment-wide
            yield ActorContext(nc=nc, js=js, pool=pool, subjects=subjects, settings=settings or Settings(),
                               read_pool=read_pool)
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.drain()
        if read_pool is not None:
            try:
                await asyncio.wait_for(read_pool.close(), CLOSE_GRACE_S)
            except TimeoutError:
                log.warning("read-only database pool: connections still in use after %.0f s; terminated",
                            CLOSE_GRACE_S)
        try:  # close waits for every connection to come back; a task stuck holding one must not hang exit
            await asyncio.wait_for(pool.close(), CLOSE_GRACE_S)
        except TimeoutError:  # asyncpg terminates the pool when close is interrupted
            log.warning("database pool: connections still in use after %.0f s; terminated", CLOSE_GRACE_S)


@contextlib.asynccontextmanager
async def running(nats_url: str, database_url: str, *, names: tuple[str, ...] = ACTOR_NAMES,
                  subjects: Subjects | None = None, settings: Settings | None = None,
                  actor_kwargs: dict[str, dict[str, Any]] | None = None) -> AsyncIterator[Runtime]:
    """Start the named actors in this process; stop them in reverse order on exit."""
    subjects = subjects or Subjects()
    async with connected(nats_url, database_url, subjects=subjects, settings=settings,
                         name="novelbus-" + "+".join(names)) as ctx:
        rt = Runtime(ctx=ctx)
        try:
            for n in sorted(names, key=ACTOR_NAMES.index):
                actor = build_actor(n, ctx, **(actor_kwargs or {}))
                await actor.start()
                rt.actors.append(actor)
                log.info("actor %s started", n)
            if "driver" in names:  # SERVE-4: the endpoint health probe runs beside the driver
                probe = EndpointProbe(ctx)
                await probe.start()
                rt.actors.append(probe)
            yield rt
        finally:
            for actor in reversed(rt.actors):
                with contextlib.suppress(Exception):
                    await actor.stop()

