"""Next-work selection and the cheap structural completion checks (DRV-1, DRV-5, SPEC §16).

Everything here is a pure function of a NovelSnapshot. Scene completion is keyed by
(chapterId, sceneId) — the original keyed it by scene id alone, so a reused scene id in a
later chapter looked finished. Superseded units, and commits of superseded units, are ignored.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import wraps
from itertools import compress, count
from operator import attrgetter
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import msgspec

from novelbus.novel.length import book_band
from novelbus.novel.outline import Chapter, Outline, Scene
from novelbus.novel.snapshot import CommitView, NovelSnapshot, NovelStatus, UnitView


class WriteUnit(msgspec.Struct, frozen=True, tag="write-unit"):
    """Write the next unit of ``(chapter_id, scene_id)``.

    ``unit_id`` is the scene's existing prepared unit (claim it) or None (prepare one with this
    ``fragment`` and ``continuation_anchor``, then claim it). ``fragment`` is 1 for the scene's
    first unit; a continuation's anchor is the previous commit's ``nextAnchor``, a first unit's
    anchor is the scene's own ``continuationAnchor``.
    """

    chapter_id: str
    scene_id: str
    unit_id: str | None
    fragment: int
    continuation_anchor: str | None


class InFlight(msgspec.Struct, frozen=True, tag="in-flight"):
    """A unit of this novel is claimed; units of one novel are strictly sequential."""

    unit_id: str


OutlineWhy = Literal[
    "no-outline", "no-chapters", "chapter-without-scenes", "requirement-pending", "next-chapter"]


class AwaitOutline(msgspec.Struct, frozen=True, tag="await-outline"):
    """Planning needed: no outline, no chapters, the current chapter has no scenes, a requirement
    is pending, or every outlined chapter is written but more are planned (`plannedChapters`).

    ``why`` is the machine-readable cause (PLAN-2), ``reason`` the human one."""

    reason: str
    why: OutlineWhy = "no-outline"
    chapter_id: str | None = None


class RequirementConflict(msgspec.Struct, frozen=True, tag="requirement-conflict"):
    """A requirement is blocked: nothing is claimed until a clarification or withdrawal resolves it."""

    blocked: int


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    """Every scene is finished and no finish guard is violated."""


class Blocked(msgspec.Struct, frozen=True, tag="blocked"):
    """Every scene is finished but finish guards fail (see ``finish_violations``)."""

    violations: list[str]


class Inactive(msgspec.Struct, frozen=True, tag="inactive"):
    """The novel is paused or finished."""

    status: NovelStatus


WorkDecision: TypeAlias = (
    WriteUnit | InFlight | AwaitOutline | RequirementConflict | Finish | Blocked | Inactive
)


SceneKey: TypeAlias = tuple[str, str]  # (chapterId, sceneId)
A = TypeVar("A")
R = TypeVar("R")


def per_object(fn: Callable[[A], R], size: int = 64) -> Callable[[A], R]:
    """`fn` of a frozen snapshot or outline, computed once per object (by identity; the last
    `size` objects). PERF-2: the driver asks for the same snapshot's scene progress two or three
    times per unit (completed chapters before and after a unit, the next decision), and every
    unit asks for the same outline's scenes by chapter — each a pass over the whole book. The
    result is shared: callers read it and never change it. 64 objects, so that the 40 novels of
    a loaded process do not push a snapshot out between its driver's questions about it."""
    memo: OrderedDict[int, tuple[A, R]] = OrderedDict()

    @wraps(fn)
    def cached(arg: A) -> R:
        hit = memo.get(id(arg))
        if hit is not None and hit[0] is arg:
            memo.move_to_end(id(arg))
            return hit[1]
        value = fn(arg)
        memo[id(arg)] = (arg, value)  # the object is held, so its id is not reused meanwhile
        if len(memo) > size:
            memo.popitem(last=False)
        return value

    return cached


_SEQ, _STATE = attrgetter("seq"), attrgetter("state")
_CHARS, _UNIT_ID = attrgetter("effective_characters"), attrgetter("unit_id")
T = TypeVar("T")


