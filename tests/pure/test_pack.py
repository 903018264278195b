"""Writer pack (SPEC §7, PACK-1..5, CTX-8): layout, limits, stable prefix, fail-loud cases."""

from __future__ import annotations

import hashlib
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.length import narrative_stage, unit_target_range
from novelbus.novel.next_work import WriteUnit, next_work, remaining_scenes
from novelbus.novel.outline import (
    Chapter,
    Character,
    LengthBudget,
    LoreEntry,
    Outline,
    Scene,
    Story,
    outline_revision,
    parse_novel_file,
)
from novelbus.novel.pack import (
    BLOCK_ORDER,
    CANON_FACT_LIMIT,
    CHAPTER_FIELD_LIMIT,
    CHARACTER_LIMIT,
    FORESHADOWING_LIMIT,
    LORE_ENTRY_LIMIT,
    MAX_CANON_FACTS,
    MAX_CHARACTERS,
    MAX_FORESHADOWING,
    MAX_LORE_ENTRIES,
    PREFIX_BLOCKS,
    PROSE_TAIL_LIMIT,
    SCENE_FIELD_LIMIT,
    STORY_FIELD_LIMIT,
    TRIMMED_BLOCKS,
    WriterPack,
    WriterPackError,
    block_fields,
    pack_fields,
    parse_pack,
    render_pack,
)
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from novelbus.novel.text import estimate_tokens
from tests.pure.sim import commit, golden_body, prepare, set_state, snapshot_from_file, write_book
from tests.pure.strategies import (
    PURE,
    PURE_SLOW,
    base_snapshot,
    bodies,
    claim_next,
    claimed_snapshots,
    outlines,
)

SHAPES = ("full", "trimmed")


def sample_book() -> list[tuple[NovelSnapshot, str]]:
    return write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)[:-1]


BOOK = sample_book()


def unit_of(snapshot: NovelSnapshot, unit_id: str) -> UnitView:
    return next(u for u in snapshot.units if u.unit_id == unit_id)


# --- layout helpers used by the properties ---------------------------------------------------


def assert_well_formed(pack: WriterPack, snapshot: NovelSnapshot, unit_id: str) -> None:
    """Layout, hashes, sizes and every §7 limit of one pack."""
    text = pack.text
    assert text.startswith(pack.prefix) and text.endswith("\n")
    assert pack.prefix.endswith("\n\n") and "[[scene]]" not in pack.prefix
    assert text[len(pack.prefix) :].startswith("[[scene]]\n")
    assert pack.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert pack.prefix_sha256 == hashlib.sha256(pack.prefix.encode()).hexdigest()
    assert pack.chars == len(text) and pack.est_tokens == estimate_tokens(text)
    assert pack.blocks == [b for b in BLOCK_ORDER if b in pack.blocks]
    allowed = BLOCK_ORDER if pack.shape == "full" else TRIMMED_BLOCKS
    assert set(pack.blocks) <= set(allowed)
    assert {"protocol", "story", "chapter", "scene", "unit"} <= set(pack.blocks)
    headers = re.findall(r"^\[\[([a-z-]+)\]\]$", text, re.MULTILINE)
    assert headers == pack.blocks
    prefix_blocks = re.findall(r"^\[\[([a-z-]+)\]\]$", pack.prefix, re.MULTILINE)
    assert prefix_blocks == [b for b in pack.blocks if b in PREFIX_BLOCKS]
    assert unit_id not in pack.prefix  # PACK-2: nothing per unit in the prefix

    blocks = parse_pack(text)
    assert list(blocks) == pack.blocks
    for name, lines in blocks.items():
        assert lines, f"empty block {name} must be omitted"
        if name != "prose-tail":
            assert "" not in lines, f"blank line inside {name}"
    for name, limit in (
        ("story", STORY_FIELD_LIMIT),
        ("chapter", CHAPTER_FIELD_LIMIT),
        ("scene", SCENE_FIELD_LIMIT),
    ):
        fields = block_fields(blocks[name])
        assert len(fields) == len(blocks[name])
        for key, value in fields.items():
            assert value and len(value) <= limit, (name, key)
    if "characters" in blocks:
        entries: list[list[str]] = []
        for line in blocks["characters"]:
            if line.startswith("- "):
                entries.append([line])
            else:
                assert line.startswith("  ")
                entries[-1].append(line)
        assert 1 <= len(entries) <= MAX_CHARACTERS
        assert all(len("\n".join(e)) <= CHARACTER_LIMIT for e in entries)
    for name, count, limit in (
        ("lore", MAX_LORE_ENTRIES, LORE_ENTRY_LIMIT),
        ("canon", MAX_CANON_FACTS, CANON_FACT_LIMIT),
        ("foreshadowing", MAX_FORESHADOWING, FORESHADOWING_LIMIT),
    ):
        if name in blocks:
            assert len(blocks[name]) <= count
            assert all(line.startswith("- ") and len(line) - 2 <= limit for line in blocks[name])
    if "prose-tail" in blocks:
        assert len("\n".join(blocks["prose-tail"])) <= PROSE_TAIL_LIMIT
    unit = block_fields(blocks["unit"])
    assert unit["unitId"] == unit_id
    assert {"fragment", "targetMin", "targetMax", "stage"} <= set(unit)
    assert int(unit["targetMin"]) <= int(unit["targetMax"])


