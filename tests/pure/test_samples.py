"""The bundled demo novel and the synthetic novel generator."""

from __future__ import annotations

import pytest

from novelbus.bench.generate import generate_novel_file
from novelbus.novel.next_work import Blocked, Finish, next_work
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.pack import render_pack
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.text import is_cjk
from tests.pure.sim import golden_body, snapshot_from_file, write_book


def test_sample_novel_validates_and_has_the_promised_shape() -> None:
    novel = parse_novel_file(sample_novel_bytes())
    o = novel.outline
    assert novel.novelId is None and novel.title
    assert len(o.chapters) == 3 and len(o.scenes) == 9
    assert all(len(o.scenes_of(c.chapterId)) == 3 for c in o.chapters)
    assert len(o.characters) == 4
    for c in o.characters:
        assert c.identitySummary and c.description and c.personality and c.relations
    assert len(o.lore) >= 4 and all(entry.keys for entry in o.lore)
    assert len(o.foreshadowing) >= 3
    assert any(f.required and f.plantAt and f.payoffAt for f in o.foreshadowing)
    budget = novel.config.length
    assert (budget.kind, budget.targetCharacters, budget.toleranceRatio) == ("target", 9_000, 0.3)


def test_sample_novel_writes_to_the_end_in_both_shapes() -> None:
    book = write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)
    for snapshot, unit_id in book[:-1]:
        render_pack(snapshot, unit_id, "full")
        render_pack(snapshot, unit_id, "trimmed")
    assert len(book) - 1 == 12  # 9 scenes, the middle scene of each chapter in two fragments
    # required foreshadowing is resolved by an outline revision, not by prose
    assert isinstance(next_work(book[-1][0]), Blocked)


@pytest.mark.parametrize("cjk", [False, True])
def test_generate_novel_file_is_valid_and_deterministic(cjk: bool) -> None:
    data = generate_novel_file(3, 4, cjk=cjk, seed=7, unit_chars=1_000)
    assert data == generate_novel_file(3, 4, cjk=cjk, seed=7, unit_chars=1_000)
    assert data != generate_novel_file(3, 4, cjk=cjk, seed=8, unit_chars=1_000)
    novel = NovelFile.model_validate(data)
    o = novel.outline
    assert len(o.chapters) == 3 and len(o.scenes) == 12
    assert 4 <= len(o.characters) <= 8
    assert len(o.lore) >= 4 and len(o.foreshadowing) >= 3
    assert any(f.required for f in o.foreshadowing)
    assert novel.config.length.targetCharacters == 12_000
    assert novel.config.length.toleranceRatio == 0.3
    goals = "".join(s.goal for s in o.scenes)
    assert any(is_cjk(ch) for ch in goals) == cjk


@pytest.mark.parametrize("seed", range(6))
def test_generated_novels_render_every_unit(seed: int) -> None:
    novel = NovelFile.model_validate(generate_novel_file(2, 3, cjk=seed % 2 == 1, seed=seed))
    book = write_book(snapshot_from_file(novel), golden_body)
    assert len(book) > 6
    for snapshot, unit_id in book[:-1]:
        full = render_pack(snapshot, unit_id, "full")
        trimmed = render_pack(snapshot, unit_id, "trimmed")
        assert "lore" in full.blocks
        # PACK-5 size targets hold for ordinary outlines, Chinese included
        assert full.est_tokens <= 25_000 and trimmed.est_tokens <= 8_000
    assert isinstance(next_work(book[-1][0]), Blocked | Finish)


def test_generate_rejects_nonsense_sizes() -> None:
    with pytest.raises(ValueError):
        generate_novel_file(0, 3)
