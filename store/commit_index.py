"""The commit index this process already read, so a snapshot reads only the commits after it.

PERF-2: the driver's decision input, the pack's context index and the read tools' snapshot each
need every commit of the novel with its canon facts; read, sent and decoded whole once per unit,
a unit would cost more the longer the book is (at 400 units, three statements of 2-5 ms and ≈ 1 MB
of JSON per unit). A commit and its canon facts are written once, by the commit statement, and never
changed; seqs are given under the novel's row lock (`nb_commit_unit`: max + 1), so a read that
sees seq k sees every commit before it. So the index is kept here, per novel, without prose, and
a read asks only for the commits after the last one known.

The statements check what they are told is known: the commit at the known seq must still be the
one it was (its `mark`: creation time and body hash). If it is not — another database behind the
same novel id, a restored backup, a read whose snapshot is older than the index — the statement
returns the whole index instead (`commits_after` 0). Never a wrong index, at worst a full read.

Bounded: at most `MAX_COMMITS` commit views over all novels, the least recently read dropped.

**Units** change state, so they are kept differently (`KnownUnits`): each unit row carries the id
of the transaction that last wrote it (`written_xid`, migration 012), and a read returns its own
snapshot (`pg_current_snapshot()`). The next read sends that snapshot back and gets only the units
whose last writer that snapshot could not see — provided every transaction the old snapshot saw
is visible to the new one (else, a reader older than what is known, it gets them all) and the
novel is the same novel (its creation time: `NOVEL_MARK_SQL`). The rule is the usual one for
changes since a snapshot; it takes no lock and no counter. It assumes a process's transaction ids
come from one server: a process must be restarted after its database is restored elsewhere.

**The extractor's facts** (ROLE-3) are kept the way units are (`KnownExtracted`): a commit's facts
and its ledger row are written once, by one statement, and each ledger row carries its writer's
transaction id (migration 018), so a read with the snapshot of the last one asks only for the
commits extracted since. Extraction runs beside the units, in any order against the reads, so a
seq cannot serve as the mark here.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Generic, TypeVar

from novelbus.novel.body import CanonChange
from novelbus.novel.snapshot import CommitView, UnitView

MAX_COMMITS = 20_000  # ≈ 1-3 KB each (canon facts included, no prose): tens of MB at most

# SQL: the mark of commit row `t` (what a known seq is checked against), as text. Deterministic for
# one row whatever the session's settings (unlike timestamptz's text form).
MARK_SQL = "(floor(extract(epoch FROM {t}.created_at) * 1000000)::bigint::text || ':' || {t}.body_hash)"
NOVEL_MARK_SQL = "(floor(extract(epoch FROM n.created_at) * 1000000)::bigint::text)"  # `n`: the novel row
MAX_UNITS = 50_000
MAX_EXTRACTED = 100_000  # facts over all novels (a few hundred bytes each)
_CREATED, _UNIT = itemgetter(0), itemgetter(1)  # a unit row's created_seq, and the unit
_SEQ = attrgetter("seq")
K = TypeVar("K")


@dataclass(frozen=True)
class Known:
    """A novel's commits 1..k as one read saw them (seq order, no prose), and the mark of k."""

    commits: tuple[CommitView, ...] = ()
    mark: str | None = None
    # SERVE-8: the list the read that made this returned: a read that finds nothing new returns it
    # again (read only, as every index list), so what callers keep per list object hits again
    listed: list[CommitView] | None = field(default=None, compare=False, repr=False)

    @property
    def after(self) -> int:
        return self.commits[-1].seq if self.commits else 0


NOTHING = Known()


def merge(known: Known, after: int, new: list[CommitView], up_to: int | None) -> list[CommitView]:
    """The index a read returns (pure): `new` holds the commits with seq > `after` (at most
    `up_to`, None: no limit) that the statement read; `after` is what it took as known — the
    caller's `known.after`, or 0 when the known mark did not match (then `new` is the whole index)."""
    if after == 0:
        return list(new)
    if after != known.after:
        raise ValueError(f"the statement read after seq {after}, the caller knew up to {known.after}")
    if new and new[0].seq <= after:
        raise ValueError(f"a commit at seq {new[0].seq} was read again after seq {after}")
    if up_to is None or up_to >= after:
        return [*known.commits, *new]
    # SERVE-8: the known commits are in seq order, so those at or before `up_to` are a prefix
    return [*known.commits[:bisect_right(known.commits, up_to, key=_SEQ)], *new]