# --- example-based -------------------------------------------------------------------------


def test_shapes_and_block_order_on_the_sample() -> None:
    """PACK-5"""
    snapshot, unit_id = BOOK[4]  # chapter 2, first scene: canon and lore exist, no prose yet
    full = render_pack(snapshot, unit_id, "full")
    trimmed = render_pack(snapshot, unit_id, "trimmed")
    assert full.blocks == [
        "protocol",
        "story",
        "characters",
        "chapter",
        "scene",
        "lore",
        "canon",
        "foreshadowing",
        "unit",
    ]
    assert trimmed.blocks == ["protocol", "story", "chapter", "scene", "unit"]
    assert full.shape == "full" and trimmed.shape == "trimmed"
    assert "JSON object" in full.text and "novel_body_commit" not in full.text
    assert "novel_body_commit" in trimmed.text and "exactly once" in trimmed.text
    assert trimmed.chars < full.chars
    assert full.est_tokens <= 25_000 and trimmed.est_tokens <= 8_000
    for pack in (full, trimmed):
        assert_well_formed(pack, snapshot, unit_id)


def test_pack_story_chapter_scene_fields_in_fixed_order() -> None:
    snapshot, unit_id = BOOK[0]
    blocks = parse_pack(render_pack(snapshot, unit_id, "full").text)
    assert list(block_fields(blocks["story"])) == [
        "title",
        "premise",
        "theme",
        "mainConflict",
        "endingDirection",
        "taboos",
        "style",
    ]
    assert list(block_fields(blocks["chapter"])) == [
        "chapterId",
        "order",
        "title",
        "purpose",
        "entryCondition",
        "exitCondition",
        "keyEvents",
    ]
    scene = block_fields(blocks["scene"])
    assert list(scene) == [
        "sceneId",
        "order",
        "goal",
        "participants",
        "timeLocation",
        "causality",
        "conflict",
        "expectedChange",
        "continuationAnchor",
    ]
    assert scene["participants"] == "Wren Halloway (wren)"
    assert scene["continuationAnchor"].startswith("The rowing boat grinds")


def test_characters_are_union_of_all_participants_in_declaration_order() -> None:
    """PACK-3"""
    snapshot, unit_id = BOOK[0]  # the scene has one participant; the block still holds all four
    lines = parse_pack(render_pack(snapshot, unit_id, "full").text)["characters"]
    heads = [line for line in lines if line.startswith("- ")]
    assert heads == [
        "- Wren Halloway (wren)",
        "- Elias Penhallow (elias)",
        "- Marta Crewe (marta)",
        "- Corwin Slade (corwin)",
    ]


def test_pack_continuation_anchor_and_outstanding_goals_come_from_the_previous_unit() -> None:
    index = next(i for i, (s, u) in enumerate(BOOK) if unit_of(s, u).fragment == 2)
    snapshot, unit_id = BOOK[index]
    scene = block_fields(parse_pack(render_pack(snapshot, unit_id, "trimmed").text)["scene"])
    previous = snapshot.commits[-1].scene_completion
    assert scene["continuationAnchor"] == previous.next_anchor
    assert scene["outstandingGoals"] == "Finish what the scene set out to do."
    unit = block_fields(parse_pack(render_pack(snapshot, unit_id, "trimmed").text)["unit"])
    assert unit["fragment"] == "2"


