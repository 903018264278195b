"""SERVE-8: does a unit cost more CPU the longer its book is? Measured in pairs, in one run.

The latency novel's quarters, one after the other, compare the first hundred units with the last
hundred written some seconds later — and on a shared machine the same code's ratio of those two
swung from 0.98 to 1.38 between runs: what the process and the machine do over time (the heap, the
collector, other tenants) lands in one quarter and not in the other. So the guarded figure pairs
them instead: two books of the same shape, one written alone up to its last quarter, then the last
quarter of that book and the first quarter of the other written in alternating blocks of
`BLOCK_UNITS` units, one book at a time (the other paused between its blocks). Whatever changes
over time changes both alike; what is left is the book's length. Each side's figure is a mean
without the highest and lowest `TRIM` of its units (a full collection of the heap lands in one
unit of either book at random).

A unit's CPU is the process's CPU time from its book's previous commit to its commit, counted
only when both commits fall in the same block (the first unit of a block carries the resume, a
unit that overlaps the other book's is not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.app.terminal import err_console
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file

BLOCK_UNITS = 5  # units of one book written before the other's turn
TRIM = 0.1  # the share of each book's units cut at each end before the mean (a collector's pause)
POLL_S = 0.02  # how often a paused book is checked for a unit still in flight


@dataclass(frozen=True)
class Mark:
    """A commit seen by the bench: this process's CPU time then, whose book, which block."""

    cpu_s: float
    novel_id: str
    block: int


@dataclass(frozen=True)
class Paired:
    """CPU ms per unit (`trimmed_mean`) of the long book's last quarter and of the short book's
    first, and how many units each is over."""

    late_ms: float
    early_ms: float
    late_units: int
    early_units: int
    blocks: int

    @property
    def ratio(self) -> float | None:
        return self.late_ms / self.early_ms if self.early_ms > 0 else None

    def as_json(self) -> dict[str, Any]:
        return {"late_ms": round(self.late_ms, 3), "early_ms": round(self.early_ms, 3),
                "late_units": self.late_units, "early_units": self.early_units, "blocks": self.blocks,
                "ratio": None if self.ratio is None else round(self.ratio, 3)}


def trimmed_mean(values: list[float], trim: float = TRIM) -> float:
    """The mean of `values` without the `trim` share at each end (all of them when too few)."""
    cut = int(len(values) * trim)
    kept = sorted(values)[cut:len(values) - cut] if cut else values
    return statistics.mean(kept)


def paired_cpu(marks: list[Mark], late_id: str, early_id: str, *, first_block: int = 1) -> Paired | None:
    """The pair from the commits seen (pure): per book, the CPU between two consecutive commits of
    it in the same block (from `first_block` on), its `trimmed_mean`; None when either book has no
    such unit."""
    per: dict[str, list[float]] = {late_id: [], early_id: []}
    for before, mark in zip(marks, marks[1:], strict=False):
        if (mark.novel_id in per and before.novel_id == mark.novel_id and before.block == mark.block
                and mark.block >= first_block):
            per[mark.novel_id].append((mark.cpu_s - before.cpu_s) * 1000)
    late, early = per[late_id], per[early_id]
    if not late or not early:
        return None
    return Paired(trimmed_mean(late), trimmed_mean(early), len(late), len(early),
                  len({m.block for m in marks if m.block >= first_block}))


async def _quiet(ctx: ActorContext, novel_id: str, timeout: float) -> None:
    """Until the paused book has no unit claimed and no commit lands between two looks."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        row = await ctx.pool.fetchrow(
            "SELECT (SELECT count(*) FROM units WHERE novel_id = $1 AND state = 'claimed') AS claimed,"
            " (SELECT count(*) FROM commits WHERE novel_id = $1) AS commits", novel_id)
        now = (row["claimed"], row["commits"])
        if now[0] == 0 and now == last:
            return
        last = now
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"flatness: novel {novel_id} still writes {timeout:.0f} s after its pause")


async def paired_phase(ctx: ActorContext, datas: tuple[dict[str, Any], dict[str, Any]], *, units: int,
                       timeout: float, block_units: int = BLOCK_UNITS) -> Paired | None:
    """Write the long book (`datas[0]`, `units` units) alone up to its last quarter, then its last
    quarter and the short book's (`datas[1]`) first quarter in alternating blocks; the pair."""
    quarter = units // 4
    late_id, early_id = [await store.create_novel(ctx.pool, parse_novel_file(json.dumps(d))) for d in datas]
    counts = {late_id: 0, early_id: 0}
    marks: list[Mark] = []
    block = 0
    wanted: dict[str, int] = {late_id: units - quarter, early_id: 0}
    reached = {late_id: asyncio.Event(), early_id: asyncio.Event()}
    failed: list[str] = []

    async def on_event(e: ev.NovelEvent) -> None:
        if e.novel_id not in counts:
            return
        if isinstance(e, ev.UnitCommitted):
            counts[e.novel_id] += 1
            marks.append(Mark(time.process_time(), e.novel_id, block))
            if counts[e.novel_id] >= wanted[e.novel_id]:
                reached[e.novel_id].set()
        elif isinstance(e, ev.NovelFinished):
            reached[e.novel_id].set()
        elif isinstance(e, ev.NovelPaused) and e.reason != "bench":
            failed.append(f"{e.novel_id}: {e.reason}")
            reached[e.novel_id].set()

    async def run_until(novel_id: str, target: int) -> None:
        wanted[novel_id] = target
        reached[novel_id].clear()
        if counts[novel_id] >= target:
            return
        await store.resume_novel(ctx.pool, novel_id)
        await publish_notice(ctx, novel_id, reason="bench")
        await asyncio.wait_for(reached[novel_id].wait(), timeout)
        if failed:
            raise RuntimeError(f"flatness: a novel paused instead of writing on ({failed[0]})")
        with contextlib.suppress(store.NovelNotActive):  # the long book's last unit finishes it
            await store.pause_novel(ctx.pool, novel_id, "bench")
        await _quiet(ctx, novel_id, timeout)

    async with EventFollower(ctx.nc, ctx.subjects, types=(ev.UnitCommitted, ev.NovelFinished, ev.NovelPaused),
                             on_event=on_event):
        await store.pause_novel(ctx.pool, early_id, "bench")  # its first notice comes with its first block
        err_console.print(f"[dim]flatness: one novel × {units - quarter} units alone, then its last {quarter} "
                          f"and another's first {quarter} in blocks of {block_units}[/]")
        await run_until(late_id, units - quarter)
        while counts[late_id] < units or counts[early_id] < quarter:
            for novel_id, target in ((early_id, quarter), (late_id, units)):
                if counts[novel_id] < target:
                    block += 1
                    await run_until(novel_id, min(target, counts[novel_id] + block_units))
    return paired_cpu(marks, late_id, early_id)
