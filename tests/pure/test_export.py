"""Markdown export (OPS-1): title, chapter headings in order, committed prose in scene order."""

from __future__ import annotations

import msgspec

from novelbus.novel.export import export_markdown
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.snapshot import NovelSnapshot
from tests.pure.sim import golden_body, set_state, snapshot_from_file, write_book


def finished_sample() -> NovelSnapshot:
    return write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)[-1][
        0
    ]


def test_export_markdown_structure() -> None:
    snapshot = finished_sample()
    md = export_markdown(snapshot)
    assert md.startswith("# The Keeper's Ledger\n\n## The Dark Lamp\n\n")
    assert md.endswith("\n") and not md.endswith("\n\n")
    headings = [line for line in md.split("\n") if line.startswith("## ")]
    assert headings == ["## The Dark Lamp", "## Beneath Gull Rock", "## The Storm Light"]
    paragraphs = [p for c in snapshot.commits for p in c.paragraphs]
    body = md[:-1].split("\n\n")
    assert [b for b in body if not b.startswith("#")] == paragraphs


def test_export_follows_outline_scene_order_not_write_order() -> None:
    snapshot = finished_sample()
    # commits listed in reverse: export still follows outline order and seq within a scene
    reordered = msgspec.structs.replace(snapshot, commits=list(reversed(snapshot.commits)))
    assert export_markdown(reordered) == export_markdown(snapshot)


def test_export_excludes_superseded_units_and_empty_chapters() -> None:
    snapshot = finished_sample()
    last = snapshot.commits[-1]
    without = set_state(snapshot, last.unit_id, "superseded")
    md = export_markdown(without)
    assert last.paragraphs[0] not in md
    early = msgspec.structs.replace(snapshot, commits=snapshot.commits[:2])
    md = export_markdown(early)
    assert "## The Dark Lamp" in md and "## Beneath Gull Rock" not in md


def test_export_without_outline_is_just_the_title() -> None:
    snapshot = msgspec.structs.replace(finished_sample(), outline=None)
    assert export_markdown(snapshot) == "# The Keeper's Ledger\n"