class _Scan(Generic[T]):
    """One scan: the commits it saw (held, so their ids are not reused), their items, and
    len(items) after each commit."""

    __slots__ = ("commits", "items", "ends")

    def __init__(self, commits: tuple[CommitView, ...], items: list[T], ends: list[int]) -> None:
        self.commits, self.items, self.ends = commits, items, ends

    def same(self, commits: Sequence[CommitView]) -> int:
        """How many commits `commits` starts with that this scan saw (the same objects)."""
        seen = self.commits
        if len(seen) <= len(commits) and all(map(operator.is_, seen, commits)):
            return len(seen)
        n = 0
        for a, b in zip(seen, commits, strict=False):
            if a is not b:
                break
            n += 1
        return n


class PrefixScan(Generic[T]):
    """`items(key, commit)` of every commit of a list, concatenated in list order, per key (e.g.
    a novel). SERVE-8 (PERF-2): commit views are immutable and shared between reads, and a book
    grows at its end, so a scan resumes after the longest run of the same commit objects (by
    identity) one of the key's last `per_key` scans saw (a read with the extractor's facts
    merged and one without hold different objects for the same commits), instead of visiting
    every commit of the book again. The last `size` keys are kept; the result is the caller's own
    list."""

    def __init__(self, items: Callable[[Any, CommitView], Iterable[T]], size: int = 256, per_key: int = 3) -> None:
        self._items, self._size, self._per_key = items, size, per_key
        self._last: OrderedDict[Any, list[_Scan[T]]] = OrderedDict()

    def __call__(self, key: Any, commits: Sequence[CommitView]) -> list[T]:
        scans = self._last.get(key)
        if scans is None:
            scans = self._last[key] = []
        best, same = None, 0
        for scan in scans:
            n = scan.same(commits)
            if best is None or n > same:
                best, same = scan, n
        if best is not None and same == len(best.commits):  # all of that scan: extended in place
            scans.remove(best)
            if same < len(commits):
                best.commits = tuple(commits)
            scan = best
        elif best is not None and same:  # a new list that starts as that scan's: it replaces it
            scans.remove(best)
            scan = _Scan(tuple(commits), best.items[:best.ends[same - 1]], best.ends[:same])
        else:  # another list (other objects for the same commits): kept beside the others
            scan = _Scan(tuple(commits), [], [])
        for commit in commits[same:]:
            scan.items.extend(self._items(key, commit))
            scan.ends.append(len(scan.items))
        scans.insert(0, scan)  # the most recent first; the least recent dropped
        del scans[self._per_key:]
        self._last.move_to_end(key)
        while len(self._last) > self._size:
            self._last.popitem(last=False)
        return list(scan.items)