def test_pack_prose_tail_is_raw_tail_of_current_chapter_only() -> None:
    snapshot, unit_id = BOOK[3]  # chapter 1, third unit (the continuation of scene 2 committed)
    unit = unit_of(snapshot, unit_id)
    tail_lines = parse_pack(render_pack(snapshot, unit_id, "trimmed").text)["prose-tail"]
    chapter_text = "\n\n".join(
        p for c in snapshot.commits if c.chapter_id == unit.chapter_id for p in c.paragraphs
    )
    tail_text = "\n".join(tail_lines)
    assert len(tail_text) <= PROSE_TAIL_LIMIT
    assert tail_text.startswith("…")
    assert chapter_text.endswith(tail_text[1:])
    # first unit of chapter 2: chapter 1's prose is not carried over
    snapshot, unit_id = BOOK[4]
    assert "prose-tail" not in render_pack(snapshot, unit_id, "full").blocks


def test_pack_canon_only_participant_state_and_relation_facts_most_recent_last() -> None:
    snapshot, unit_id = BOOK[-1]
    canon = parse_pack(render_pack(snapshot, unit_id, "full").text)["canon"]
    assert len(canon) == MAX_CANON_FACTS
    seqs = [int(re.match(r"- commit-(\d+) ", line).group(1)) for line in canon]  # type: ignore[union-attr]
    assert seqs == sorted(seqs) and seqs[-1] == snapshot.as_of_seq
    assert all(" event " not in line for line in canon)
    scene = snapshot.outline.scene(unit_of(snapshot, unit_id).scene_id)  # type: ignore[union-attr]
    for line in canon:
        assert any(f"({p})" in line.split("]:")[0] for p in scene.participants)


def test_pack_lore_matches_scene_keywords_skips_disabled_and_caps() -> None:
    for snapshot, unit_id in BOOK:
        lore = parse_pack(render_pack(snapshot, unit_id, "full").text).get("lore", [])
        assert len(lore) <= MAX_LORE_ENTRIES
        assert not any(line.startswith("- old-song:") for line in lore)
    snapshot, unit_id = BOOK[0]  # "Gull Rock lighthouse", "Porthwenna"
    lore = parse_pack(render_pack(snapshot, unit_id, "full").text)["lore"]
    ids = [line[2:].split(":")[0] for line in lore]
    assert "gull-rock" in ids and "porthwenna" in ids


def test_pack_lore_is_cjk_aware() -> None:
    outline = Outline(
        story=Story(premise="灯塔的故事"),
        chapters=[Chapter(chapterId="k1", order=1)],
        scenes=[
            Scene(
                sceneId="s1",
                chapterId="k1",
                order=1,
                goal="林晚舟在灯塔上发现了密信",
                participants=["lin"],
            )
        ],
        characters=[Character(characterId="lin", name="林晚舟")],
        lore=[
            LoreEntry(entryId="tower", keys=["灯塔"], content="灯塔建于百年前。"),
            LoreEntry(entryId="market", keys=["集市"], content="集市每月开一次。"),
            LoreEntry(entryId="letter", keys=[], content="密信用暗语写成，发现它的人会有危险。"),
        ],
    )
    snapshot, unit = claim_next(base_snapshot(outline, LengthBudget(kind="unbounded")))  # type: ignore[misc]
    lore = parse_pack(render_pack(snapshot, unit.unit_id, "full").text)["lore"]
    assert [line.split(":")[0] for line in lore] == ["- tower", "- letter"]


def test_pack_foreshadowing_unresolved_required_or_planted_by_this_chapter() -> None:
    snapshot, unit_id = BOOK[0]  # chapter 1
    lines = parse_pack(render_pack(snapshot, unit_id, "full").text)["foreshadowing"]
    ids = [line[2:].split(" ")[0] for line in lines]
    assert ids == ["torn-log-page", "paraffin-receipts", "red-scarf"]  # martas-debt: plantAt ch2
    snapshot, unit_id = BOOK[4]  # chapter 2
    lines = parse_pack(render_pack(snapshot, unit_id, "full").text)["foreshadowing"]
    assert [line[2:].split(" ")[0] for line in lines][-1] == "martas-debt"


def test_pack_unit_params_come_from_the_length_functions() -> None:
    snapshot, unit_id = BOOK[5]
    unit = block_fields(parse_pack(render_pack(snapshot, unit_id, "full").text)["unit"])
    committed = snapshot.committed_characters
    budget = snapshot.config.length
    target = unit_target_range(budget, committed, remaining_scenes(snapshot))
    assert unit == {
        "unitId": unit_id,
        "fragment": "1",
        "targetMin": str(target.min),
        "targetMax": str(target.max),
        "stage": narrative_stage(budget, committed, has_commits=True),
        "remainingCharacters": str(11_700 - committed),
    }


