"""Operating a deployment: deleting a novel everywhere it lives (OPS-11).

A novel lives in the database (every table with a `novel_id` column, the append-only ledgers
included), in the JetStream streams (its events, work notices and dead letters) and in the raw
vault. `delete_novel` removes it from all three and says what went, per kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from novelbus.actors.context import ActorContext
from novelbus.bus.dead_letters import purge_novel
from novelbus.store import retention
from novelbus.store.errors import NovelNotFound
from novelbus.store.raw_vault import RawVault


@dataclass(frozen=True)
class NovelDeletion:
    novel_id: str
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows
    messages: dict[str, int] = field(default_factory=dict)  # stream -> messages
    vault_files: int = 0
    vault_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"novelId": self.novel_id, "rows": self.rows, "messages": self.messages,
                "vault": {"files": self.vault_files, "bytes": self.vault_bytes}}


async def delete_novel(ctx: ActorContext, novel_id: str, vault: RawVault | None) -> NovelDeletion:
    """The database first, in one transaction (refused while the novel is active, nothing
    changed then), then its stream messages and vault files. A novel whose rows are gone but
    whose messages or files are left (a deletion interrupted after its commit) is finished by
    running it again; NovelNotFound when nothing of it is left anywhere."""
    try:
        rows = (await retention.delete_novel(ctx.pool, novel_id)).rows
    except NovelNotFound:
        rows = {}
    messages = await purge_novel(ctx.js, ctx.subjects, novel_id)
    purged = vault.purge(novel_id=novel_id) if vault is not None else None
    files, size = (purged.files, purged.bytes) if purged is not None else (0, 0)
    if not rows and not messages and not files:
        raise NovelNotFound(f"novel {novel_id!r} not found")
    return NovelDeletion(novel_id, rows, messages, files, size)