class CommitTotals:
    """What the reads of one commit list ask of it, read only (SERVE-8): seq, paragraph count and
    view by commit id, each chapter's commits in list order, each scene's completion claim (its
    last commit's in list order), the highest seq, the effective characters and the canon facts
    of all of them. Built by `commit_totals`; its dicts are never changed once returned."""

    __slots__ = ("commits", "source", "seqs", "counts", "by_id", "by_chapter", "completion", "max_seq", "chars",
                 "canon", "_done")

    def __init__(self) -> None:
        self.commits: tuple[CommitView, ...] = ()
        self.source: Sequence[CommitView] | None = None  # the list these totals were asked for
        self.seqs: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.by_id: dict[str, CommitView] = {}
        self.by_chapter: dict[str, tuple[CommitView, ...]] = {}
        self.completion: dict[SceneKey, bool] = {}
        self.max_seq, self.chars, self.canon = 0, 0, 0
        self._done: frozenset[SceneKey] | None = None

    @property
    def done(self) -> frozenset[SceneKey]:
        """The scenes whose claim is completion (once per totals)."""
        if self._done is None:
            self._done = frozenset(compress(self.completion, self.completion.values()))
        return self._done

    def _copy(self) -> CommitTotals:
        out = CommitTotals()  # the dicts copied in C: a few microseconds for a long book
        out.commits = self.commits
        out.seqs, out.counts, out.by_id = self.seqs.copy(), self.counts.copy(), self.by_id.copy()
        out.by_chapter, out.completion = self.by_chapter.copy(), self.completion.copy()
        out.max_seq, out.chars, out.canon = self.max_seq, self.chars, self.canon
        return out

    def rebased(self, same: int, commits: Sequence[CommitView]) -> CommitTotals:
        """The totals of `commits`, which start with this list's first `same` commits (the same
        objects): those after them are taken off these totals, and the rest of `commits` added."""
        out = self._copy()
        gone = self.commits[same:]
        for c in reversed(gone):  # each is the last of its chapter's commits left
            del out.seqs[c.commit_id], out.counts[c.commit_id], out.by_id[c.commit_id]
            left = out.by_chapter[c.chapter_id][:-1]
            if left:
                out.by_chapter[c.chapter_id] = left
            else:
                del out.by_chapter[c.chapter_id]
            out.chars -= c.effective_characters
            out.canon -= len(c.canon_changes)
        touched = {(c.chapter_id, c.scene_id) for c in gone}
        for chapter_id, scene_id in touched:  # the claims left
            claims = [c.scene_completion.completed for c in out.by_chapter.get(chapter_id, ()) if c.scene_id == scene_id]
            if claims:
                out.completion[(chapter_id, scene_id)] = claims[-1]
            else:
                del out.completion[(chapter_id, scene_id)]
        if gone and max(c.seq for c in gone) >= out.max_seq:
            out.max_seq = max(out.seqs.values(), default=0)
        for c in commits[same:]:
            out.seqs[c.commit_id] = c.seq
            out.counts[c.commit_id] = c.paragraph_count
            out.by_id[c.commit_id] = c
            out.by_chapter[c.chapter_id] = (*out.by_chapter.get(c.chapter_id, ()), c)
            out.completion[(c.chapter_id, c.scene_id)] = c.scene_completion.completed
            out.max_seq = max(out.max_seq, c.seq)
            out.chars += c.effective_characters
            out.canon += len(c.canon_changes)
        out.commits, out.source = tuple(commits), commits
        if self._done is not None:  # the finished scenes, from these (copied in C, hashes kept)
            touched.update((c.chapter_id, c.scene_id) for c in commits[same:])
            out._done = (self._done - touched) | {k for k in touched if out.completion.get(k)}
        return out


_NO_TOTALS = CommitTotals()
# SERVE-8: the last totals per key (a novel): a few lists, the most recent first — the driver's
# snapshot, a context read with the extractor's facts merged and a read tool's snapshot with its
# chapter's prose hold different objects for the same book (a list of other objects differs at
# its first commit: comparing it costs one step).
_TOTALS: OrderedDict[Any, list[CommitTotals]] = OrderedDict()
TOTALS_KEPT, TOTALS_PER_KEY = 256, 8


def commit_totals(key: Any, commits: Sequence[CommitView]) -> CommitTotals:
    """`CommitTotals` of `commits` (`key`: whose list, e.g. the novel id). SERVE-8: a book grows
    at its end and commit views are immutable and shared between reads, so the kept totals whose
    list starts with the most of `commits` (the same objects: the first that differs is found in
    C) are rebased on it — the commits after that prefix taken off, those of `commits` added —
    not computed again over the whole book. The same list again: the same totals."""
    kept = _TOTALS.get(key)
    if kept is None:
        kept = _TOTALS[key] = []
    _TOTALS.move_to_end(key)
    n = len(commits)
    if kept and kept[0].source is commits and len(kept[0].commits) == n:  # the same list again
        return kept[0]
    best, same, cost = _NO_TOTALS, 0, n  # cost: commits taken off and added (from nothing: n)
    for i, totals in enumerate(kept):
        seen = totals.commits
        m = next(compress(count(), map(operator.is_not, seen, commits)), min(len(seen), n))
        if m == len(seen) == n:
            kept.insert(0, kept.pop(i))
            totals.source = commits  # the same commits: this list finds them at once next time
            return totals
        if len(seen) - m + n - m < cost:
            best, same, cost = totals, m, len(seen) - m + n - m
            if m == len(seen):  # all of it: only the commits after it to add
                break
    out = best.rebased(same, commits)
    kept.insert(0, out)
    del kept[TOTALS_PER_KEY:]
    while len(_TOTALS) > TOTALS_KEPT:
        _TOTALS.popitem(last=False)
    return out


