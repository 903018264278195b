"""What the novel-steering commands do, shared by the CLI and the web panel (OPS-1, OPS-2).

Each function takes a connected `ActorContext` and publishes exactly what its CLI command
publishes, so a novel paused, resumed, stopped, switched or created from the panel is
indistinguishable from one handled with `novelbus novel …`. Store errors propagate as typed
`StoreError`s; the callers turn them into an exit code or an HTTP status.
"""

from __future__ import annotations

from typing import Any, Literal

from novelbus import store
from novelbus.actors.driver import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.outline import NovelFile

SteerAction = Literal["pause", "resume", "stop"]
STEER_ACTIONS: tuple[SteerAction, ...] = ("pause", "resume", "stop")
STEER_HELP = {"pause": "Pause a novel (user-request).", "resume": "Resume a paused novel.",
              "stop": "Stop a novel: pause it and return claimed units to prepared."}


async def create(ctx: Any, nf: NovelFile, *, start: bool = True) -> str:
    """Store a validated novel file; with `start`, publish its first work notice."""
    novel_id = await store.create_novel(ctx.pool, nf)
    if start:
        await publish_notice(ctx, novel_id, reason="created")
    return novel_id


async def steer(ctx: Any, novel_id: str, action: SteerAction) -> store.NovelRow:
    """Pause, resume or stop a novel; return it as it is afterwards."""
    if action == "pause":
        if await store.pause_novel(ctx.pool, novel_id, "user-request"):
            await ctx.emit(ev.NovelPaused(novel_id=novel_id, reason="user-request"))
    elif action == "stop":
        changed = await store.pause_novel(ctx.pool, novel_id, "stopped")
        await store.recover_claims(ctx.pool, novel_ids=[novel_id])
        if changed:
            await ctx.emit(ev.NovelPaused(novel_id=novel_id, reason="stopped"))
    elif action == "resume":
        if await store.resume_novel(ctx.pool, novel_id):
            await ctx.emit(ev.NovelResumed(novel_id=novel_id))
        await publish_notice(ctx, novel_id, reason="resume")
    else:
        raise ValueError(f"unknown action {action!r}; choose from {', '.join(STEER_ACTIONS)}")
    return await store.get_novel(ctx.pool, novel_id)


async def switch_mode(ctx: Any, novel_id: str, mode: str) -> None:
    """Switch writerMode; it takes effect from the next unit (DRV-3)."""
    await store.set_writer_mode(ctx.pool, novel_id, mode)
    await ctx.emit(ev.ModeSwitched(novel_id=novel_id, writer_mode=mode))
