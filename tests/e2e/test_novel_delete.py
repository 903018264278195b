"""OPS-11: `novelbus novel delete NOVEL --yes` of a finished novel leaves no row (in any table with a
`novel_id` column), no stream message and no raw-vault file of it, and prints a receipt; an active
novel is refused with nothing changed; the append-only ledgers still refuse every other delete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.messages import events as ev
from novelbus.store.retention import novel_sha256
from tests.e2e.test_cli import novelbus
from tests.e2e.test_sampling_and_vault import novel
from tests.waiting import drive, settled_usage, wait_until
from tests.writers.harness import writer_stack

# Found from the catalog independently of store.retention, so a table it missed shows here.
NOVEL_TABLES = """
SELECT table_name FROM information_schema.columns
WHERE column_name = 'novel_id' AND table_schema = current_schema()
  AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE')
"""


async def rows_of(pool: Any, novel_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    async with pool.acquire() as conn:
        for r in await conn.fetch(NOVEL_TABLES):
            n = await conn.fetchval(f'SELECT count(*) FROM "{r["table_name"]}" WHERE novel_id = $1', novel_id)
            if n:
                counts[r["table_name"]] = n
    return counts


async def test_novel_delete_of_a_finished_novel_leaves_no_row_event_message_or_vault_file_of_it(
        tmp_path: Path, nats_url: str, new_database: Any, namespace: str) -> None:
    """OPS-11: the receipt counts what went per kind (rows per table, messages per stream, vault
    files); afterwards every table, the three streams and the vault hold nothing of the novel, and
    the other novel keeps all it had. Refused for an active novel (nothing changed) and, without
    --yes, when there is no terminal to ask."""
    vault = tmp_path / "vault"
    async with writer_stack(nats_url, new_database, namespace,
                            settings=Settings(model="offline", raw_vault=str(vault))) as rt:
        ctx, s = rt.ctx, rt.ctx.subjects
        flags = ["--nats-url", nats_url, "--database-url", ctx.pool._connect_args[0],  # type: ignore[attr-defined]
                 "--namespace", namespace, "--raw-vault", str(vault)]
        gone = await drive(rt, novel("n-gone", "W1", rawVault={"enabled": True}), timeout=120)
        kept = await drive(rt, novel("n-kept", "W1", rawVault={"enabled": True}), timeout=120)
        assert isinstance(gone.final, ev.NovelFinished) and isinstance(kept.final, ev.NovelFinished)
        await settled_usage(rt)
        await ctx.js.publish(s.work("n-gone"), b"{garbled")  # a dead letter of the novel

        async def one_letter() -> bool:
            return (await ctx.js.stream_info(s.dlq_stream)).state.messages == 1
        await wait_until(one_letter, 30, "the garbled notice in the dead-letter stream")
        before_gone, before_kept = await rows_of(ctx.pool, "n-gone"), await rows_of(ctx.pool, "n-kept")
        assert {"novels", "units", "commits", "events"} <= set(before_gone), before_gone
        kept_files = sorted((vault / "n-kept").glob("*.json"))
        assert kept_files and list((vault / "n-gone").glob("*.json"))

        code, out, err = await novelbus("novel", "delete", "n-gone", *flags)  # no --yes, no terminal
        assert code == 2 and "--yes" in err, (code, out, err)
        busy = novel("n-busy", "W1")
        await store.create_novel(ctx.pool, busy)  # active, never started
        code, out, err = await novelbus("novel", "delete", "n-busy", "--yes", *flags)
        assert code == 2 and "novel-active" in err, (code, out, err)
        assert "novels" in await rows_of(ctx.pool, "n-busy")

        code, out, err = await novelbus("novel", "delete", "n-gone", "--yes", "--json", *flags)
        assert code == 0, err
        receipt = json.loads(out)
        assert receipt["rows"] == before_gone, (receipt, before_gone)
        assert receipt["messages"][s.events_stream] >= len(gone.events)
        assert receipt["messages"][s.dlq_stream] == 1
        assert receipt["vault"]["files"] >= 1
        stored = await ctx.pool.fetchval("SELECT receipt FROM ledger_deletions WHERE novel_sha256 = $1", novel_sha256("n-gone"))
        assert stored == {"rows": before_gone}, stored

        assert await rows_of(ctx.pool, "n-gone") == {}
        for stream, subject in ((s.events_stream, s.events_of("n-gone")), (s.work_stream, s.work("n-gone"))):
            state = (await ctx.js.stream_info(stream, subjects_filter=subject)).state
            assert not state.subjects, (stream, state.subjects)
        assert (await ctx.js.stream_info(s.dlq_stream)).state.messages == 0
        assert not (vault / "n-gone").exists()
        assert await rows_of(ctx.pool, "n-kept") == before_kept
        assert sorted((vault / "n-kept").glob("*.json")) == kept_files

        code, out, err = await novelbus("novel", "delete", "n-gone", "--yes", *flags)
        assert code == 2 and "novel-not-found" in err, (code, out, err)

        # The bypass is the delete path's alone: a receipt for one novel lets no other novel's row go,
        # and an update stays refused even for the novel named.
        async with ctx.pool.acquire() as conn:
            with pytest.raises(asyncpg.RestrictViolationError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO ledger_deletions (kind, novel_sha256) VALUES ('novel', $1)",
                                       novel_sha256("n-gone"))
                    await conn.execute("DELETE FROM events WHERE novel_id = 'n-kept'")
            with pytest.raises(asyncpg.RestrictViolationError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO ledger_deletions (kind, novel_sha256) VALUES ('novel', $1)",
                                       novel_sha256("n-kept"))
                    await conn.execute("UPDATE events SET type = 'x' WHERE novel_id = 'n-kept'")
        assert await rows_of(ctx.pool, "n-kept") == before_kept