def _foreshadowing_changes(_: str, commit: CommitView) -> list[tuple[str | None, str]]:
    return [(ch.foreshadowing_id, ch.foreshadowing_status) for ch in commit.canon_changes if ch.kind == "foreshadowing"]


_FORESHADOWING = PrefixScan(_foreshadowing_changes)


def latest_completion(novel_id: str, live: Sequence[CommitView]) -> dict[SceneKey, bool]:
    """Whether each scene's latest commit of seq-ordered `live` claims completion (read only;
    SERVE-8: extended from the totals of a list `live` starts with, `commit_totals`)."""
    return commit_totals(novel_id, live).completion


def live_units(snapshot: NovelSnapshot) -> list[UnitView]:
    """Units that are not superseded, in creation order."""
    return [u for u in snapshot.units if u.state != "superseded"]


# SERVE-8: the last seq-ordered lists per novel (a few: reads with and without the extractor's
# facts merged hold different objects). A list that starts with one of them (the same objects)
# and goes on in seq order, or that one starts with, is in seq order: only its new commits are
# looked at, not every one.
_ORDERED: OrderedDict[str, list[list[CommitView]]] = OrderedDict()


def _in_seq_order(novel_id: str, commits: list[CommitView]) -> list[CommitView]:
    """`sorted(commits, key=seq)`: `commits` itself when it is in seq order (read only, as every
    index list), else a new list."""
    kept = _ORDERED.setdefault(novel_id, [])
    _ORDERED.move_to_end(novel_id)
    for i, done in enumerate(kept):
        if done is commits:  # the same list again (SERVE-8: a read that found nothing new)
            return commits
        k = len(done)
        if k and k <= len(commits) and all(map(operator.is_, done, commits)):
            tail = [c.seq for c in commits[k - 1:]]
            if all(map(operator.lt, tail, tail[1:])):
                kept[i] = commits
                return commits
        elif len(commits) < k and all(map(operator.is_, commits, done)):  # a read at an earlier asOf
            return commits
    out = sorted(commits, key=_SEQ)
    kept.insert(0, out)
    del kept[4:]
    while len(_ORDERED) > 256:
        _ORDERED.popitem(last=False)
    return out


@per_object
def live_commits(snapshot: NovelSnapshot) -> list[CommitView]:
    """Commits in seq order, without commits of superseded units (once per snapshot; the list is
    shared, callers read it and never change it)."""
    if "superseded" not in map(_STATE, snapshot.units):  # SERVE-8: checked in C, the usual case
        return _in_seq_order(snapshot.novel_id, snapshot.commits)
    superseded = {u.unit_id for u in snapshot.units if u.state == "superseded"}
    return sorted((c for c in snapshot.commits if c.unit_id not in superseded), key=_SEQ)


@per_object
def commits_by_scene(snapshot: NovelSnapshot) -> dict[SceneKey, list[CommitView]]:
    """Live commits grouped by (chapterId, sceneId), each group in seq order.

    One pass over the commits: the functions below that look at every scene use this instead of
    asking per scene, so a decision costs O(units + commits + scenes) however long the book grows
    (asking `scene_commits` per scene made it quadratic in the book's length).
    """
    grouped: dict[SceneKey, list[CommitView]] = {}
    for c in live_commits(snapshot):
        grouped.setdefault((c.chapter_id, c.scene_id), []).append(c)
    return grouped


@per_object
def finished_scenes(snapshot: NovelSnapshot) -> frozenset[SceneKey]:
    """Every (chapterId, sceneId) whose latest live commit claims completion."""
    return commit_totals(snapshot.novel_id, live_commits(snapshot)).done


