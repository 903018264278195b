"""Pack renderer (PACK-1..5): reads one snapshot, calls the pure renderer, replies with the pack."""

from __future__ import annotations

from dataclasses import dataclass, field

import store
from actors.context import ActorContext
from bus.service import CommandService
from messages import events as ev
from messages import packs as m
from novel.pack import render_pack


@dataclass
class PackRendererState:
    rendered: int = 0
    failures: int = 0
    last_prefix: dict[str, str] = field(default_factory=dict)  # novel -> last prefix hash (diagnostics)


class PackRenderer:
    name = "packer"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = PackRendererState()
        self.services = [CommandService(ctx.nc, ctx.subjects.packs, {m.RenderPack: self.on_render}, queue="packs")]

    async def start(self) -> None:
        for svc in self.services:
            await svc.start()

    async def stop(self) -> None:
        for svc in self.services:
            await svc.stop()

    async def on_render(self, req: m.RenderPack) -> m.PackRendered:
        snapshot = await store.load_snapshot(self.ctx.pool, req.novel_id)
        try:
            pack = render_pack(snapshot, req.unit_id, req.shape)  # raises WriterPackError (PACK-4)
        except Exception:
            self.state.failures += 1
            raise
        self.state.rendered += 1
        self.state.last_prefix[req.novel_id] = pack.prefix_sha256
        await self.ctx.emit(ev.PackRendered(novel_id=req.novel_id, unit_id=req.unit_id, shape=pack.shape,
                                            chars=pack.chars, est_tokens=pack.est_tokens,
                                            prefix_sha256=pack.prefix_sha256))
        return m.PackRendered(unit_id=req.unit_id, shape=pack.shape, text=pack.text,
                              prefix_sha256=pack.prefix_sha256, sha256=pack.sha256, chars=pack.chars,
                              est_tokens=pack.est_tokens, blocks=list(pack.blocks))
