"""Hypothesis strategies that build valid outlines, commit bodies and NovelSnapshots.

Histories are written the way the driver writes them: next_work picks the unit, the simulated
store (tests.pure.sim) prepares and commits it. Text fields mix English, Chinese, long values
(to exercise truncation) and embedded newlines.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import (
    Chapter,
    Character,
    Foreshadowing,
    LengthBudget,
    LoreEntry,
    NovelConfig,
    NovelFile,
    Outline,
    Relation,
    Scene,
    Story,
)
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from tests.pure.sim import commit, prepare, set_state, snapshot_from_file

# Pure tests must stay fast (< 20 s for the folder): a modest example count, no deadline.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
PURE = settings(max_examples=30, deadline=None, suppress_health_check=_SLOW_OK)
PURE_SLOW = settings(max_examples=12, deadline=None, suppress_health_check=_SLOW_OK)

EN_WORDS = (
    "lamp harbour tide keeper ledger storm cliff rope lantern salt gull door window night dawn "
    "river market bell letter key map ship reef cave stair candle fog shadow coat boots whistle "
    "quiet careful slowly again almost never under above between behind toward after "
    # words the prose guard must not mistake for bookkeeping in ordinary sentences
    "chapter scene unit end part book count words note progress finished continued"
).split()
ZH_WORDS = (
    "灯塔 港口 潮水 守夜人 账簿 风暴 悬崖 绳索 灯笼 盐 海鸥 门 窗 夜色 黎明 河流 集市 钟声 "
    "信 钥匙 地图 船 暗礁 洞穴 楼梯 蜡烛 雾 影子 外套 靴子 口哨 安静 小心 慢慢 又 几乎 "
    "完成 结束 章程 节日 收拾 完整 结局 等待 继续 字里行间"
).split()
NAMES = ["Mara Quill", "Tobias Vane", "Ines Park", "Olu Adebayo", "林晚舟", "沈听雨", "Kai", "Rhea"]


def _sentence(rng: random.Random, min_words: int, max_words: int) -> str:
    if rng.random() < 0.5:
        return "".join(rng.choices(ZH_WORDS, k=rng.randint(min_words, max_words))) + "。"
    return " ".join(rng.choices(EN_WORDS, k=rng.randint(min_words, max_words))).capitalize() + "."


def _paragraph(seed: int, sentences: int) -> str:
    rng = random.Random(seed)
    return " ".join(_sentence(rng, 3, 12) for _ in range(sentences))


# Prose is built from one drawn seed: drawing every word through hypothesis is far too slow
# for the 20 s budget of the pure tests, and shrinking prose wording teaches nothing.
def prose_sentences() -> st.SearchStrategy[str]:
    """One ordinary sentence in English or Chinese."""
    return st.integers(0, 2**32).map(lambda seed: _paragraph(seed, 1))


def prose_paragraphs(*, max_sentences: int = 6) -> st.SearchStrategy[str]:
    """An ordinary paragraph of 1..max_sentences sentences (passes the prose guard)."""
    return st.tuples(st.integers(0, 2**32), st.integers(1, max_sentences)).map(
        lambda p: _paragraph(*p)
    )


# Outline text: usually a sentence or two, sometimes very long (truncation), sometimes with
# newlines (must be collapsed to one line), sometimes arbitrary unicode.
field_text = st.one_of(
    prose_paragraphs(max_sentences=3),
    # long values (truncation) by repetition: drawing hundreds of words is slow
    st.tuples(prose_paragraphs(max_sentences=2), st.integers(2, 60)).map(
        lambda p: " ".join([p[0]] * p[1])
    ),
    st.lists(prose_sentences(), min_size=2, max_size=4).map("\n\n".join),
    st.text(min_size=1, max_size=80),
)
optional_text = st.one_of(st.none(), st.just(""), field_text)


@st.composite
def outlines(
    draw: st.DrawFn,
    *,
    max_chapters: int = 4,
    max_scenes: int = 3,
    max_characters: int = 8,
    participants_from_first: int | None = 6,
) -> Outline:
    """A valid outline. Participants come from the first ``participants_from_first`` declared
    characters (6 keeps every participant in the pack's characters block, PACK-4)."""
    n_chars = draw(st.integers(1, max_characters))
    char_ids = [f"c{i}" for i in range(n_chars)]
    characters = []
    for cid in char_ids:
        relations = [
            Relation(characterId=other, description=draw(field_text))
            for other in draw(st.lists(st.sampled_from(char_ids), max_size=2, unique=True))
        ]
        characters.append(
            Character(
                characterId=cid,
                name=draw(st.sampled_from(NAMES)),
                motivation=draw(st.sampled_from(["", "find the truth"])),
                arc=draw(st.sampled_from(["", "learns to trust"])),
                relations=relations,
                identitySummary=draw(optional_text),
                description=draw(optional_text),
                personality=draw(optional_text),
            )
        )
    n_chapters = draw(st.integers(1, max_chapters))
    chapter_ids = [f"k{i}" for i in range(n_chapters)]
    orders = draw(st.permutations(list(range(1, n_chapters + 1))))
    chapters = [
        Chapter(
            chapterId=cid,
            order=order
            * draw(st.sampled_from([1, 10])),  # not contiguous; 1..4 and 10..40 never collide
            title=draw(st.sampled_from(["", "The Dark Lamp", "灯塔"])),
            purpose=draw(field_text),
            entryCondition=draw(st.sampled_from(["", "dawn"])),
            exitCondition=draw(st.one_of(st.just(""), field_text)),
            keyEvents=draw(st.lists(field_text, max_size=3)),
        )
        for cid, order in zip(chapter_ids, orders, strict=True)
    ]
    cast = char_ids[:participants_from_first] if participants_from_first else char_ids
    scenes = []
    for cid in chapter_ids:
        k = draw(st.integers(1, max_scenes))
        scene_orders = draw(st.permutations(list(range(1, k + 1))))
        for j, order in enumerate(scene_orders):
            scenes.append(
                Scene(
                    sceneId=f"{cid}s{j}",
                    chapterId=cid,
                    order=order,
                    goal=draw(field_text),
                    timeLocation=draw(st.one_of(st.just(""), field_text)),
                    causality=draw(st.one_of(st.just(""), field_text)),
                    conflict=draw(st.one_of(st.just(""), field_text)),
                    expectedChange=draw(st.one_of(st.just(""), field_text)),
                    participants=draw(st.lists(st.sampled_from(cast), max_size=3, unique=True)),
                    continuationAnchor=draw(optional_text),
                )
            )
    keys = st.lists(st.sampled_from([*EN_WORDS, *ZH_WORDS, *NAMES]), max_size=3)
    lore = [
        LoreEntry(
            entryId=f"l{i}",
            keys=draw(keys),
            content=draw(field_text),
            disabled=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    chapter_refs = st.one_of(st.none(), st.sampled_from(chapter_ids))
    foreshadowing = [
        Foreshadowing(
            id=f"f{i}",
            description=draw(field_text),
            plantAt=draw(chapter_refs),
            payoffAt=draw(chapter_refs),
            required=draw(st.booleans()),
            status=draw(st.sampled_from(["open", "planted", "resolved"])),
        )
        for i in range(draw(st.integers(0, 15)))
    ]
    story = Story(
        premise=draw(field_text),
        theme=draw(st.one_of(st.just(""), field_text)),
        mainConflict=draw(st.one_of(st.just(""), field_text)),
        endingDirection=draw(st.one_of(st.just(""), field_text)),
        taboos=draw(st.lists(field_text, max_size=3)),
        style=draw(st.one_of(st.just(""), field_text)),
    )
    return Outline(
        story=story,
        chapters=chapters,
        scenes=scenes,
        characters=characters,
        lore=lore,
        foreshadowing=foreshadowing,
    )


budgets = st.one_of(
    st.just(LengthBudget(kind="unbounded")),
    st.builds(
        LengthBudget,
        kind=st.just("target"),
        targetCharacters=st.integers(1, 200_000),
        toleranceRatio=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.99]),
    ),
)


@st.composite
def bodies(
    draw: st.DrawFn, participants: list[str], *, completed: bool | None = None
) -> CommitBody:
    """A valid commit body (passes check_body and the prose guard)."""
    paragraphs = draw(st.lists(prose_paragraphs(), min_size=1, max_size=4))
    done = draw(st.booleans()) if completed is None else completed
    changes = []
    for _ in range(draw(st.integers(0, 3))):
        about = (
            draw(st.lists(st.sampled_from(participants), max_size=2, unique=True))
            if participants
            else []
        )
        changes.append(
            CanonChange(
                kind=draw(st.sampled_from(["event", "character-state", "relation"])),
                summary=draw(prose_sentences()),
                sources=[f"inline#{draw(st.integers(0, len(paragraphs) - 1))}"],
                detail=draw(st.one_of(st.none(), prose_sentences())),
                character_ids=about,
            )
        )
    return CommitBody(
        paragraphs=paragraphs,
        scene_completion=SceneCompletion(
            completed=done,
            basis=draw(prose_sentences()),
            outstanding_goals=[] if done else draw(st.lists(prose_sentences(), max_size=2)),
            next_anchor=None if done else draw(st.one_of(st.none(), prose_sentences())),
        ),
        canon_changes=changes,
    )


def base_snapshot(
    outline: Outline, budget: LengthBudget, *, title: str = "A Test Novel"
) -> NovelSnapshot:
    novel = NovelFile(title=title, config=NovelConfig(length=budget), outline=outline)
    return snapshot_from_file(novel)


@st.composite
def histories(
    draw: st.DrawFn,
    *,
    outline: st.SearchStrategy[Outline] | None = None,
    max_units: int = 10,
) -> NovelSnapshot:
    """A snapshot after a drawn number of units written in next_work order (nothing claimed)."""
    snapshot = base_snapshot(draw(outline if outline is not None else outlines()), draw(budgets))
    for _ in range(draw(st.integers(0, max_units))):
        decision = next_work(snapshot)
        if not isinstance(decision, WriteUnit):
            break
        snapshot, unit_id = prepare(snapshot, decision)
        assert snapshot.outline is not None
        scene = snapshot.outline.scene(decision.scene_id)
        # Force completion after three fragments so histories move through the book.
        completed = True if decision.fragment >= 3 else None
        snapshot = commit(snapshot, unit_id, draw(bodies(scene.participants, completed=completed)))
    return snapshot


def claim_next(snapshot: NovelSnapshot) -> tuple[NovelSnapshot, UnitView] | None:
    """Prepare and claim the next unit, as the driver and claim manager would."""
    decision = next_work(snapshot)
    if not isinstance(decision, WriteUnit):
        return None
    snapshot, unit_id = prepare(snapshot, decision)
    snapshot = set_state(snapshot, unit_id, "claimed")
    unit = next(u for u in snapshot.units if u.unit_id == unit_id)
    return snapshot, unit


@st.composite
def claimed_snapshots(
    draw: st.DrawFn, *, outline: st.SearchStrategy[Outline] | None = None
) -> tuple[NovelSnapshot, UnitView]:
    """A history plus the next unit claimed: the input of render_pack."""
    snapshot = draw(histories(outline=outline))
    claimed = claim_next(snapshot)
    if claimed is None:  # the book is finished: claim the first unit of a fresh history instead
        assert snapshot.outline is not None
        claimed = claim_next(base_snapshot(snapshot.outline, snapshot.config.length))
        assert claimed is not None
    return claimed