def scene_commits(snapshot: NovelSnapshot, chapter_id: str, scene_id: str) -> list[CommitView]:
    """Live commits of one scene, in seq order (one scene; for all scenes: `commits_by_scene`)."""
    # SERVE-8: among the chapter's commits (`commit_totals`, in seq order), not every commit of the book
    chapter = commit_totals(snapshot.novel_id, live_commits(snapshot)).by_chapter.get(chapter_id, ())
    return [c for c in chapter if c.scene_id == scene_id]


def latest_scene_commit(
    snapshot: NovelSnapshot, chapter_id: str, scene_id: str
) -> CommitView | None:
    commits = scene_commits(snapshot, chapter_id, scene_id)
    return commits[-1] if commits else None


def scene_finished(snapshot: NovelSnapshot, chapter_id: str, scene_id: str) -> bool:
    """A scene is finished when its latest commit (by seq) claims completion (one scene; for all
    scenes: `finished_scenes`)."""
    latest = latest_scene_commit(snapshot, chapter_id, scene_id)
    return latest is not None and latest.scene_completion.completed


@per_object
def scenes_by_chapter(outline: Outline) -> dict[str, list[Scene]]:
    """Each chapter's scenes in scene order, as `Outline.scenes_of` gives them, in one pass."""
    grouped: dict[str, list[Scene]] = {}
    for scene in outline.scenes:
        grouped.setdefault(scene.chapterId, []).append(scene)
    return {chapter_id: sorted(scenes, key=lambda s: s.order) for chapter_id, scenes in grouped.items()}


@per_object
def completed_chapters(snapshot: NovelSnapshot) -> tuple[str, ...]:
    """Chapter ids, in outline order, whose every scene is finished (DRV-5).

    A chapter needs at least one scene (hence at least one commit) to be complete.
    """
    outline = snapshot.outline
    if outline is None:
        return ()
    finished = finished_scenes(snapshot)
    keys = chapter_scene_keys(outline)
    # SERVE-8: the chapters the last answer for this novel found complete stay complete while the
    # finished scenes hold the last ones (checked in C); only the others are checked again
    last = _COMPLETE_CHAPTERS.get(snapshot.novel_id)
    known = last[2] if last is not None and last[0] is outline and last[1] <= finished else frozenset()
    done = tuple(
        chapter.chapterId
        for chapter in _ordered_chapters(outline)
        if chapter.chapterId in known or ((own := keys.get(chapter.chapterId)) and finished.issuperset(own))
    )
    _keep_last(_COMPLETE_CHAPTERS, snapshot.novel_id, (outline, finished, frozenset(done)))
    return done


def _keep_last(memo: OrderedDict[str, Any], novel_id: str, value: Any, size: int = 256) -> None:
    """A novel's last answer kept for the next question (the last `size` novels)."""
    memo[novel_id] = value
    memo.move_to_end(novel_id)
    while len(memo) > size:
        memo.popitem(last=False)


# per novel: the outline, the finished scenes and the chapters complete in the last answer
_COMPLETE_CHAPTERS: OrderedDict[str, tuple[Outline, frozenset[SceneKey], frozenset[str]]] = OrderedDict()


@per_object
def _ordered_chapters(outline: Outline) -> tuple[Chapter, ...]:
    """`Outline.ordered_chapters` once per outline."""
    return tuple(outline.ordered_chapters())


@per_object
def chapter_scene_keys(outline: Outline) -> dict[str, tuple[SceneKey, ...]]:
    """Each chapter's (chapterId, sceneId) keys, from `scenes_by_chapter` (once per outline)."""
    return {cid: tuple((cid, s.sceneId) for s in scenes) for cid, scenes in scenes_by_chapter(outline).items()}


@per_object
def outlined_scenes(outline: Outline) -> tuple[SceneKey, ...]:
    """(chapterId, sceneId) of every outline scene whose chapter is outlined, in outline order
    (once per outline: a parsed revision is shared by every snapshot of it)."""
    chapter_ids = {c.chapterId for c in outline.chapters}
    return tuple((s.chapterId, s.sceneId) for s in outline.scenes if s.chapterId in chapter_ids)


