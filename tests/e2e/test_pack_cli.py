"""`novelbus pack` and `novelbus bench pack` as a user runs them (OPS-1, PACK-5, CTX-1, CTX-8)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import asyncpg

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.codec import decode
from novelbus.messages import runs as rm
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel


async def novelbus(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def flags(stack: Runtime, nats_url: str) -> list[str]:
    dsn = stack.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    return ["--nats-url", nats_url, "--database-url", dsn]


async def test_pack_prints_what_the_writer_saw_with_sizes_hashes_and_manifest(
    stack: Runtime, nats_url: str
) -> None:
    """OPS-1: `novelbus pack` on a finished novel: a committed unit's pack is byte for byte the pack its
    writer received; the summary shows sizes, the prefix hash and the manifest (CTX-8: the pack
    part carries no hash)."""
    seen: dict[str, str] = {}

    async def on_run(msg: Any) -> None:
        run = decode(msg.data, rm.RunWriter, msg.headers)
        seen.setdefault(run.unit_id, run.pack_text)

    sub = await stack.ctx.nc.subscribe(stack.ctx.subjects.runs, cb=on_run)
    try:
        novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    finally:
        await sub.unsubscribe()
    units = [u.unit_id for u in await store.list_units(stack.ctx.pool, novel_id)]
    first, later = units[0], units[5]  # later: chapter 2

    code, out, err = await novelbus("pack", novel_id, later, *flags(stack, nats_url))
    assert code == 0, err
    text, _, summary = out.partition("\n" + "─" * 72 + "\n")
    assert text == seen[later]
    assert "[[protocol]]" in text and not re.search(r"[0-9a-f]{64}", text)
    prefix = re.search(r"^prefix +sha256 ([0-9a-f]{64}) +\(([\d,]+) chars\)$", summary, re.MULTILINE)
    assert prefix, summary
    assert re.search(r"^size +[\d,]+ chars, ~[\d,]+ est\. tokens", summary, re.MULTILINE)
    assert "read-back       repeatable read, read-only" in summary
    assert f"shape trimmed  profile bounded  asOf commit {units.index(later)}" in summary
    # the manifest describes the whole context, also the cards the trimmed projection leaves out
    assert "L0 scene ×1" in summary and "L2 character ×4" in summary

    code, out, err = await novelbus("pack", novel_id, later, "--shape", "full", "--profile", "wide",
                                    "--json", *flags(stack, nats_url))
    assert code == 0, err
    info = json.loads(out)
    assert info["shape"] == "full" and info["profile"] == "wide"
    assert "earlier-chapters" in info["blocks"] and info["text"].startswith("[[protocol]]")
    assert info["estTokens"] > 0 and info["chars"] == len(info["text"])
    assert info["manifest"]["purpose"] == "diagnostic"
    assert info["manifest"]["included"]["L1 earlier-chapter"] >= 1
    assert re.fullmatch(r"[0-9a-f]{64}", info["prefixSha256"])
    # read-only: the diagnostic render persisted nothing
    freezes = await stack.ctx.pool.fetch("SELECT manifest FROM context_freeze WHERE novel_id = $1",
                                         novel_id)
    assert all(f["manifest"]["request"]["purpose"] == "production" for f in freezes)

    code, out, err = await novelbus("pack", novel_id, first, "--as-of", "0", "--json",
                                    *flags(stack, nats_url))
    assert code == 0, err
    assert json.loads(out)["asOf"] == 0


async def test_pack_gives_clear_errors(stack: Runtime, nats_url: str) -> None:
    """OPS-1"""
    novel_id = await store.create_novel(stack.ctx.pool, parse_novel_file(sample_novel_bytes()))
    unit_id = await store.prepare_unit(stack.ctx.pool, novel_id, "ch1", "cold-lamp", fragment=1,
                                       continuation_anchor=None)
    f = flags(stack, nats_url)
    code, _, err = await novelbus("pack", "no-such-novel", "u1", *f)
    assert code == 2 and "unknown novel 'no-such-novel'" in err
    code, _, err = await novelbus("pack", novel_id, "u-nope", *f)
    assert code == 2 and "unknown unit 'u-nope'" in err and unit_id in err
    code, _, err = await novelbus("pack", novel_id, unit_id, "--shape", "tiny", *f)
    assert code == 2 and "unknown shape 'tiny'" in err
    code, _, err = await novelbus("pack", novel_id, unit_id, "--profile", "huge", *f)
    assert code == 2 and "unknown profile 'huge'" in err
    code, _, err = await novelbus("pack", novel_id, unit_id, "--as-of", "3", *f)
    assert code == 2 and "after the novel's latest commit 0" in err


async def test_bench_pack_json_is_one_object_with_the_promised_keys(pg_admin_dsn: str) -> None:
    """`novelbus bench pack --json`: exactly one JSON object on stdout (progress on stderr), the
    issue's keys, both variants, a private database that is dropped afterwards."""
    code, out, err = await novelbus("bench", "pack", "--json", "--units", "10", "--chapters", "2",
                                    "--repeats", "1", "--database-url", pg_admin_dsn)
    result = json.loads(out)  # the whole of stdout is one object
    for key in ("units", "committed_chars", "trimmed_tokens_max", "trimmed_tokens_p50",
                "full_tokens_max", "full_tokens_p50", "prefix_match_share", "render_pure_p99_ms",
                "render_with_db_p99_ms"):
        assert key in result, key
    assert result["units"] == 10 and set(result["variants"]) == {"latin", "cjk"}
    assert result["prefix_match_share"] == 1.0
    assert 0 < result["trimmed_tokens_max"] < result["full_tokens_max"]
    assert result["met"]["committed_chars"] is False  # 10 units are far from 100,000 characters
    assert code == 1 and result["ok"] is False  # so the run reports a missed target
    conn = await asyncpg.connect(pg_admin_dsn)
    try:
        left = await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname LIKE 'novelbus_bench_%'")
    finally:
        await conn.close()
    assert left == 0