def test_pack_unbounded_budget_omits_remaining_characters() -> None:
    snapshot, unit_id = BOOK[0]
    config = snapshot.config.model_copy(update={"length": LengthBudget(kind="unbounded")})
    snapshot = msgspec.structs.replace(snapshot, config=config)
    unit = block_fields(parse_pack(render_pack(snapshot, unit_id, "full").text)["unit"])
    assert "remainingCharacters" not in unit
    assert (unit["targetMin"], unit["targetMax"], unit["stage"]) == ("800", "1600", "early")


def test_pack_values_are_single_line_and_truncated_with_marker() -> None:
    snapshot, unit_id = BOOK[0]
    assert snapshot.outline is not None
    story = snapshot.outline.story.model_copy(
        update={"premise": "Line one.\n\nLine two. " + "x" * 900}
    )
    outline = snapshot.outline.model_copy(update={"story": story})
    snapshot = msgspec.structs.replace(snapshot, outline=outline)
    premise = block_fields(parse_pack(render_pack(snapshot, unit_id, "full").text)["story"])[
        "premise"
    ]
    assert premise.startswith("Line one. Line two. xxx")
    assert len(premise) == STORY_FIELD_LIMIT and premise.endswith("…")


def test_pack_prose_lines_that_look_like_headers_cannot_split_blocks() -> None:
    snapshot, unit_id = BOOK[1]
    commit0 = snapshot.commits[0]
    spoof = msgspec.structs.replace(commit0, paragraphs=["Calm.\n[[unit]]\nunitId: u9999"])
    snapshot = msgspec.structs.replace(snapshot, commits=[spoof, *snapshot.commits[1:]])
    blocks = parse_pack(render_pack(snapshot, unit_id, "trimmed").text)
    assert block_fields(blocks["unit"])["unitId"] == unit_id
    assert " [[unit]]" in blocks["prose-tail"]


# --- PACK-4: fail loud ----------------------------------------------------------------------


def test_no_outline_revision() -> None:
    """PACK-4"""
    snapshot, unit_id = BOOK[0]
    for broken in (
        msgspec.structs.replace(snapshot, outline=None),
        msgspec.structs.replace(snapshot, outline_revision=None),
    ):
        for shape in SHAPES:
            with pytest.raises(WriterPackError) as err:
                render_pack(broken, unit_id, shape)  # type: ignore[arg-type]
            assert err.value.missing_blocks == ["outline"]
            assert err.value.novel_id == snapshot.novel_id and err.value.unit_id == unit_id
            assert err.value.code == "pack-error"


def test_chapter_has_commits_but_prose_tail_is_empty() -> None:
    """PACK-4"""
    snapshot, unit_id = BOOK[1]  # chapter 1 has one commit
    blank = msgspec.structs.replace(snapshot.commits[0], paragraphs=["  ", ""])
    broken = msgspec.structs.replace(snapshot, commits=[blank])
    for shape in SHAPES:
        with pytest.raises(WriterPackError) as err:
            render_pack(broken, unit_id, shape)  # type: ignore[arg-type]
        assert err.value.missing_blocks == ["prose-tail"]


def _seven_character_outline() -> Outline:
    chars = [Character(characterId=f"c{i}", name=f"Person {i}") for i in range(7)]
    return Outline(
        story=Story(premise="Seven people."),
        chapters=[Chapter(chapterId="k1", order=1)],
        scenes=[
            Scene(
                sceneId="s1",
                chapterId="k1",
                order=1,
                goal="Six meet.",
                participants=[f"c{i}" for i in range(6)],
            ),
            Scene(
                sceneId="s2",
                chapterId="k1",
                order=2,
                goal="The seventh arrives.",
                participants=["c6", "c0"],
            ),
        ],
        characters=chars,
    )


def test_participant_covered_by_neither_characters_nor_canon() -> None:
    """PACK-4"""
    snapshot = base_snapshot(_seven_character_outline(), LengthBudget(kind="unbounded"))
    claimed = claim_next(snapshot)
    assert claimed is not None
    snapshot, unit = claimed
    done = CommitBody(
        paragraphs=["They met."], scene_completion=SceneCompletion(completed=True, basis="met")
    )
    snapshot = commit(snapshot, unit.unit_id, done)
    claimed = claim_next(snapshot)
    assert claimed is not None
    snapshot, unit = claimed
    with pytest.raises(WriterPackError) as err:
        render_pack(snapshot, unit.unit_id, "full")
    assert err.value.missing_blocks == ["characters", "canon"]
    assert "c6" in str(err.value)
    assert str(err.value).endswith("; missing: characters, canon")
    # trimmed: no characters block by design (PACK-5), the W2 writer reads characters by tool
    assert "characters" not in render_pack(snapshot, unit.unit_id, "trimmed").blocks


