"""`novelbus bench ab` as a two-arm study (STUDY-1, STUDY-2): its cost figures as before, its
arms registered, frozen and checked scene by scene, and, kept, reviewable by people."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import asyncpg


async def novelbus(*args: str, timeout: float = 240) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_bench_ab_is_a_study_of_two_arms_that_people_can_review(nats_url: str, new_database: Any,
                                                                      tmp_path: Path) -> None:
    """STUDY-1, STUDY-2: `bench ab --json` keeps its cost figures and adds its study: the
    registration hash, every scene paired and none excluded; `--keep-study` keeps the scratch
    database, where the study takes an invite."""
    dsn = await new_database()
    code, out, err = await novelbus("bench", "ab", "--chapters", "1", "--scenes", "3", "--unit-chars", "500",
                                    "--json", "--keep-study", "--nats-url", nats_url, "--database-url", dsn,
                                    "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads(out)
    for key in ("ratio", "inline_input_tokens", "subagent_input_tokens", "inline_peak_tokens", "w3"):
        assert key in report, key
    study = report["study"]
    assert study["compare"] == ["subagent", "inline"] and study["variable"] == "writerMode"
    assert len(study["registrationHash"]) == 64 and study["pairs"] == 3 and study["excluded"] == []
    admin = await asyncpg.connect(dsn)
    try:
        kept = [r["datname"] for r in await admin.fetch("SELECT datname FROM pg_database WHERE datname LIKE"
                                                        " 'novelbus_bench_%'")]
    finally:
        await admin.close()
    held = []
    for name in kept:
        conn = await asyncpg.connect(dsn.rsplit("/", 1)[0] + f"/{name}")
        try:
            if await conn.fetchval("SELECT to_regclass('study_arms') IS NOT NULL") and await conn.fetchval(
                    "SELECT count(*) FROM studies WHERE study_id = $1", study["studyId"]):
                held.append(name)
                arms = dict(await conn.fetch("SELECT arm, novel_id FROM study_arms WHERE study_id = $1",
                                             study["studyId"]))
                assert set(arms) == {"inline", "subagent"}
        finally:
            await conn.close()
    assert len(held) == 1, kept
    base = dsn.rsplit("/", 1)[0]
    code, out, err = await novelbus("study", "invite", study["studyId"], "--reviewer", "erin", "--json",
                                    "--nats-url", nats_url, "--database-url", f"{base}/{held[0]}")
    assert code == 0 and json.loads(out)["token"], err
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'DROP DATABASE "{held[0]}" WITH (FORCE)')
    finally:
        await admin.close()
