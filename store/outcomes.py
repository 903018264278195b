"""What a step function answers (HOUSE-4): one list shared with SQL.

`store/functions.sql` declares the same values, in the same order, as the PostgreSQL enum type
`nb_outcome` that every step function returns, so SQL cannot answer anything this list does not
hold (tests/store/test_outcomes.py compares the two). The store functions match on these members.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    NOVEL_NOT_FOUND = "novel-not-found"
    NOT_ACTIVE = "not-active"
    FINISHED = "finished"
    OUTLINE_MISSING = "outline-missing"
    SCENE_NOT_FOUND = "scene-not-found"
    REVISION_CONFLICT = "revision-conflict"
    WATERMARK_CONFLICT = "watermark-conflict"
    REQUIREMENTS_OPEN = "requirements-open"
    IN_FLIGHT = "in-flight"
    UNIT_NOT_FOUND = "unit-not-found"
    NOT_CLAIMABLE = "not-claimable"
    NOT_CLAIMED = "not-claimed"
    TOKEN_MISMATCH = "token-mismatch"
    EXISTING = "existing"  # the unit (prepare) or its commit (commit) is there already
    EXHAUSTED = "exhausted"  # prepare: every candidate id is taken; the caller sends the next ones
    PREPARED = "prepared"
    CLAIMED = "claimed"
    CHECK = "check"  # commit: novel.commitcheck.check_body decides, with the facts answered
    COMMITTED = "committed"
    CHANGED = "changed"  # usage: the totals moved since they were read; read again
    DUPLICATE = "duplicate"
    RECORDED = "recorded"
