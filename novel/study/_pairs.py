"""STUDY-1 / STUDY-3: which scenes are sampled, and in which order each reviewer sees a pair.

Pure and seeded: the same registration gives the same sample, orders and positions wherever it
is computed, so a restart changes nothing a reviewer sees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SceneKey = tuple[str, str]  # (chapterId, sceneId)


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def sample_scenes(scenes: Sequence[SceneKey], *, sample: int | None, seed: int) -> list[SceneKey]:
    """`sample` scenes drawn without replacement by a seeded hash order (all of them when
    `sample` is None or at least their number), returned in reading order."""
    if sample is None or sample >= len(scenes):
        return list(scenes)
    drawn = set(sorted(scenes, key=lambda key: _digest("sample", seed, *key))[:sample])
    return [key for key in scenes if key in drawn]


def a_shows_test(seed: int, pair_index: int, reviewer_index: int) -> bool:
    """Whether text A is the arm under test for this reviewer and pair. A seeded coin per pair,
    flipped for every next reviewer: any two reviewers invited one after the other see each
    pair in opposite orders, so across reviewers every pair is shown both ways (STUDY-3)."""
    coin = _digest("position", seed, pair_index)[0] % 2
    return (coin + reviewer_index) % 2 == 0


def reviewer_order(pair_ids: Sequence[str], *, seed: int, reviewer_index: int) -> list[str]:
    """The order a reviewer meets the pairs in: a seeded shuffle of its own, so reviewers do
    not all tire on the same pairs."""
    return sorted(pair_ids, key=lambda pair: _digest("order", seed, reviewer_index, pair))