class _PerNovel(Generic[K]):
    """What one process knows per novel, at most `limit` rows (commits, units) over all novels:
    the least recently read novel is dropped first; a novel bigger than the limit is not kept."""

    def __init__(self, limit: int, empty: K, rows: Callable[[K], int]) -> None:
        self.limit, self._empty, self._rows = limit, empty, rows
        self._novels: OrderedDict[str, K] = OrderedDict()
        self._size = 0

    def get(self, novel_id: str) -> K:
        return self._novels.get(novel_id, self._empty)

    def touch(self, novel_id: str) -> None:
        if novel_id in self._novels:
            self._novels.move_to_end(novel_id)

    def put(self, novel_id: str, value: K) -> None:
        current = self._novels.pop(novel_id, None)
        if current is not None:
            self._size -= self._rows(current)
        if self._rows(value) > self.limit:
            return
        self._novels[novel_id] = value
        self._size += self._rows(value)
        while self._size > self.limit:
            _, dropped = self._novels.popitem(last=False)
            self._size -= self._rows(dropped)

    def clear(self) -> None:
        self._novels.clear()
        self._size = 0


class CommitIndexCache:
    """Per process: each novel's `Known` index, least recently read dropped past `max_commits`."""

    def __init__(self, max_commits: int = MAX_COMMITS) -> None:
        self._novels = _PerNovel(max_commits, NOTHING, lambda k: len(k.commits))
        self.full_reads = 0  # reads that returned the whole index (first read, or a mark that changed)
        self.partial_reads = 0

    def known(self, novel_id: str) -> Known:
        return self._novels.get(novel_id)

    def remember(self, novel_id: str, after: int, commits: list[CommitView], mark: str | None) -> None:
        """Keep what a read returned: a whole index (`after` 0) replaces the novel's, a longer one
        extends it; an index of no commits, or an older (shorter) one, changes nothing."""
        if after == 0:
            self.full_reads += 1
        else:
            self.partial_reads += 1
        if not commits or mark is None:
            return
        if after != 0 and len(commits) <= len(self._novels.get(novel_id).commits):
            self._novels.touch(novel_id)
            return
        self._novels.put(novel_id, Known(tuple(commits), mark, commits))

    def read(self, novel_id: str, known: Known, after: int, new: list[CommitView], up_to: int | None,
             mark: str | None) -> list[CommitView]:
        """The whole index a statement sent with `known` returned (`merge`), kept for the next read.
        Read only: a read that finds nothing after what is known gets the list of the read before."""
        if (after and not new and after == known.after and (up_to is None or up_to >= after)
                and known.listed is not None and mark == known.mark):
            self.partial_reads += 1
            self._novels.touch(novel_id)
            return known.listed
        commits = merge(known, after, new, up_to)
        self.remember(novel_id, after, commits, mark)
        return commits

    def clear(self) -> None:
        self._novels.clear()


CACHE = CommitIndexCache()


UnitRow = tuple[int, UnitView]  # (created_seq, the unit): the order units are listed in


@dataclass(frozen=True)
class KnownUnits:
    """A novel's units as one read saw them (creation order), that read's snapshot and the
    novel's mark."""

    units: tuple[UnitRow, ...] = ()
    snapshot: str | None = None
    mark: str | None = None
    # SERVE-8: the units alone, as the read that made this returned them: a read that finds no
    # unit written since gets them again (read only), not a list made anew
    views: list[UnitView] | None = field(default=None, compare=False, repr=False)


NO_UNITS = KnownUnits()


def merge_units(known: KnownUnits, known_ok: bool, rows: list[UnitRow]) -> list[UnitRow]:
    """The units a read returns (pure): `rows` are the units written since `known.snapshot` when
    the statement found it usable (`known_ok`), else all of them. A written unit replaces the
    known one of its id; a new one is placed by its creation order."""
    if not known_ok:
        return sorted(rows, key=_CREATED)
    out = list(known.units)
    n = len(out)
    added = False
    for row in rows:
        # `created_seq` is the unit's identity column: unique, fixed at creation, and what the known
        # units are sorted by, so a known unit is found by bisection (PERF-2: no map of every
        # unit per read); a row whose seq is not among them is a unit created since.
        i = bisect_left(out, row[0], 0, n, key=_CREATED)
        if i < n and out[i][0] == row[0]:
            if out[i][1].unit_id != row[1].unit_id:  # not the same units' numbering: merge by id
                return _merge_by_id(known, rows)
            out[i] = row
        else:
            out.append(row)
            added = True
    if added:
        out.sort(key=_CREATED)
    return out


