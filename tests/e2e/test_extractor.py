"""The extractor keeps canon (ROLE-3): after each commit, once per commit, replayed after a crash,
and what it extracted reaches later packs by pointer."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.actors.extraction import CanonKeeper
from novelbus.actors.runtime import Runtime
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.messages import runs as rm
from novelbus.messages.base import tag_of
from novelbus.novel.body import CanonChange
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.pack import parse_pack, render_writer_pack
from novelbus.novel.sample import sample_novel_bytes
from novelbus.store.context import clear_recent_contexts
from novelbus.store.errors import ConfigInvalid
from tests.e2e.conftest import run_novel
from tests.waiting import no_unit_in_flight, wait_until

pytestmark = pytest.mark.timeout(300)
EXTRACTED = tag_of(ev.CanonExtracted)


def novel(*, extractor: str = "offline", canon_source: str = "both", shape: str = "W1") -> NovelFile:
    """The sample novel; Corwin takes part only in the third scene and the last one (so a fact
    about him from early on is still among the newest facts about the last scene's cast)."""
    nf = parse_novel_file(sample_novel_bytes())
    only_corwin_late = {"harbour-office": ["wren", "corwin"], "storm-light": ["wren", "corwin"]}
    scenes = [s.model_copy(update={"participants": only_corwin_late.get(s.sceneId, ["wren"])})
              for s in nf.outline.scenes]
    config = nf.config.model_copy(update={"extractor": extractor, "canonSource": canon_source, "writerShape": shape})
    return nf.model_copy(update={"config": config, "outline": nf.outline.model_copy(update={"scenes": scenes})})


async def keeper_idle(stack: Runtime) -> None:
    await stack.actor("driver").canon.sweep()  # type: ignore[attr-defined]


async def test_every_commit_is_extracted_once_with_one_event_and_sourced_facts(stack: Runtime) -> None:
    """ROLE-3: an offline novel with `extractor: offline`, `canonSource: both` finishes; every
    commit has one ledger row and one `canon.extracted` event (counts only); every fact cites a
    paragraph of its own commit; no fact is recorded twice."""
    novel_id, events = await run_novel(stack, novel())
    await keeper_idle(stack)
    pool = stack.ctx.pool
    commits = await store.list_commits(pool, novel_id)
    ledger = await store.list_extractions(pool, novel_id)
    assert [r.commit_id for r in ledger] == [c.commit_id for c in commits]
    assert all(r.outcome == "extracted" and r.mode == "offline" for r in ledger)
    rows = await pool.fetch("SELECT payload FROM events WHERE novel_id = $1 AND type = $2", novel_id,
                            EXTRACTED)
    assert sorted(r["payload"]["commitId"] for r in rows) == sorted(c.commit_id for c in commits)
    for r in rows:
        assert set(r["payload"]) <= {"type", "novelId", "unitId", "commitId", "mode", "outcome", "proposed", "accepted"}
    facts = await store.extracted_canon(pool, novel_id)
    assert sum(r.accepted for r in ledger) == sum(len(f) for f in facts.values()) > 0
    counts = {c.commit_id: c for c in commits}
    keys: set[tuple[str, str, tuple[str, ...]]] = set()
    for commit_id, changes in facts.items():
        for change in changes:
            assert change.sources, change
            for source in change.sources:
                m = re.fullmatch(r"(commit-\d+)#(\d+)", source)
                assert m is not None and m.group(1) == commit_id
            key = (change.kind, change.summary.lower(), tuple(sorted(change.character_ids)))
            assert key not in keys, key
            keys.add(key)
    assert commits and counts
    # CTX-9: each extraction is bound to the context it was read with — its writer's, assembled
    # under the extraction scenario from this process's freeze — and read back from the store at
    # that context's frozen request it is the same context, byte for byte (the same hash)
    clear_recent_contexts()
    for commit, record in zip(commits, ledger, strict=True):
        inputs = await store.load_role_inputs(pool, novel_id=novel_id, unit_id=commit.unit_id, role="extractor",
                                              purpose="production", profile="bounded")
        assert record.context_hash == inputs.frozen.context_sha256, commit.commit_id
    assert all(r.context_hash and len(r.context_hash) == 64 for r in ledger)


async def test_a_fact_from_an_early_unit_reaches_a_much_later_units_pack(stack: Runtime) -> None:
    """ROLE-3, CTX-3: the extractor's fact about Corwin from the third scene (an early commit) is in
    the canon block of the last scene's pack, many commits later, with its pointer — in the pack
    the writer got and in the pack rebuilt from the store; the writer's canon alone has no such
    fact (the check can fail). The novel is paused once the early scene is committed until the
    keeper has read it (it runs off the unit's path, so a fast book could otherwise outrun it)."""
    seen: dict[tuple[str, str], str] = {}
    pool = stack.ctx.pool

    async def on_run(msg: Any) -> None:
        run = decode(msg.data, rm.RunWriter, msg.headers)
        seen.setdefault((run.novel_id, run.unit_id), run.pack_text)

    sub = await stack.ctx.nc.subscribe(stack.ctx.subjects.runs, cb=on_run)
    try:
        novel_id = await store.create_novel(pool, novel(canon_source="extractor"))
        events: list[Any] = []
        early_done = asyncio.Event()
        finished = asyncio.Event()

        async def on_event(msg: Any) -> None:
            e = decode(msg.data, ev.NovelEvent)
            events.append(e)
            if isinstance(e, ev.UnitCommitted) and not early_done.is_set():
                row = await store.get_commit_for_unit(pool, novel_id, e.unit_id)
                if row is not None and row.scene_id == "harbour-office":
                    await store.pause_novel(pool, novel_id, "user-request")
                    early_done.set()
            if isinstance(e, ev.NovelFinished):
                finished.set()

        esub = await stack.ctx.nc.subscribe(stack.ctx.subjects.events_of(novel_id), cb=on_event)
        await publish_notice(stack.ctx, novel_id, reason="test")
        await asyncio.wait_for(early_done.wait(), 60)
        await no_unit_in_flight(stack, novel_id)  # the unit in flight when it paused settles
        await keeper_idle(stack)
        await store.resume_novel(pool, novel_id)
        await publish_notice(stack.ctx, novel_id, reason="test")
        await asyncio.wait_for(finished.wait(), 120)
        await esub.unsubscribe()
        control_id, _ = await run_novel(stack, novel(extractor="off", canon_source="writer"))
    finally:
        await sub.unsubscribe()
    await keeper_idle(stack)
    commits = await store.list_commits(pool, novel_id)
    early = next(c for c in commits if c.scene_id == "harbour-office")
    late = [c for c in commits if c.scene_id == "storm-light"][-1]
    assert early.seq <= 5 and late.seq - early.seq >= 6, (early.seq, late.seq)
    facts = (await store.extracted_canon(pool, novel_id))[early.commit_id]
    corwin = next(f for f in facts if f.character_ids == ["corwin"])
    assert corwin.sources[0].startswith(early.commit_id + "#")

    def canon_lines(text: str) -> list[str]:
        return parse_pack(text).get("canon", [])

    wanted = f"{early.commit_id} character-state"
    in_writer = [line for line in canon_lines(seen[novel_id, late.unit_id]) if wanted in line and "corwin" in line]
    assert in_writer, canon_lines(seen[novel_id, late.unit_id])
    frozen = await store.load_context(pool, novel_id=novel_id, unit_id=late.unit_id, scenario="generation",
                                      purpose="diagnostic", profile="bounded")
    rebuilt = canon_lines(render_writer_pack(frozen, "full").text)
    assert any(wanted in line and "corwin" in line for line in rebuilt)
    assert any(card.commit_id == early.commit_id and card.verified for card in frozen.context.l2.canon)
    # control: the same book with the writer's canon only
    control = [c for c in await store.list_commits(pool, control_id) if c.scene_id == "storm-light"][-1]
    plain = canon_lines(seen[control_id, control.unit_id])
    assert not any(" is in chapter " in line for line in plain), plain


async def test_a_crashed_keeper_is_replayed_and_nothing_is_doubled(stack: Runtime) -> None:
    """ROLE-3, REL-7: commits whose extraction never ran (the keeper killed) stay pending in the
    store; a new keeper extracts each exactly once; a second pass and a racing keeper with a stale
    list write nothing; a statement that fails half way leaves no ledger row, no fact, no event."""
    driver: Any = stack.actor("driver")
    await driver.canon.stop()  # the keeper dies before any commit
    driver.canon.after_commit = lambda novel_id: None
    novel_id, _ = await run_novel(stack, novel())
    pool = stack.ctx.pool
    pending = await store.pending_extractions(pool, novel_id=novel_id)
    commits = await store.list_commits(pool, novel_id)
    assert [p.commit_id for p in pending] == [c.commit_id for c in commits]
    assert await store.list_extractions(pool, novel_id) == []

    # half way: a fact the table refuses fails the one statement — nothing of it stays
    bad = CanonChange(kind="event", summary="x", sources=[f"{pending[0].commit_id}#0"])
    with pytest.raises(asyncpg.PostgresError):
        await store.save_extraction(pool, (EXTRACTED, {"novel_id": novel_id}),
                                    once_key="k-half", novel_id=novel_id, commit_id=pending[0].commit_id,
                                    seq=pending[0].seq, mode="offline", outcome="nonsense", proposed=1, facts=[bad])
    assert await store.list_extractions(pool, novel_id) == []
    assert not await store.has_event(pool, "k-half")

    fresh, racer = CanonKeeper(stack.ctx), CanonKeeper(stack.ctx)
    done = await asyncio.gather(fresh.sweep(novel_id), *(racer.extract(p) for p in pending))
    assert done[0] + sum(1 for ok in done[1:] if ok) == len(commits)
    assert await fresh.sweep(novel_id) == 0
    ledger = await store.list_extractions(pool, novel_id)
    assert [r.commit_id for r in ledger] == [c.commit_id for c in commits]
    rows = await pool.fetch("SELECT count(*) AS n FROM events WHERE novel_id = $1 AND type = $2",
                            novel_id, EXTRACTED)
    assert rows[0]["n"] == len(commits)
    total = await pool.fetchval("SELECT count(*) FROM extracted_canon WHERE novel_id = $1", novel_id)
    assert total == sum(r.accepted for r in ledger)


async def test_bad_extractor_or_canon_source_values_are_refused_naming_the_field(stack: Runtime) -> None:
    """ROLE-3: `extractor` and `canonSource` accept only their values; a bad one names the field
    and what is allowed."""
    novel_id = await store.create_novel(stack.ctx.pool, novel(extractor="off", canon_source="writer"))
    for path, value, allowed in (("extractor", "sometimes", "'off', 'offline' or 'model'"),
                                 ("canonSource", "judge", "'writer', 'extractor' or 'both'")):
        with pytest.raises(ConfigInvalid) as e:
            await store.configure_novel(stack.ctx.pool, novel_id, {path: value})
        assert path in str(e.value) and allowed in str(e.value), str(e.value)
    row, changed = await store.configure_novel(stack.ctx.pool, novel_id, {"extractor": "offline"})
    assert changed == ["extractor"] and row.config.extractor == "offline"


async def test_the_read_tools_see_the_extracted_canon_under_canon_source(stack: Runtime) -> None:
    """ROLE-3, TOOL-5: a W2 writer reads facts with its tools; with `canonSource: extractor` the
    tools' snapshot carries the extractor's facts (and not the writer's), with `writer` it does not."""
    from novelbus.writers.tools import FactsReadParams, novel_facts_read

    extracted_id, _ = await run_novel(stack, novel(canon_source="extractor", shape="W2"))
    writer_id, _ = await run_novel(stack, novel(canon_source="writer", shape="W2"))
    await keeper_idle(stack)
    read_pool = stack.ctx.read_pool
    assert read_pool is not None
    seen = {}
    for novel_id in (extracted_id, writer_id):
        unit = (await store.list_units(stack.ctx.pool, novel_id))[-1].unit_id
        snapshot, _ = await store.load_tool_snapshot(read_pool, novel_id, unit)
        rows = novel_facts_read(snapshot, FactsReadParams(characterId="corwin"))["rows"]
        seen[novel_id] = [r["summary"] for r in rows]
    assert any(" is in chapter " in s for s in seen[extracted_id]), seen[extracted_id]
    assert not any(" is in chapter " in s for s in seen[writer_id]), seen[writer_id]


async def test_a_novel_whose_extraction_fails_stays_pending_and_stops_no_other(stack: Runtime) -> None:
    """ROLE-3, REL-6: an extraction that raises (here the model provider breaks) leaves that
    novel's commits pending for the next pass, in order, while another novel is extracted."""
    driver: Any = stack.actor("driver")
    await driver.canon.stop()
    driver.canon.after_commit = lambda novel_id: None
    broken_id, _ = await run_novel(stack, novel(extractor="model"))
    fine_id, _ = await run_novel(stack, novel(extractor="offline"))

    class Broken:
        name, label = "broken", "a provider that fails"

        async def complete(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("boom")

    keeper = CanonKeeper(stack.ctx, provider=Broken())  # type: ignore[arg-type]
    done = await keeper.sweep()
    pool = stack.ctx.pool
    assert done == len(await store.list_commits(pool, fine_id))
    assert await store.list_extractions(pool, broken_id) == []
    assert len(await store.pending_extractions(pool, novel_id=broken_id)) == len(await store.list_commits(pool, broken_id))


async def wait_extracted(pool: Any, novel_id: str, n: int, timeout: float = 20.0) -> list[Any]:
    """The novel's extraction ledger once it has `n` rows."""
    async def extracted() -> list[Any] | None:
        ledger = await store.list_extractions(pool, novel_id)
        return ledger if len(ledger) >= n else None

    return await wait_until(extracted, timeout, f"{n} extractions of {novel_id}")


async def test_the_keeper_runs_by_itself_after_commits_and_at_its_start(stack: Runtime) -> None:
    """ROLE-3: nobody calls the keeper: the driver's commits wake it (the ledger fills while and
    after the novel is written), and a keeper that starts finds what was left pending."""
    pool = stack.ctx.pool
    novel_id, _ = await run_novel(stack, novel())
    commits = await store.list_commits(pool, novel_id)
    assert len(await wait_extracted(pool, novel_id, len(commits))) == len(commits)

    driver: Any = stack.actor("driver")
    await driver.canon.stop()
    driver.canon.after_commit = lambda novel_id: None
    left_id, _ = await run_novel(stack, novel())
    left = await store.list_commits(pool, left_id)
    assert await store.list_extractions(pool, left_id) == []
    restarted = CanonKeeper(stack.ctx)
    restarted.start()
    try:
        assert len(await wait_extracted(pool, left_id, len(left))) == len(left)
    finally:
        await restarted.stop()