@per_object
def outlined_scene_set(outline: Outline) -> frozenset[SceneKey]:
    """`outlined_scenes` as a set."""
    return frozenset(outlined_scenes(outline))


def remaining_scenes(snapshot: NovelSnapshot) -> int:
    """Outline scenes not yet finished (0 without an outline)."""
    outline = snapshot.outline
    if outline is None:
        return 0
    finished = finished_scenes(snapshot)
    return sum(1 for key in outlined_scenes(outline) if key not in finished)


def foreshadowing_status(snapshot: NovelSnapshot) -> dict[str, str]:
    """Each outline foreshadowing item's status: the outline's, overlaid by commits in order.

    A commit's canon change of kind ``foreshadowing`` naming an item plants or resolves it, so a
    writer can pay off what the outline requires without an outline revision.
    """
    outline = snapshot.outline
    if outline is None:
        return {}
    status: dict[str, str] = {item.id: item.status for item in outline.foreshadowing}
    for item_id, item_status in _FORESHADOWING(snapshot.novel_id, live_commits(snapshot)):
        if item_id in status and status[item_id] != "resolved":
            status[item_id] = item_status
    return status


def finish_violations(snapshot: NovelSnapshot) -> list[str]:
    """SPEC §16 finish guards, each a violation string; empty means the book may finish.

    Checked: outline missing; chapter incomplete; required foreshadowing unresolved; unit in
    flight (prepared or claimed); total length outside the band (target budgets); requirement
    pending or blocked.
    """
    outline = snapshot.outline
    if outline is None:
        return ["outline missing"]
    violations: list[str] = []
    if snapshot.requirements_pending or snapshot.requirements_blocked:
        violations.append(f"requirements open ({snapshot.requirements_pending} pending,"
                          f" {snapshot.requirements_blocked} blocked)")
    done = set(completed_chapters(snapshot))
    for chapter in outline.ordered_chapters():
        if chapter.chapterId not in done:
            violations.append(f"chapter {chapter.chapterId} incomplete")
    status = foreshadowing_status(snapshot)
    for item in outline.foreshadowing:
        if item.required and status[item.id] != "resolved":
            violations.append(f"required foreshadowing {item.id} unresolved")
    for unit in live_units(snapshot):
        if unit.state in ("prepared", "claimed"):
            violations.append(f"unit {unit.unit_id} in flight ({unit.state})")
    band = book_band(snapshot.config.length)
    if band is not None:
        total = sum(map(_CHARS, live_commits(snapshot)))
        lower, upper = band
        if not lower <= total <= upper:
            violations.append(f"total length {total} outside the band [{lower}, {upper}]")
    return violations


class _Walk(msgspec.Struct, frozen=True):
    keys: tuple[tuple[str, str | None], ...]  # (chapterId, sceneId), or (chapterId, None): no scenes
    items: tuple[tuple[Chapter, Scene | None], ...]


@per_object
def _walk(outline: Outline) -> _Walk:
    """Every scene in chapter order then scene order, as `next_work` visits them (once per outline)."""
    scenes_of = scenes_by_chapter(outline)
    keys: list[tuple[str, str | None]] = []
    items: list[tuple[Chapter, Scene | None]] = []
    for chapter in outline.ordered_chapters():
        own = scenes_of.get(chapter.chapterId)
        scenes: list[Scene | None] = list(own) if own else [None]
        for scene in scenes:
            keys.append((chapter.chapterId, None if scene is None else scene.sceneId))
            items.append((chapter, scene))
    return _Walk(tuple(keys), tuple(items))


# SERVE-8: per novel, the last walk, finished set and first unfinished position it gave. A book is
# written in walk order, so the next question's finished set usually holds the last one's (checked
# in C): every scene before that position is still finished, and the walk resumes there.
_FIRST: OrderedDict[str, tuple[_Walk, frozenset[SceneKey], int]] = OrderedDict()


