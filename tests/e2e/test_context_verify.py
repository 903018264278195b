"""Every freeze of a novel can be assembled again from the store (CTX-11, CTX-12): a novel
written with the roles on while its extractor is killed again and again, then checked."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from novelbus.actors.runtime import Runtime
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.codec import decode
from novelbus.messages import events as ev
from novelbus.novel.context import in_ranges
from novelbus.novel.outline import NovelFile
from novelbus.store.freezes import verify_freezes
from tests.e2e.conftest import run_novel
from tests.e2e.test_pack_cli import flags, novelbus

pytestmark = pytest.mark.timeout(300)

UNITS = 40  # CI time: ≈ 30 s here with the roles on; `bench chaos --units 200` runs the long one
KILLS = 10
DOWN_FOR = 2  # commits the extractor stays dead after each kill, so later freezes lag behind it


def roles_novel(units: int) -> NovelFile:
    data = generate_novel_file(units // 5, 5, seed=11, unit_chars=500)
    data.setdefault("config", {}).update({"detector": "offline", "extractor": "offline", "canonSource": "both"})
    return NovelFile.model_validate(data)


class KeeperKiller:
    """Kills the driver's canon keeper (cancels its task wherever it is) at every `every`-th
    `unit.committed` event and starts a new one `DOWN_FOR` commits later; one task, owned and
    awaited."""

    def __init__(self, driver: Any, every: int) -> None:
        self.driver, self.every = driver, every
        self.commits: asyncio.Queue[int] = asyncio.Queue()
        self.kills = 0
        self._seen = 0
        self.task = asyncio.create_task(self._run())

    async def on_event(self, msg: Any) -> None:
        if isinstance(decode(msg.data, ev.NovelEvent), ev.UnitCommitted):
            self._seen += 1
            self.commits.put_nowait(self._seen)

    async def _run(self) -> None:
        down_until = 0
        while True:
            n = await self.commits.get()
            if down_until and n >= down_until:
                self.driver.canon.start()
                down_until = 0
            if self.kills < KILLS and n % self.every == 0 and not down_until:
                await self.driver.canon.stop()
                self.kills += 1
                down_until = n + DOWN_FOR

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.driver.canon.start()


async def test_every_freeze_is_reproduced_after_the_extractor_was_killed_ten_times(stack: Runtime) -> None:
    """CTX-11, CTX-12: the writer's, detector's and extractor's freezes of a novel whose extractor
    was killed ten times (and stayed dead for a while each time) are all assembled again with
    their persisted hashes — after every extraction landed later — and some of them did see fewer
    extractions than the store holds at the end (the watermark is what makes them reproducible)."""
    driver: Any = stack.actor("driver")
    killer = KeeperKiller(driver, every=UNITS // (KILLS + 2))
    sub = await stack.ctx.nc.subscribe(stack.ctx.subjects.events_of(), cb=killer.on_event)
    try:
        novel_id, _ = await run_novel(stack, roles_novel(UNITS), timeout=240)
    finally:
        await sub.unsubscribe()
        await killer.close()
    await driver.canon.sweep()  # every commit extracted before the check
    pool = stack.ctx.pool
    assert killer.kills == KILLS
    result = await verify_freezes(pool, novel_id)
    assert result.mismatches == [], result.mismatches[:3]
    assert result.reproduced == result.freezes
    assert set(result.by_scenario) == {"generation", "detection", "extraction"}
    assert result.by_scenario["generation"] >= UNITS
    rows = await pool.fetch("SELECT manifest FROM context_freeze WHERE novel_id = $1", novel_id)
    lagging = [r for r in rows if r["manifest"]["request"]["scenario"] == "generation"
               and not all(in_ranges(s, tuple(map(tuple, r["manifest"]["watermark"].get("extracted", []))))
                           for s in range(1, r["manifest"]["request"]["asOf"] + 1))]
    assert lagging, "no writer freeze was made while the extractor lagged: the test proves nothing"


async def test_context_verify_exits_1_naming_the_source_row_changed_behind_its_back(
    stack: Runtime, nats_url: str
) -> None:
    """CTX-12: `novelbus context verify NOVEL --json` prints the contract's object and exits 0 on a
    novel written with the roles on; after the prose of one commit is changed in its row (behind
    the store's back), it exits 1 and each freeze that read that commit names it."""
    nf = roles_novel(10)
    novel_id, _ = await run_novel(stack, nf)
    driver: Any = stack.actor("driver")
    await driver.canon.sweep()
    code, out, err = await novelbus("context", "verify", novel_id, "--json", *flags(stack, nats_url))
    assert code == 0, err
    report = json.loads(out)
    assert report["freezes"] == report["reproduced"] > 0 and report["mismatches"] == []

    pool = stack.ctx.pool
    await pool.execute(
        "UPDATE commits SET body = jsonb_set(body, '{paragraphs,-1}', to_jsonb('A changed line.'::text))"
        " WHERE novel_id = $1 AND seq = 1", novel_id)
    code, out, err = await novelbus("context", "verify", novel_id, "--json", *flags(stack, nats_url))
    assert code == 1, err
    report = json.loads(out)
    assert report["mismatches"] and report["reproduced"] < report["freezes"]
    assert all("commit-1" in m["source"] for m in report["mismatches"]), [(m["source"], m["reason"]) for m in report["mismatches"] if "commit-1" not in m["source"]]
    code, text, _ = await novelbus("context", "verify", novel_id, *flags(stack, nats_url))
    assert code == 1 and "commit-1" in text and f"{report['reproduced']} of {report['freezes']}" in text
