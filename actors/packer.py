"""Pack renderer (PACK-1..5, CTX-1..9): freezes a trusted context, persists it, projects the pack.

Per request: read the unit's sources by pointer in one REPEATABLE READ READ ONLY transaction and
assemble the frozen context (`store.load_context`, scenario `generation`, purpose
`production`); persist the freeze append-only, idempotent on the manifest hash
(`store.save_context_freeze`, CTX-6) BEFORE replying, so every context hash a commit receipt
carries has its freeze row; then render the writer projection (`novel.pack.render_writer_pack`,
CTX-8). A broken context raises WriterPackError (code `pack-error`, PACK-4) and nothing is saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from novelbus import store
from novelbus.actors.context import ActorContext, ServiceActor
from novelbus.bus.service import CommandService
from novelbus.messages import events as ev
from novelbus.messages import packs as m
from novelbus.novel.pack import render_writer_pack


@dataclass
class PackRendererState:
    rendered: int = 0
    failures: int = 0
    freezes: int = 0  # freeze rows written by this process (re-renders of one context write none)
    last_prefix: dict[str, str] = field(default_factory=dict)  # novel -> last prefix hash (diagnostics)


class PackRenderer(ServiceActor):
    name = "packer"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = PackRendererState()
        self.services = [CommandService(ctx.nc, ctx.subjects.packs, {m.RenderPack: self.on_render}, queue="packs")]

    async def on_render(self, req: m.RenderPack) -> m.PackReady:
        pool = self.ctx.pool
        try:
            frozen = await store.load_context(pool, novel_id=req.novel_id, unit_id=req.unit_id,
                                              scenario="generation", purpose="production",
                                              profile=req.profile, as_of=req.as_of_seq,
                                              evidence=tuple(req.evidence))
            pack = render_writer_pack(frozen, req.shape)  # raises WriterPackError (PACK-4)
        except Exception:
            self.state.failures += 1
            raise
        rendered = ev.PackRendered(novel_id=req.novel_id, unit_id=req.unit_id, shape=pack.shape, chars=pack.chars,
                                   est_tokens=pack.est_tokens, prefix_sha256=pack.prefix_sha256)
        saved, seq = await store.save_context_freeze_with_event(  # CTX-6 and its event: one statement (PERF-2)
            pool, self.ctx.ledger_entry(rendered), novel_id=req.novel_id, unit_id=req.unit_id,
            manifest_hash=frozen.manifest_sha256, context_hash=frozen.context_sha256,
            manifest=frozen.manifest_builtins())
        if saved:
            self.state.freezes += 1
        self.state.rendered += 1
        self.state.last_prefix[req.novel_id] = pack.prefix_sha256
        await self.ctx.publish_recorded(rendered, seq)
        return m.PackReady(unit_id=req.unit_id, shape=pack.shape, text=pack.text,
                              prefix_sha256=pack.prefix_sha256, sha256=pack.sha256, chars=pack.chars,
                              est_tokens=pack.est_tokens, blocks=list(pack.blocks),
                              context_sha256=frozen.context_sha256, manifest_sha256=frozen.manifest_sha256,
                              profile=req.profile, as_of_seq=frozen.manifest.request.as_of)
