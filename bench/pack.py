"""`novelbus bench pack`: writer-pack sizes, render times and prefix stability (PACK-3, PACK-5).

For a Latin and a CJK variant it builds a generated novel of `--units` scenes (default 60, at
least 100,000 committed effective characters), and writes it unit by unit through the store:
prepare → claim → render both shapes (what the pack renderer does: read-back in one
REPEATABLE READ READ ONLY transaction, assemble, project) → commit the offline writer's prose
for the full pack. Per shape it reports:

- render time p50/p99 with the read-back from PostgreSQL included (wall clock), and the pure
  part alone (assemble + project from the sources already read, `--repeats` times per unit),
  as the thread's CPU time — what the render costs, whatever else the machine is running —
  with the wall-clock figures printed beside it;
- pack size max/p50 in characters and estimated tokens (novel.text.estimate_tokens);
- the share of consecutive same-chapter units whose prefix SHA-256 matched;
- the wide profile's pack sizes, for comparison (no target).

Targets (printed beside each figure): trimmed ≤ 8,000 est. tokens and full ≤ 25,000 for every
unit; prefix match 100% within a chapter; pure render p99 ≤ 2 ms. Exit code 1 when one is missed.

It runs on a private embedded PostgreSQL in a temporary directory (removed afterwards), or,
with `--database-url`, in a private database it creates on that server and drops afterwards.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import msgspec
import typer

from novelbus import store
from novelbus.app.terminal import Bar, err_console, fail, print_json, run
from novelbus.app.terminal import progress as progress_bar
from novelbus.bench.common import ScratchRefused, percentile, scratch_database
from novelbus.bench.generate import generate_novel_file
from novelbus.novel.body import CommitBody
from novelbus.novel.context import assemble_context
from novelbus.novel.outline import NovelFile
from novelbus.novel.pack import render_writer_pack
from novelbus.writers.offline import compose_draft

SHAPES = ("trimmed", "full")
TARGET_TOKENS = {"trimmed": 8_000, "full": 25_000}
TARGET_PURE_P99_MS = 2.0
TARGET_PREFIX_SHARE = 1.0
MIN_COMMITTED_CHARS = 100_000
UNIT_CHARS = 2_000  # per-unit target handed to the generator (the book target is units × this)


@contextlib.asynccontextmanager
async def private_database(database_url: str | None) -> AsyncIterator[str]:
    """A database nobody else uses: a private embedded server, or a fresh database on yours."""
    if database_url is None:
        from novelbus.infra import EmbeddedPostgres

        home = Path(tempfile.mkdtemp(prefix="novelbus-bench-pack-"))
        try:
            async with EmbeddedPostgres(home / "pg", fast=True) as pg:
                yield pg.dsn
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return
    try:
        async with scratch_database(database_url, required=True) as dsn:
            yield dsn
    except ScratchRefused as e:
        fail(f"cannot create a private benchmark database on the given server ({e})",
             hint="grant CREATEDB, or run without --database-url (a private embedded PostgreSQL)")


async def bench_variant(pool: asyncpg.Pool, *, cjk: bool, units: int, chapters: int, seed: int,
                        repeats: int, progress: Any) -> dict[str, Any]:
    scenes_per_chapter = units // chapters
    data = generate_novel_file(chapters, scenes_per_chapter, cjk=cjk, seed=seed, unit_chars=UNIT_CHARS)
    data["novelId"] = f"bench-{'cjk' if cjk else 'latin'}-{secrets.token_hex(3)}"
    nf = NovelFile.model_validate(data)
    novel_id = await store.create_novel(pool, nf)
    per_shape: dict[str, dict[str, list[Any]]] = {
        s: {"db_ms": [], "pure_ms": [], "pure_wall_ms": [], "chars": [], "tokens": [], "prefix": [],
            "wide_tokens": []}
        for s in SHAPES
    }
    chapter_of: list[str] = []
    committed = 0
    order = [s for c in nf.outline.ordered_chapters() for s in nf.outline.scenes_of(c.chapterId)]
    for n, scene in enumerate(order, 1):
        unit_id = await store.prepare_unit(pool, novel_id, scene.chapterId, scene.sceneId, fragment=1,
                                           continuation_anchor=None)
        claim = await store.claim_unit(pool, novel_id, unit_id, f"intent-{n}", mode="subagent")
        chapter_of.append(scene.chapterId)
        full_text = ""
        context_hash = ""
        wide = await store.load_context(pool, novel_id=novel_id, unit_id=unit_id, scenario="generation",
                                        purpose="production", profile="wide")
        for shape in SHAPES:
            fig = per_shape[shape]
            t0 = time.perf_counter()
            frozen = await store.load_context(pool, novel_id=novel_id, unit_id=unit_id, scenario="generation",
                                              purpose="production", profile="bounded")
            pack = render_writer_pack(frozen, shape)  # type: ignore[arg-type]
            fig["db_ms"].append((time.perf_counter() - t0) * 1000)
            sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=unit_id,
                                                       scenario="generation", purpose="production",
                                                       profile="bounded")
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.thread_time()
                again = render_writer_pack(assemble_context(sources), shape)  # type: ignore[arg-type]
                c1, t1 = time.thread_time(), time.perf_counter()
                fig["pure_ms"].append((c1 - c0) * 1000)
                fig["pure_wall_ms"].append((t1 - t0) * 1000)
            assert again.sha256 == pack.sha256  # same sources, same bytes (PACK-1)
            fig["chars"].append(pack.chars)
            fig["tokens"].append(pack.est_tokens)
            fig["prefix"].append(pack.prefix_sha256)
            fig["wide_tokens"].append(render_writer_pack(wide, shape).est_tokens)  # type: ignore[arg-type]
            if shape == "full":
                full_text = pack.text
                context_hash = frozen.context_sha256
        draft = compose_draft(full_text)
        draft["sceneCompletion"] = {"completed": True, "basis": "benchmark: one unit per scene"}
        body = msgspec.convert(draft, CommitBody)
        receipt = await store.commit_body(pool, novel_id, unit_id, claim.token, body, run_id=f"bench-{n}",
                                          context_hash=context_hash)
        committed = receipt.total_characters
        progress(n)
    out: dict[str, Any] = {"units": len(chapter_of), "committed_chars": committed}
    pairs = [i for i in range(1, len(chapter_of)) if chapter_of[i] == chapter_of[i - 1]]
    for shape in SHAPES:
        fig = per_shape[shape]
        matched = sum(1 for i in pairs if fig["prefix"][i] == fig["prefix"][i - 1])
        out.update({
            f"{shape}_tokens_max": max(fig["tokens"]),
            f"{shape}_tokens_p50": int(statistics.median(fig["tokens"])),
            f"{shape}_chars_max": max(fig["chars"]),
            f"{shape}_chars_p50": int(statistics.median(fig["chars"])),
            f"{shape}_prefix_match_share": matched / len(pairs) if pairs else 1.0,
            f"{shape}_render_pure_p50_ms": round(percentile(fig["pure_ms"], 50), 3),
            f"{shape}_render_pure_p99_ms": round(percentile(fig["pure_ms"], 99), 3),
            f"{shape}_render_pure_wall_p50_ms": round(percentile(fig["pure_wall_ms"], 50), 3),
            f"{shape}_render_pure_wall_p99_ms": round(percentile(fig["pure_wall_ms"], 99), 3),
            f"{shape}_render_with_db_p50_ms": round(percentile(fig["db_ms"], 50), 3),
            f"{shape}_render_with_db_p99_ms": round(percentile(fig["db_ms"], 99), 3),
            f"wide_{shape}_tokens_max": max(fig["wide_tokens"]),
        })
    out["prefix_pairs"] = len(pairs)
    out["prefix_match_share"] = min(out[f"{s}_prefix_match_share"] for s in SHAPES)
    out["render_pure_p99_ms"] = max(out[f"{s}_render_pure_p99_ms"] for s in SHAPES)
    out["render_pure_wall_p99_ms"] = max(out[f"{s}_render_pure_wall_p99_ms"] for s in SHAPES)
    out["render_with_db_p99_ms"] = max(out[f"{s}_render_with_db_p99_ms"] for s in SHAPES)
    return out


def _verdicts(r: dict[str, Any]) -> dict[str, bool]:
    return {
        "committed_chars": r["committed_chars"] >= MIN_COMMITTED_CHARS,
        "trimmed_tokens_max": r["trimmed_tokens_max"] <= TARGET_TOKENS["trimmed"],
        "full_tokens_max": r["full_tokens_max"] <= TARGET_TOKENS["full"],
        "prefix_match_share": r["prefix_match_share"] >= TARGET_PREFIX_SHARE,
        "render_pure_p99_ms": r["render_pure_p99_ms"] <= TARGET_PURE_P99_MS,
    }


async def run_bench(database_url: str | None, *, units: int, chapters: int, seed: int, repeats: int,
                    quiet: bool, live: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    variants: dict[str, dict[str, Any]] = {}
    async with private_database(database_url) as dsn:
        pool = await store.connect(dsn, max_size=4)
        try:
            await store.migrate(pool)
            for name, cjk in (("latin", False), ("cjk", True)):
                with progress_bar(f"{name}: units", units, enabled=live) as bar:
                    def step(n: int, name: str = name, bar: Bar = bar) -> None:
                        bar.update(n)
                        if not quiet and not bar.live and (n % 10 == 0 or n == units):
                            err_console.print(f"[dim]{name}: {n}/{units} units[/]")

                    variants[name] = await bench_variant(pool, cjk=cjk, units=units, chapters=chapters,
                                                         seed=seed, repeats=repeats, progress=step)
        finally:
            await pool.close()
    keys = ("trimmed_tokens_max", "trimmed_tokens_p50", "full_tokens_max", "full_tokens_p50",
            "render_pure_p99_ms", "render_pure_wall_p99_ms", "render_with_db_p99_ms", "wide_full_tokens_max",
            "wide_trimmed_tokens_max")
    worst = {k: max(v[k] for v in variants.values()) for k in keys}
    result: dict[str, Any] = {
        "units": min(v["units"] for v in variants.values()),
        "committed_chars": min(v["committed_chars"] for v in variants.values()),
        **worst,
        "prefix_match_share": min(v["prefix_match_share"] for v in variants.values()),
        "targets": {"trimmed_tokens_max": TARGET_TOKENS["trimmed"], "full_tokens_max": TARGET_TOKENS["full"],
                    "prefix_match_share": TARGET_PREFIX_SHARE, "render_pure_p99_ms": TARGET_PURE_P99_MS,
                    "committed_chars": MIN_COMMITTED_CHARS},
        "variants": variants,
        "seconds": round(time.monotonic() - started, 1),
    }
    result["met"] = _verdicts(result)
    result["ok"] = all(result["met"].values())
    return result


def _print(r: dict[str, Any]) -> None:
    def mark(ok: bool) -> str:
        return "ok  " if ok else "MISS"

    echo = typer.echo
    echo(f"bench pack: {r['units']} units per variant, profile bounded, {r['seconds']} s "
         "(est. tokens: 1 per CJK character, 1 per 4 other characters)")
    for name, v in r["variants"].items():
        met = _verdicts({**v})
        echo(f"\n{name}: {v['units']} units, {v['committed_chars']:,} committed characters   "
             f"target ≥ {MIN_COMMITTED_CHARS:,}  {mark(met['committed_chars'])}")
        for shape in SHAPES:
            tmax, target = v[f"{shape}_tokens_max"], TARGET_TOKENS[shape]
            share = v[f"{shape}_prefix_match_share"]
            pure99 = v[f"{shape}_render_pure_p99_ms"]
            echo(f"  {shape}")
            echo(f"    est. tokens     max {tmax:>7,}  p50 {v[f'{shape}_tokens_p50']:>7,}   "
                 f"target max ≤ {target:,}  {mark(tmax <= target)}")
            echo(f"    characters      max {v[f'{shape}_chars_max']:>7,}  p50 {v[f'{shape}_chars_p50']:>7,}")
            echo(f"    prefix match    {share:7.1%} of {v['prefix_pairs']} same-chapter pairs   "
                 f"target 100%  {mark(share >= TARGET_PREFIX_SHARE)}")
            echo(f"    render pure     p50 {v[f'{shape}_render_pure_p50_ms']:6.3f} ms  p99 {pure99:6.3f} ms   "
                 f"target p99 ≤ {TARGET_PURE_P99_MS} ms  {mark(pure99 <= TARGET_PURE_P99_MS)}  (thread CPU time)")
            echo(f"      wall clock    p50 {v[f'{shape}_render_pure_wall_p50_ms']:6.3f} ms  "
                 f"p99 {v[f'{shape}_render_pure_wall_p99_ms']:6.3f} ms   (includes time other processes held the CPU)")
            echo(f"    render with DB  p50 {v[f'{shape}_render_with_db_p50_ms']:6.3f} ms  "
                 f"p99 {v[f'{shape}_render_with_db_p99_ms']:6.3f} ms   (read-back + assemble + project)")
            echo(f"    wide profile    est. tokens max {v[f'wide_{shape}_tokens_max']:,} (no target)")
    echo(f"\n{'all targets met' if r['ok'] else 'TARGET MISSED: ' + ', '.join(k for k, ok in r['met'].items() if not ok)}")


def pack(
    units: Annotated[int, typer.Option(min=10, max=600, help="Units (scenes) per variant")] = 60,
    chapters: Annotated[int, typer.Option(min=1, max=120, help="Chapters (units must divide evenly)")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the generated novels")] = 1,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Pure renders timed per unit and shape")] = 5,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="Run in a private database created on this server (default: a private "
                               "embedded PostgreSQL)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Exactly one JSON object on stdout")] = False,
) -> None:
    """Writer-pack sizes, render times and prefix stability on a 60-unit novel (Latin and CJK)."""
    if units % chapters:
        fail(f"--units {units} is not a multiple of --chapters {chapters}", code=2)
    result = run(run_bench(database_url, units=units, chapters=chapters, seed=seed, repeats=repeats,
                           quiet=as_json, live=not as_json))
    if as_json:
        print_json(result)
    else:
        _print(result)
    if not result["ok"]:
        raise typer.Exit(1)