def _merge_by_id(known: KnownUnits, rows: list[UnitRow]) -> list[UnitRow]:
    out = list(known.units)
    position = {u.unit_id: i for i, (_, u) in enumerate(out)}
    for row in rows:
        i = position.get(row[1].unit_id)
        if i is None:
            out.append(row)
        else:
            out[i] = row
    out.sort(key=_CREATED)
    return out


class UnitsCache:
    """Per process: each novel's `KnownUnits`, least recently read dropped past `max_units`. A
    read always replaces what was known: its units and snapshot are one consistent pair."""

    def __init__(self, max_units: int = MAX_UNITS) -> None:
        self._novels = _PerNovel(max_units, NO_UNITS, lambda k: len(k.units))
        self.full_reads = 0
        self.partial_reads = 0

    def known(self, novel_id: str) -> KnownUnits:
        return self._novels.get(novel_id)

    def remember(self, novel_id: str, known_ok: bool, units: list[UnitRow], snapshot: str, mark: str,
                 views: list[UnitView] | None = None) -> None:
        if known_ok:
            self.partial_reads += 1
        else:
            self.full_reads += 1
        self._novels.put(novel_id, KnownUnits(tuple(units), snapshot, mark, views))

    def read(self, novel_id: str, known: KnownUnits, known_ok: bool, rows: list[UnitRow], snapshot: str,
             mark: str) -> list[UnitRow]:
        """All the novel's units a statement sent with `known` returned (`merge_units`), kept with
        the snapshot they were read at for the next read."""
        units = merge_units(known, known_ok, rows)
        self.remember(novel_id, known_ok, units, snapshot, mark)
        return units

    def read_views(self, novel_id: str, known: KnownUnits, known_ok: bool, rows: list[UnitRow], snapshot: str,
                   mark: str) -> list[UnitView]:
        """`read`'s units alone, in creation order (read only). SERVE-8: no unit written since the
        known ones (the usual read between two units' changes) gives the list the last read gave."""
        if known_ok and not rows and known.views is not None and known.mark == mark:
            self._novels.put(novel_id, KnownUnits(known.units, snapshot, mark, known.views))
            self.partial_reads += 1
            return known.views
        units = merge_units(known, known_ok, rows)
        views = list(map(_UNIT, units))
        self.remember(novel_id, known_ok, units, snapshot, mark, views)
        return views

    def clear(self) -> None:
        self._novels.clear()


UNITS = UnitsCache()


Facts = dict[str, tuple[CanonChange, ...]]  # the extractor's facts by commit id, in fact order


@dataclass(frozen=True)
class KnownExtracted:
    """A novel's extracted facts as one read saw them, that read's snapshot and the novel's mark."""

    facts: Facts
    snapshot: str | None = None
    mark: str | None = None
    count: int = 0  # facts held (the bound counts facts, not commits)


NO_EXTRACTED = KnownExtracted({})


def merge_extracted(known: KnownExtracted, known_ok: bool, rows: list[tuple[str, list[CanonChange]]]) -> Facts:
    """The facts a read returns (pure): `rows` are the commits extracted since `known.snapshot`
    when the statement found it usable (`known_ok`), else all of them. A commit's facts are
    written once, so a row for a known commit replaces it with the same facts."""
    if known_ok and not rows:
        return known.facts  # shared, never changed: nothing was extracted since
    out: Facts = dict(known.facts) if known_ok else {}
    for commit_id, facts in rows:
        out[commit_id] = tuple(facts)
    return out


class ExtractedCache:
    """Per process: each novel's `KnownExtracted`, least recently read dropped past `max_facts`.
    A read always replaces what was known: its facts and snapshot are one consistent pair."""

    def __init__(self, max_facts: int = MAX_EXTRACTED) -> None:
        self._novels = _PerNovel(max_facts, NO_EXTRACTED, lambda k: k.count)
        self.full_reads = 0
        self.partial_reads = 0

    def known(self, novel_id: str) -> KnownExtracted:
        return self._novels.get(novel_id)

    def read(self, novel_id: str, known: KnownExtracted, known_ok: bool, rows: list[tuple[str, list[CanonChange]]],
             snapshot: str, mark: str) -> Facts:
        """All the novel's extracted facts a statement sent with `known` returned
        (`merge_extracted`), kept with the snapshot they were read at for the next read."""
        facts = merge_extracted(known, known_ok, rows)
        if known_ok:
            self.partial_reads += 1
            count = known.count + sum(len(f) - len(known.facts.get(c, ())) for c, f in rows)
        else:
            self.full_reads += 1
            count = sum(len(f) for f in facts.values())
        self._novels.put(novel_id, KnownExtracted(facts, snapshot, mark, count))
        return facts

    def clear(self) -> None:
        self._novels.clear()


EXTRACTED = ExtractedCache()
