"""The trusted reader of the role projections (CTX-8, ROLE-1): a role's inputs from the store.

`load_role_inputs` freezes the unit's context under the role's scenario (`store.load_context`:
one REPEATABLE READ READ ONLY read-back, CTX-4) and adds what the role needs beside it — the
candidate under review (the unit's committed body unless one is given), the commit whose prose
the extractor reads with its chapter's canon so far (the writer's and the extractor's, for
de-duplication), the planner's structural snapshot at asOf, the judge's outline. The projection
itself is pure (`novel.roles.project`). Nothing here writes.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.roles import (
    CANDIDATE_ROLES,
    SCENARIO_OF,
    Candidate,
    RoleInputError,
    RoleInputs,
    check_role,
    planner_snapshot,
    role_inputs,
)
from novelbus.novel.snapshot import CommitView, NovelSnapshot
from novelbus.store._db import Db
from novelbus.store.commits import CommitRow, get_commit_for_unit, get_commit_for_unit_with
from novelbus.store.context import load_context
from novelbus.store.extraction import chapter_canon_sql, decode_changes, extracted_canon
from novelbus.store.snapshots import load_snapshot, merged_view


def rewrite_inline(source: str, commit_id: str) -> str:
    """A writer's own source ``inline[#p]`` as the stored pointer ``commit-N[#p]`` (STORE-3)."""
    return commit_id + source[len("inline"):] if source.startswith("inline") else source


def _commit_view(row: CommitRow | None) -> CommitView | None:
    if row is None or row.body is None:
        return None
    body = row.body
    changes = [msgspec.structs.replace(ch, sources=[rewrite_inline(s, row.commit_id) for s in ch.sources])
               for ch in body.canon_changes]
    return CommitView(
        commit_id=row.commit_id, seq=row.seq, unit_id=row.unit_id, chapter_id=row.chapter_id,
        scene_id=row.scene_id, paragraphs=list(body.paragraphs), scene_completion=body.scene_completion,
        canon_changes=changes, effective_characters=row.effective_chars, body_hash=row.body_hash,
        paragraph_count=len(body.paragraphs),
    )


async def unit_commit_view(pool: Db, novel_id: str, unit_id: str) -> CommitView | None:
    """The unit's commit with its prose and its writer's canon facts (pointers rewritten), or None."""
    return _commit_view(await get_commit_for_unit(pool, novel_id, unit_id))


class _ExtractorCommit(msgspec.Struct, frozen=True):
    commit: CommitView | None
    known: list[CanonChange] = []  # the chapter's canon before the commit (de-duplication)


async def _extractor_commit(pool: Db, novel_id: str, unit_id: str) -> _ExtractorCommit:
    """What the extractor reads beside its context, in one statement."""
    row, record = await get_commit_for_unit_with(
        pool, novel_id, unit_id, chapter_canon_sql("k.novel_id", "k.chapter_id", "k.seq - 1") + " AS known")
    if row is None or record is None:
        return _ExtractorCommit(None)
    return _ExtractorCommit(_commit_view(row), decode_changes(record["known"]))


async def planning_snapshot(pool: Db, novel_id: str, *, as_of: int | None = None) -> NovelSnapshot:
    """The planner's structural view at ``as_of`` (None: the latest commit), its commits' canon
    under ``config.canonSource`` (the extractor's facts merged as the packs see them, ROLE-3)."""
    snapshot = await load_snapshot(pool, novel_id, as_of_seq=as_of, prose=False)
    at = snapshot.as_of_seq if as_of is None else as_of
    if snapshot.config.canonSource != "writer":
        extracted = await extracted_canon(pool, novel_id, up_to=at)
        commits = [merged_view(c, extracted.get(c.commit_id, []), snapshot.config.canonSource)
                   for c in snapshot.commits]
        snapshot = msgspec.structs.replace(snapshot, commits=commits)
    return planner_snapshot(snapshot, at)


async def load_role_inputs(
    pool: Db,
    *,
    novel_id: str,
    unit_id: str,
    role: str,
    purpose: str,
    profile: str,
    as_of: int | None = None,
    candidate: Candidate | None = None,
    shape: Literal["full", "trimmed"] = "full",
    other: Candidate | None = None,
) -> RoleInputs:
    """A role's inputs for a unit (module docstring). The extractor reads the unit's commit, so
    its asOf is the commit before it (an ``as_of`` given for it is refused); the commit, its
    prose and the chapter's canon before it (de-duplication) come in one read. Raises
    RoleInputError (unknown role, missing commit or candidate) and what `load_context` raises.

    Not the writer's own frozen context (`refreeze`): the extractor of the commit before may land
    after that context was frozen, so the writer's context read back at its asOf can differ; at
    the commit before, every earlier commit is extracted first (the keeper goes in commit order),
    and the context read back is the one extracted with (CTX-9)."""
    name = check_role(role)
    commit = None
    known: list[CanonChange] | None = None  # the extractor's de-duplication knowledge
    if name == "extractor":
        if as_of is not None:
            raise RoleInputError("the extractor reads the unit's commit: its asOf is fixed, drop --as-of")
        read = await _extractor_commit(pool, novel_id, unit_id)
        commit, known = read.commit, read.known
        if commit is None:
            raise RoleInputError(f"unit {unit_id!r} has no commit for the extractor to read")
        as_of = commit.seq - 1
    frozen = await load_context(pool, novel_id=novel_id, unit_id=unit_id, scenario=SCENARIO_OF[name],
                                purpose=purpose, profile=profile, as_of=as_of)
    if name in CANDIDATE_ROLES and candidate is None:
        own = await unit_commit_view(pool, novel_id, unit_id)
        if own is None:
            raise RoleInputError(
                f"unit {unit_id!r} has no committed body: give the candidate to review (--candidate FILE)")
        candidate = Candidate(paragraphs=own.paragraphs)
    snapshot, outline = None, None
    at = frozen.context.request.as_of
    if name == "planner":
        snapshot = await planning_snapshot(pool, novel_id, as_of=at)
    if name == "judge":
        outline = (await load_snapshot(pool, novel_id, as_of_seq=at, prose=False)).outline
    return role_inputs(name, frozen, candidate=candidate, commit=commit, snapshot=snapshot, shape=shape,
                       known_canon=known, outline=outline, other=other)
