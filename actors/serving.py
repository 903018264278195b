"""The endpoint health probe (SERVE-4): pauses the novels of an endpoint that stayed down, and
resumes them when it answers again.

It runs beside the driver (the actor runtime starts it in the driver's process). An endpoint is
marked down by a call that found it away past its retry policy (`writers.endpoints`); the probe
then pauses every active novel `model-unavailable` (the deployment's model serves all of them),
asks the endpoint's model listing once a second, and when an answer comes — any HTTP status
below 500 — marks it up and resumes the novels it paused, each with a work notice. A novel the
driver paused `model-unavailable` (its external retries spent) is resumed the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import openai

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.serving import MODEL_UNAVAILABLE
from novelbus.store import limiter
from novelbus.writers.endpoints import Endpoint, endpoint_for, endpoints_from_env
from novelbus.writers.factory import LOCAL_PLACEHOLDER_KEY

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 5.0


@dataclass
class ProbeState:
    endpoint: Endpoint | None
    task: asyncio.Task[None] | None = None


class EndpointProbe:
    name = "serving"

    def __init__(self, ctx: ActorContext, endpoint: Endpoint | None = None, *,
                 interval_s: float = PROBE_INTERVAL_S) -> None:
        self.ctx = ctx
        if endpoint is None and ctx.settings.model != "offline":
            endpoint = endpoint_for(ctx.settings.model, endpoints_from_env())
        found = endpoint
        self.state = ProbeState(endpoint=found if found is not None and found.base_url else None)
        self.interval_s = interval_s

    async def start(self) -> None:
        if self.state.endpoint is not None:
            self.state.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        task, self.state.task = self.state.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the probe outlives a database or bus hiccup
                log.exception("endpoint probe: a check failed; next in %.0f s", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def check(self) -> None:
        """One look: pause the novels of a down endpoint; resume them when it answers."""
        ep = self.state.endpoint
        if ep is None:
            return
        states = {s.endpoint: s for s in await limiter.endpoint_states(self.ctx.pool)}
        down = ep.name in states and states[ep.name].down_since is not None
        novels = await store.list_novels(self.ctx.pool)
        waiting = [n.novel_id for n in novels if n.status == "paused" and n.pause_reason == MODEL_UNAVAILABLE]
        if down:
            for n in novels:
                if n.status == "active" and await store.pause_novel(self.ctx.pool, n.novel_id, MODEL_UNAVAILABLE):
                    waiting.append(n.novel_id)
                    await self.ctx.emit(ev.NovelPaused(
                        novel_id=n.novel_id, reason=MODEL_UNAVAILABLE,
                        detail=f"endpoint {ep.name} stayed down past its retry policy"))
        if not (down or waiting) or not await self.answers(ep):
            return
        if down:
            await limiter.mark_up(self.ctx.pool, ep.name)
            log.info("endpoint %s answers again: resuming %d novels", ep.name, len(waiting))
        for novel_id in waiting:
            with contextlib.suppress(store.NovelNotActive):  # finished meanwhile
                if await store.resume_novel(self.ctx.pool, novel_id):
                    await self.ctx.emit(ev.NovelResumed(novel_id=novel_id))
                    await publish_notice(self.ctx, novel_id, reason="model-available")

    async def answers(self, ep: Endpoint) -> bool:
        """The endpoint's model listing answers (any HTTP status below 500)."""
        assert ep.base_url is not None
        client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=LOCAL_PLACEHOLDER_KEY, max_retries=0,
                                    timeout=PROBE_TIMEOUT_S)
        try:
            await client.models.list()
        except openai.APIStatusError as e:
            return e.status_code < 500
        except (openai.OpenAIError, ValueError):
            return False
        finally:
            await client.close()
        return True
