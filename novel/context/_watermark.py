"""The extraction watermark a freeze read at, and the facts as of it (CTX-11; ADR 0007).

Extraction runs after the commit it reads and in any order against the context reads, so the
extracted facts visible at a given asOf grow as extractions land. A freeze names what it saw:
the novel's ``canonSource`` and the seq ranges of the commits at or before asOf whose extraction
ledger row its read could see (``extracted``). An extraction is written once, with its facts, by
one statement and never changed (ROLE-3), so the facts of those commits are the same whenever
they are read again: re-assembly keeps exactly them and drops the ones extracted since.

The watermark is content, not time — two reads that saw the same extractions have the same
watermark — so re-rendering one context still writes one freeze row (CTX-6).

``superseded`` names the units, among those with a commit at or before asOf, that were
superseded when the freeze read them: superseding happens after the fact (an outline revision),
and a superseded unit's prose leaves the continuity baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import compress
from operator import attrgetter
from typing import TypeVar

import msgspec

from novelbus.novel.snapshot import CommitView, UnitView

T = TypeVar("T")
_COMMIT_ID, _SEQ = attrgetter("commit_id"), attrgetter("seq")
_UNIT_ID, _STATE = attrgetter("unit_id"), attrgetter("state")


class Watermark(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """What a freeze read of the state that changes after a commit (CTX-11)."""

    canon_source: str  # the novel's config.canonSource at the freeze
    extracted: tuple[tuple[int, int], ...] = ()  # inclusive seq ranges whose extraction was read
    superseded: tuple[str, ...] = ()  # units with a commit at or before asOf, superseded then
    # CTX-13: the freeze date references' expiry was checked against (only when there are any)
    references_on: str | None = None


def seq_ranges(seqs: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted seqs as inclusive ranges: ``[1, 2, 3, 5]`` → ``((1, 3), (5, 5))``."""
    ordered = sorted(set(seqs))
    if ordered and ordered[-1] - ordered[0] + 1 == len(ordered):  # one run, the usual case: no loop
        return ((ordered[0], ordered[-1]),)
    out: list[tuple[int, int]] = []
    for s in ordered:
        if out and out[-1][1] + 1 == s:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return tuple(out)


def in_ranges(seq: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(lo <= seq <= hi for lo, hi in ranges)


def watermark_of(
    commits: list[CommitView],
    extracted: Mapping[str, object] | None,
    canon_source: str,
    units: list[UnitView],
    references_on: str | None = None,
) -> Watermark:
    """The watermark of one read: ``commits`` are those at or before asOf, ``extracted`` the
    extraction rows the read saw by commit id (None: the canon does not use them). SERVE-8: the
    same lists and mapping as a recent read (read only, shared by reads that found nothing new)
    give that read's watermark again, without a pass over the book."""
    key = (id(commits), id(extracted), id(units), canon_source, references_on)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is commits and hit[1] is extracted and hit[2] is units:
        return hit[3]
    mark = _watermark_of(commits, extracted, canon_source, units, references_on)
    _RECENT[key] = (commits, extracted, units, mark)  # held, so their ids are not reused meanwhile
    while len(_RECENT) > 16:
        del _RECENT[next(iter(_RECENT))]
    return mark


_RECENT: dict[tuple[int, int, int, str, str | None],
              tuple[list[CommitView], Mapping[str, object] | None, list[UnitView], Watermark]] = {}


def _watermark_of(
    commits: list[CommitView],
    extracted: Mapping[str, object] | None,
    canon_source: str,
    units: list[UnitView],
    references_on: str | None,
) -> Watermark:
    # SERVE-8: the passes over every commit and unit run in C (`map`), not a Python step each
    read: tuple[tuple[int, int], ...] = ()
    if extracted is not None and canon_source != "writer":
        read = seq_ranges(compress(map(_SEQ, commits), map(extracted.__contains__, map(_COMMIT_ID, commits))))
    superseded: tuple[str, ...] = ()
    if "superseded" in map(_STATE, units):
        with_commits = set(map(_UNIT_ID, commits))
        superseded = tuple(
            sorted(u.unit_id for u in units if u.state == "superseded" and u.unit_id in with_commits)
        )
    return Watermark(canon_source=canon_source, extracted=read, superseded=superseded, references_on=references_on)


class WatermarkError(Exception):
    """The store no longer holds what a watermark names (an extraction row went missing)."""


def facts_as_of(
    watermark: Watermark, extracted: Mapping[str, T], commits: list[CommitView]
) -> dict[str, T]:
    """The extracted rows a read at ``watermark`` saw, from the rows the store holds now:
    exactly those of the commits in its ranges. Raises WatermarkError naming the first commit
    in the ranges whose extraction is not in the store (rows are only ever inserted)."""
    kept: dict[str, T] = {}
    for c in commits:
        if in_ranges(c.seq, watermark.extracted):
            if c.commit_id not in extracted:
                raise WatermarkError(
                    f"the extraction of {c.commit_id} named by the watermark is not in the store"
                )
            kept[c.commit_id] = extracted[c.commit_id]
    return kept


def units_as_of(
    watermark: Watermark, units: list[UnitView], commits: list[CommitView]
) -> list[UnitView]:
    """The units with the superseded states the freeze saw: a unit with a commit at or before
    asOf is superseded exactly when the watermark says so (a unit superseded since reads as the
    committed unit it was; units with no such commit are as the store holds them)."""
    with_commits = {c.unit_id for c in commits}
    named = set(watermark.superseded)
    out = []
    for u in units:
        if u.unit_id in with_commits:
            if u.unit_id in named and u.state != "superseded":
                u = msgspec.structs.replace(u, state="superseded")
            elif u.unit_id not in named and u.state == "superseded":
                u = msgspec.structs.replace(u, state="committed")
        out.append(u)
    return out