def test_participant_covered_by_a_canon_fact_passes() -> None:
    """PACK-4"""
    snapshot = base_snapshot(_seven_character_outline(), LengthBudget(kind="unbounded"))
    claimed = claim_next(snapshot)
    assert claimed is not None
    snapshot, unit = claimed
    fact = CanonChange(
        kind="character-state",
        summary="Person 6 waits outside.",
        sources=["inline#0"],
        character_ids=["c6"],
    )
    body = CommitBody(
        paragraphs=["They met."],
        scene_completion=SceneCompletion(completed=True, basis="met"),
        canon_changes=[fact],
    )
    snapshot = commit(snapshot, unit.unit_id, body)
    claimed = claim_next(snapshot)
    assert claimed is not None
    snapshot, unit = claimed
    pack = render_pack(snapshot, unit.unit_id, "full")
    canon = parse_pack(pack.text)["canon"]
    assert canon == ["- commit-1 character-state [Person 6 (c6)]: Person 6 waits outside."]


def test_unknown_or_superseded_unit() -> None:
    """PACK-4"""
    snapshot, unit_id = BOOK[0]
    with pytest.raises(WriterPackError) as err:
        render_pack(snapshot, "u-nope", "full")
    assert err.value.missing_blocks == ["unit"]
    with pytest.raises(WriterPackError):
        render_pack(set_state(snapshot, unit_id, "superseded"), unit_id, "full")


def test_unit_scene_removed_by_revision() -> None:
    """PACK-4"""
    snapshot, unit_id = BOOK[0]
    assert snapshot.outline is not None
    outline = snapshot.outline.model_copy(
        update={"scenes": [s for s in snapshot.outline.scenes if s.sceneId != "cold-lamp"]}
    )
    broken = msgspec.structs.replace(snapshot, outline=outline)
    with pytest.raises(WriterPackError) as err:
        render_pack(broken, unit_id, "full")
    assert err.value.missing_blocks == ["scene"]


# --- properties -----------------------------------------------------------------------------


@given(claimed_snapshots(), st.sampled_from(SHAPES))
@PURE
def test_same_snapshot_same_bytes(
    claimed: tuple[NovelSnapshot, UnitView], shape: str
) -> None:
    """PACK-1"""
    snapshot, unit = claimed
    a = render_pack(snapshot, unit.unit_id, shape)  # type: ignore[arg-type]
    copy = msgspec.structs.replace(
        snapshot, units=list(snapshot.units), commits=list(snapshot.commits)
    )
    b = render_pack(copy, unit.unit_id, shape)  # type: ignore[arg-type]
    assert a == b
    assert_well_formed(a, snapshot, unit.unit_id)


@given(outlines(max_chapters=3), st.data())
@PURE_SLOW
def test_prefix_stable_within_chapter(outline: Outline, data: st.DataObject) -> None:
    """PACK-3: Every unit of one chapter, within one outline revision, gets byte-identical prefixes."""
    snapshot = base_snapshot(outline, LengthBudget(kind="unbounded"))
    prefixes: dict[tuple[str, str], set[str]] = {}
    for _ in range(25):
        decision = next_work(snapshot)
        if not isinstance(decision, WriteUnit):
            break
        snapshot, unit_id = prepare(snapshot, decision)
        snapshot = set_state(snapshot, unit_id, "claimed")
        for shape in SHAPES:
            pack = render_pack(snapshot, unit_id, shape)  # type: ignore[arg-type]
            prefixes.setdefault((decision.chapter_id, shape), set()).add(pack.prefix_sha256)
        force = True if decision.fragment >= 2 else None
        body = data.draw(bodies(outline.scene(decision.scene_id).participants, completed=force))
        snapshot = commit(snapshot, unit_id, body)
    assert prefixes
    assert all(len(hashes) == 1 for hashes in prefixes.values())