def _first_unfinished(novel_id: str, walk: _Walk, finished: frozenset[SceneKey]) -> int | None:
    """The first position of `walk` whose scene `finished` does not hold (None: every one)."""
    start = 0
    last = _FIRST.get(novel_id)
    if last is not None and last[0] is walk and last[1] <= finished:
        start = last[2]
    keys, first = walk.keys, None
    for i in range(start, len(keys)):  # usually a step or two
        if keys[i] not in finished:
            first = i
            break
    _keep_last(_FIRST, novel_id, (walk, finished, len(keys) if first is None else first))
    return first


def _next_fragment(snapshot: NovelSnapshot, commits: list[CommitView]) -> int:
    units: dict[str, UnitView] = dict(zip(map(_UNIT_ID, snapshot.units), snapshot.units, strict=True))
    fragments = [units[c.unit_id].fragment for c in commits if c.unit_id in units]
    return max([len(commits), *fragments]) + 1


def next_work(snapshot: NovelSnapshot) -> WorkDecision:
    """Pick what the driver does next for this novel (DRV-1, SPEC §16 nextWork).

    Order: inactive → a claimed unit is in flight → a requirement blocked (requirement
    conflict) or pending (await outline) → no outline / no chapters → the first unfinished scene
    by chapter order then scene order (a chapter without scenes reached before it → await
    outline) → all scenes finished: more chapters planned than outlined → await outline
    (`next-chapter`); else finish, or blocked by finish guards.
    """
    if snapshot.status != "active":
        return Inactive(status=snapshot.status)
    # SERVE-8: the passes over every unit and commit run in C (`map`), not a Python step each;
    # a claimed unit is never superseded, so the first claimed unit is the first live one
    states = list(map(_STATE, snapshot.units))
    if "claimed" in states:
        return InFlight(unit_id=snapshot.units[states.index("claimed")].unit_id)
    if snapshot.requirements_blocked:
        return RequirementConflict(blocked=snapshot.requirements_blocked)
    if snapshot.requirements_pending:
        return AwaitOutline(reason=f"{snapshot.requirements_pending} requirement(s) pending",
                            why="requirement-pending")
    outline = snapshot.outline
    if outline is None:
        return AwaitOutline(reason="no outline", why="no-outline")
    if not outline.chapters:
        return AwaitOutline(reason="outline has no chapters", why="no-chapters")
    walk = _walk(outline)
    finished = finished_scenes(snapshot)
    # the first scene in chapter then scene order that is not finished (a chapter without
    # scenes stands as (chapterId, None), never finished)
    first = _first_unfinished(snapshot.novel_id, walk, finished)
    if first is not None:
        chapter, scene = walk.items[first]
        if scene is None:
            return AwaitOutline(reason=f"chapter {chapter.chapterId} has no scenes",
                                why="chapter-without-scenes", chapter_id=chapter.chapterId)
        key = walk.keys[first]
        commits = scene_commits(snapshot, chapter.chapterId, scene.sceneId)
        prepared = [u for u in compress(snapshot.units, map("prepared".__eq__, states))
                    if u.chapter_id == key[0] and u.scene_id == key[1]]
        if prepared:
            unit = prepared[-1]
            return WriteUnit(
                chapter_id=chapter.chapterId,
                scene_id=scene.sceneId,
                unit_id=unit.unit_id,
                fragment=unit.fragment,
                continuation_anchor=unit.continuation_anchor,
            )
        if not commits:
            return WriteUnit(
                chapter_id=chapter.chapterId,
                scene_id=scene.sceneId,
                unit_id=None,
                fragment=1,
                continuation_anchor=scene.continuationAnchor,
            )
        # Continuation: keep the previous commit's nextAnchor (the original lost it).
        return WriteUnit(
            chapter_id=chapter.chapterId,
            scene_id=scene.sceneId,
            unit_id=None,
            fragment=_next_fragment(snapshot, commits),
            continuation_anchor=commits[-1].scene_completion.next_anchor,
        )
    planned = snapshot.config.plannedChapters
    if planned is not None and len(outline.chapters) < planned:
        return AwaitOutline(reason=f"{len(outline.chapters)} of {planned} planned chapters outlined",
                            why="next-chapter")
    violations = finish_violations(snapshot)
    if violations:
        return Blocked(violations=violations)
    return Finish()
