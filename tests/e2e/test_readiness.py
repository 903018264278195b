"""OPS-7 / OPS-6: an actor process's `/ready` says which check fails, over real NATS and PostgreSQL;
`/metrics` reads the dead-letter stream's depth at each scrape."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from novelbus.actors.runtime import Runtime
from novelbus.app.observe import observed


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - the test's own loopback endpoint
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_ready_answers_503_naming_the_service_that_is_no_longer_subscribed(stack: Runtime) -> None:
    """OPS-7"""
    async with observed(stack.ctx) as server:
        assert server.host == "127.0.0.1"
        code, body = await asyncio.to_thread(_get, f"{server.base_url}/ready")
        assert code == 200, body
        assert json.loads(body) == {"ready": True, "checks": {"nats": "ok", "postgres": "ok", "consumers": "ok"}}

        await stack.actor("packer").stop()  # its command service unsubscribes
        code, body = await asyncio.to_thread(_get, f"{server.base_url}/ready")
        checks = json.loads(body)["checks"]
        assert code == 503 and checks["nats"] == "ok" and checks["postgres"] == "ok", body
        assert checks["consumers"] == f"{stack.ctx.subjects.packs} not bound", body
        await stack.actor("packer").start()
        code, body = await asyncio.to_thread(_get, f"{server.base_url}/ready")
        assert code == 200, body


async def test_metrics_read_the_dead_letter_streams_depth_at_each_scrape(stack: Runtime) -> None:
    """OPS-6"""
    js = stack.ctx.js
    await js.publish(stack.ctx.subjects.dead_letter("work"), b"poison", headers={"Novelbus-Error": "test"})
    depth = (await js.stream_info(stack.ctx.subjects.dlq_stream)).state.messages
    async with observed(stack.ctx) as server:
        code, text = await asyncio.to_thread(_get, server.url)
    assert code == 200
    assert f"novelbus_dlq_depth_messages {float(depth)}" in text.splitlines(), text
    assert depth >= 1


async def test_ready_answers_503_while_a_migration_this_process_knows_is_not_applied(stack: Runtime) -> None:
    """OPS-7: the schema at the version the process expects (OPS-10's rule, read only)."""
    async with observed(stack.ctx) as server:
        newest = await stack.ctx.pool.fetchval("SELECT max(name) FROM schema_migrations")
        await stack.ctx.pool.execute("DELETE FROM schema_migrations WHERE name = $1", newest)
        code, body = await asyncio.to_thread(_get, f"{server.base_url}/ready")
    checks = json.loads(body)["checks"]
    assert code == 503 and checks["postgres"].startswith(f"migrations not applied: {newest}"), body
