"""Golden writer packs of the sample novel (PACK-1, PACK-2, PACK-5).

The sample is written to the end with a fixed deterministic body (tests.pure.sim.golden_body);
the first, a middle and the last unit are rendered in both shapes and compared byte for byte
with tests/pure/golden/. Regenerate after an intended change with:

    NOVELBUS_UPDATE_GOLDEN=1 .venv/bin/pytest tests/pure/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from novelbus.novel.outline import parse_novel_file
from novelbus.novel.pack import render_pack
from novelbus.novel.sample import sample_novel_bytes
from tests.pure.sim import golden_body, snapshot_from_file, write_book

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NOVELBUS_UPDATE_GOLDEN") == "1"

BOOK = write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)[:-1]
POSITIONS = {"first": 0, "middle": len(BOOK) // 2, "last": len(BOOK) - 1}


@pytest.mark.parametrize("shape", ["full", "trimmed"])
@pytest.mark.parametrize("position", list(POSITIONS))
def test_golden_sample_pack(position: str, shape: str) -> None:
    """PACK-1"""
    snapshot, unit_id = BOOK[POSITIONS[position]]
    pack = render_pack(snapshot, unit_id, shape)  # type: ignore[arg-type]
    path = GOLDEN / f"sample-{position}-{shape}.txt"
    data = pack.text.encode("utf-8")
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(data)
    assert path.exists(), f"missing {path.name}: run with NOVELBUS_UPDATE_GOLDEN=1"
    assert path.read_bytes() == data, f"{path.name} changed: review, then NOVELBUS_UPDATE_GOLDEN=1"