@given(
    claimed_snapshots(), st.sampled_from(SHAPES), st.sampled_from(["premise", "style", "chapter"])
)
@PURE
def test_prefix_changes_with_outline_revision(
    claimed: tuple[NovelSnapshot, UnitView], shape: str, what: str
) -> None:
    """PACK-3"""
    snapshot, unit = claimed
    assert snapshot.outline is not None and snapshot.outline_revision is not None
    outline = snapshot.outline
    if what == "chapter":
        chapters = [
            c.model_copy(update={"purpose": "A new purpose. " + c.purpose})
            for c in outline.chapters
        ]
        revised = outline.model_copy(update={"chapters": chapters})
    else:
        field = getattr(outline.story, what)
        revised = outline.model_copy(
            update={"story": outline.story.model_copy(update={what: "Revised. " + field})}
        )
    revision = outline_revision(snapshot.outline_revision, "revise", revised)
    after = msgspec.structs.replace(snapshot, outline=revised, outline_revision=revision)
    old = render_pack(snapshot, unit.unit_id, shape)  # type: ignore[arg-type]
    new = render_pack(after, unit.unit_id, shape)  # type: ignore[arg-type]
    assert new.prefix_sha256 != old.prefix_sha256
    assert revision not in new.text and snapshot.outline_revision not in old.text


PLANTED = "PLANTEDSECRET"


@given(claimed_snapshots(), st.sampled_from(SHAPES))
@PURE
def test_writer_pack_never_shows_run_ids_hashes_tokens(
    claimed: tuple[NovelSnapshot, UnitView], shape: str
) -> None:
    """CTX-8: Fields the writer must not see are planted with markers; none reaches the pack."""
    snapshot, unit = claimed
    token = "ab" * 32
    units = [
        msgspec.structs.replace(
            u,
            last_error=f"{PLANTED} run-{PLANTED} delegation-{PLANTED} token={token}",
            attempt=987654,
        )
        for u in snapshot.units
    ]
    commits = [msgspec.structs.replace(c, body_hash=f"{PLANTED}{token}") for c in snapshot.commits]
    planted = msgspec.structs.replace(
        snapshot,
        novel_id=f"novel-{PLANTED}",
        pause_reason=f"verdict {PLANTED}",
        outline_revision=f"r-{PLANTED}",
        units=units,
        commits=commits,
        notes=[(f"note-{PLANTED}", f"manifest {PLANTED} {token}")],
    )
    pack = render_pack(planted, unit.unit_id, shape)  # type: ignore[arg-type]
    assert PLANTED not in pack.text
    assert token not in pack.text and "987654" not in pack.text
    assert not re.search(r"[0-9a-f]{32,}", pack.text)
    assert pack.text == render_pack(snapshot, unit.unit_id, shape).text  # type: ignore[arg-type]


@given(claimed_snapshots(outline=outlines(participants_from_first=None)))
@PURE
def test_full_shape_either_covers_every_participant_or_fails_loud(
    claimed: tuple[NovelSnapshot, UnitView],
) -> None:
    """PACK-4"""
    snapshot, unit = claimed
    assert snapshot.outline is not None
    scene = snapshot.outline.scene(unit.scene_id)
    try:
        pack = render_pack(snapshot, unit.unit_id, "full")
    except WriterPackError as err:
        assert err.missing_blocks == ["characters", "canon"]
        return
    blocks = parse_pack(pack.text)
    shown = "\n".join(blocks.get("characters", []) + blocks.get("canon", []))
    for p in scene.participants:
        assert f"({p})" in shown
    render_pack(snapshot, unit.unit_id, "trimmed")  # the trimmed shape never needs coverage


def test_pack_every_unit_of_the_sample_renders_in_both_shapes() -> None:
    for snapshot, unit_id in BOOK:
        for shape in SHAPES:
            assert_well_formed(render_pack(snapshot, unit_id, shape), snapshot, unit_id)  # type: ignore[arg-type]


def test_pack_fields_are_each_blocks_fields_and_each_call_gets_its_own() -> None:
    """PERF-2: the kept parse gives what parsing gives, for every pack of the sample book in
    both shapes, and a caller that edits its dicts changes nobody else's."""
    for snapshot, unit_id in BOOK:
        for shape in SHAPES:
            text = render_pack(snapshot, unit_id, shape).text
            expected = {name: block_fields(lines) for name, lines in parse_pack(text).items()}
            first = pack_fields(text)
            assert first == expected and "unit" in first
            first["unit"]["unitId"] = "edited"
            first.pop("scene")
            assert pack_fields(text) == expected
