"""The sources a context is built from, and the proof that none is after asOf (CTX-4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from novelbus.novel.context._errors import ContextInputError, ContextLeakError
from novelbus.novel.context._request import (
    ContextRequest,
    ProfileBudget,
    RetrievalPlan,
    find_unit,
    plan_retrieval,
    resolve_pointers,
    validate_request,
)
from novelbus.novel.context._watermark import Watermark
from novelbus.novel.next_work import commit_totals, per_object
from novelbus.novel.snapshot import CommitView, NovelSnapshot


class Readback(msgspec.Struct, frozen=True, rename="camel"):
    """How the sources were read: the store proves one REPEATABLE READ READ ONLY transaction."""

    isolation: str  # "repeatable read" (PostgreSQL) or "in-memory snapshot" (pure callers)
    read_only: bool


class ContextSources(msgspec.Struct, frozen=True):
    """Everything the assembler may use: the plan, the index and the prose read by pointer.

    ``index`` holds the novel, outline, units and the commits at or before asOf with their canon
    facts; the assembler takes prose only from ``prose`` (commit id → paragraphs), never from
    ``index`` (the store leaves index paragraphs empty).
    """

    plan: RetrievalPlan
    index: NovelSnapshot
    prose: dict[str, list[str]]
    paragraph_counts: dict[str, int]
    readback: Readback
    watermark: Watermark | None = None  # CTX-11: the extraction state the store read at
    references_on: str | None = None  # CTX-13: the freeze date (ISO) references' expiry is checked at


def default_as_of(commits: Iterable[CommitView], unit_id: str) -> int:
    """asOf when the caller names none: the seq just before the unit's own commit (so a
    committed unit's context is the one its writer saw), else the latest commit seq."""
    latest = 0
    for c in commits:
        if c.unit_id == unit_id:
            return c.seq - 1
        latest = max(latest, c.seq)
    return latest


def check_as_of(request: ContextRequest, latest_seq: int, unit_commit_seq: int | None) -> None:
    """asOf names a commit that exists, and is before the unit's own commit (CTX-1/CTX-4)."""
    if request.as_of > latest_seq:
        raise ContextInputError(
            f"asOf {request.as_of} is after the novel's latest commit {latest_seq}"
        )
    if unit_commit_seq is not None and request.as_of >= unit_commit_seq:
        raise ContextInputError(
            f"asOf {request.as_of} must be before unit {request.unit_id}'s own commit "
            f"(seq {unit_commit_seq})"
        )


def sources_from_snapshot(
    snapshot: NovelSnapshot,
    unit_id: str,
    *,
    scenario: str,
    purpose: str,
    profile: str,
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
    evidence: tuple[str, ...] = (),
    references_on: str | None = None,
) -> ContextSources:
    """The in-memory read-back: the same plan and pointers as the store, over a snapshot
    (``references_on``: the freeze date references are checked at, CTX-13; None: unknown)."""
    unit_commit = next((c.seq for c in snapshot.commits if c.unit_id == unit_id), None)
    resolved = default_as_of(snapshot.commits, unit_id) if as_of is None else as_of
    request = validate_request(
        novel_id=snapshot.novel_id,
        unit_id=unit_id,
        as_of=resolved,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
        evidence=evidence,
    )
    latest = max((c.seq for c in snapshot.commits), default=0)
    check_as_of(request, latest, unit_commit)
    visible = [c for c in snapshot.commits if c.seq <= request.as_of]
    index = msgspec.structs.replace(snapshot, commits=visible, as_of_seq=request.as_of)
    plan = plan_retrieval(
        request,
        snapshot.outline,
        snapshot.outline_revision,
        find_unit(snapshot.units, unit_id),
        budget=budget,
    )
    by_id = {c.commit_id: c for c in visible}
    prose = {cid: list(by_id[cid].paragraphs) for cid in resolve_pointers(plan, index)}
    return ContextSources(
        plan=plan,
        index=index,
        prose=prose,
        paragraph_counts={c.commit_id: c.paragraph_count for c in visible},
        readback=Readback(isolation="in-memory snapshot", read_only=True),
        references_on=references_on,
    )


def _prove_sources(sources: ContextSources) -> int:
    """CTX-4, fail closed: every source at or before asOf, every pointer read back; returns the
    number of sources proven. Errors name ids and versions only.

    Proven once per (frozen) sources object (PERF-2): the store proves what it read and the
    assembly proves what it is given, which is the same object on the packer's path — a second
    pass over every commit and canon fact that could only repeat the first answer. Sources that
    fail are not remembered: they fail again, each time they are given."""
    request = sources.plan.request
    as_of = request.as_of

    def leak(reason: str) -> ContextLeakError:
        return ContextLeakError(request.novel_id, request.unit_id, ["context"], reason)

    if not sources.readback.read_only:
        raise leak("sources were not read in a read-only transaction")
    if sources.readback.isolation not in ("repeatable read", "in-memory snapshot"):
        raise leak(f"sources were read at isolation {sources.readback.isolation!r}")
    commits = sources.index.commits
    last, by_id, facts = _index_facts(sources.index)
    if last > as_of:
        commit = next(c for c in commits if c.seq > as_of)
        raise leak(f"{commit.commit_id} (seq {commit.seq}) is after asOf {as_of}")
    for commit_id in sources.prose:
        if commit_id not in by_id:
            raise leak(f"prose of {commit_id} has no index entry at or before asOf {as_of}")
    unread = [
        cid for cid in resolve_pointers(sources.plan, sources.index) if cid not in sources.prose
    ]
    if unread:
        raise leak(f"planned sources not read back: {', '.join(unread[:5])}")
    return len(by_id) + len(sources.prose) + facts


@per_object
def _index_facts(index: NovelSnapshot) -> tuple[int, Mapping[str, int], int]:
    """The index's highest seq (0: none), its commit ids (as keys) and its canon facts counted,
    once per index (SERVE-8: from the totals of the book so far, rebased on the commits since,
    `commit_totals`; a context and its re-freezes share the index)."""
    totals = commit_totals(index.novel_id, index.commits)
    return totals.max_seq, totals.seqs, totals.canon


# Four objects at most: a pack's sources hold its prose.
prove_sources = per_object(_prove_sources, size=4)
