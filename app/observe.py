"""An actor process observed (OPS-6, OPS-7): its metrics, liveness and readiness over HTTP.

`observed(ctx)` serves `infra.health`'s endpoint for the actors running on `ctx` — one per
process, however many actors it runs (`novelbus up` serves one for all six). Readiness is asked
when `/ready` is requested, never on a unit's path:

- `nats`: the connection is up (not reconnecting);
- `postgres`: the database answers, every migration this process knows is applied and any
  newer one is additive (OPS-10's rule, `store.schema.read_plan`: nothing is changed);
- `consumers`: every command service and durable consumer this process started is bound, and
  each durable consumer exists on the server (its lag is read on the way).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from novelbus.actors.context import ActorContext
from novelbus.bus import metrics, tally
from novelbus.infra.health import HealthServer
from novelbus.store.schema import SchemaError, read_plan
from novelbus.writers import metrics as model_metrics

DB_CHECK_TIMEOUT_S = 3.0


def _bindings(ctx: ActorContext) -> list[Any]:
    return [b for b in list(metrics.BINDINGS) if getattr(b, "nc", None) is ctx.nc]


async def _schema_problem(ctx: ActorContext) -> str | None:
    """OPS-10's rule, read without changing anything: every known migration applied, and any
    newer one additive (else the plan's refusal says why)."""
    try:
        async with asyncio.timeout(DB_CHECK_TIMEOUT_S):
            plan = await read_plan(ctx.pool)
    except SchemaError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - any failure is the answer: not ready
        return f"no answer ({type(e).__name__})"
    if plan.pending:
        return f"migrations not applied: {', '.join(m.name for m in plan.pending)} (run `novelbus migrate`)"
    return None


async def _consumers_problem(ctx: ActorContext) -> str | None:
    problems: list[str] = []
    for b in _bindings(ctx):
        name = getattr(b, "subject", None) or getattr(getattr(b, "config", None), "durable_name", "?")
        if not b.bound:
            problems.append(f"{name} not bound")
        elif hasattr(b, "lag"):
            try:
                await b.lag()
            except Exception as e:  # noqa: BLE001
                problems.append(f"{name}: consumer not found on the server ({type(e).__name__})")
    return "; ".join(problems) or None


async def readiness(ctx: ActorContext) -> dict[str, str | None]:
    """OPS-7: each check's problem, or None when it passes."""
    nats = None if ctx.nc.is_connected else "not connected"
    postgres, consumers = await asyncio.gather(_schema_problem(ctx), _consumers_problem(ctx))
    return {"nats": nats, "postgres": postgres, "consumers": consumers}


async def refresh(ctx: ActorContext) -> None:
    """The gauges that need a round trip, read once per scrape (OPS-6): DLQ depth, consumer lag."""
    with contextlib.suppress(Exception):
        info = await ctx.js.stream_info(ctx.subjects.dlq_stream)
        metrics.DLQ_DEPTH.set(info.state.messages)
    for b in _bindings(ctx):
        if hasattr(b, "lag") and b.bound:
            with contextlib.suppress(Exception):
                await b.lag()


@contextlib.asynccontextmanager
async def observed(ctx: ActorContext, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[HealthServer]:
    """Serve `/metrics`, `/live` and `/ready` for the actors on `ctx` while the block runs."""
    model_metrics.set_role_source(tally.actor.get)  # a model call's role: the actor serving it
    async with HealthServer(host=host, port=port, ready=lambda: readiness(ctx),
                            refresh=lambda: refresh(ctx)) as server:
        yield server
