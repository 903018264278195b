"""PERF-2: the commit index a process already read (`store.commit_index`), pure parts.

A snapshot asks only for the commits after the last one the process knows and merges them with
what it knew; the merge must give exactly the index a whole read gives, at any asOf, and the
process's index stays bounded.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.snapshot import CommitView, UnitView
from novelbus.store.commit_index import (
    CommitIndexCache,
    ExtractedCache,
    Known,
    KnownExtracted,
    KnownUnits,
    UnitsCache,
    merge,
    merge_extracted,
    merge_units,
)


def commit(seq: int) -> CommitView:
    return CommitView(commit_id=f"commit-{seq}", seq=seq, unit_id=f"u{seq}", chapter_id="ch", scene_id="s",
                      paragraphs=[], scene_completion=SceneCompletion(completed=False, basis="b"),
                      canon_changes=[], effective_characters=seq, body_hash=f"h{seq}",
                      paragraph_count=0)


def book(n: int) -> list[CommitView]:
    return [commit(s) for s in range(1, n + 1)]


@given(n=st.integers(0, 40), data=st.data())
def test_merge_of_known_and_the_commits_after_it_is_the_whole_index(n: int, data: st.DataObject) -> None:
    """CTX-4 holds: whatever was known (a prefix of the book) and whatever asOf the read has,
    known + the commits the statement read after it = the commits a whole read gives."""
    commits = book(n)
    k = data.draw(st.integers(0, n), label="known")
    up_to = data.draw(st.none() | st.integers(0, n), label="up_to")
    visible = commits if up_to is None else commits[:up_to]
    known = Known(tuple(commits[:k]), f"m{k}" if k else None)
    read_after = [c for c in visible if c.seq > k]  # what the statement returns after seq k
    assert merge(known, known.after, read_after, up_to) == visible
    # The mark did not match: the statement returned the whole index, known is not used.
    assert merge(known, 0, visible, up_to) == visible


def test_merge_refuses_a_read_that_does_not_follow_what_was_known() -> None:
    known = Known(tuple(book(3)), "m3")
    with pytest.raises(ValueError, match="knew up to 3"):
        merge(known, 2, [commit(3)], None)
    with pytest.raises(ValueError, match="read again"):
        merge(known, 3, [commit(3), commit(4)], None)


def test_the_process_index_is_bounded_and_drops_the_least_recently_read() -> None:
    cache = CommitIndexCache(max_commits=10)
    cache.remember("a", 0, book(4), "m4")
    cache.remember("b", 0, book(4), "m4")
    assert cache.known("a").after == 4 and cache.known("b").after == 4
    cache.remember("a", 4, book(5), "m5")  # a read after a's 4 commits: a is the most recent now
    cache.remember("c", 0, book(3), "m3")  # 5 + 4 + 3 > 10: b, the least recently read, goes
    assert cache.known("b").after == 0 and cache.known("a").after == 5 and cache.known("c").after == 3
    # An older (shorter) partial read changes nothing; a whole read replaces (another database).
    cache.remember("a", 2, book(3), "m3")
    assert cache.known("a") == Known(tuple(book(5)), "m5")
    cache.remember("a", 0, book(2), "other")
    assert cache.known("a") == Known(tuple(book(2)), "other")
    # A novel longer than the whole bound is not kept; nor is an index of no commits.
    cache.remember("d", 0, book(11), "m11")
    cache.remember("e", 0, [], None)
    assert cache.known("d").after == 0 and cache.known("e").after == 0
    assert (cache.full_reads, cache.partial_reads) == (6, 2)


# --- units: the units written since a known snapshot ---------------------------------------------

STATES = ("prepared", "claimed", "committed", "superseded")


def unit(i: int, state: str, attempt: int = 0) -> UnitView:
    return UnitView(unit_id=f"u{i}", chapter_id="ch", scene_id=f"s{i}", fragment=1, state=state,  # type: ignore[arg-type]
                    attempt=attempt)


@given(st.lists(st.tuples(st.integers(0, 12), st.sampled_from(STATES)), max_size=40), st.data())
def test_known_units_and_the_units_written_since_are_all_units(
    writes: list[tuple[int, str]], data: st.DataObject
) -> None:
    """Whatever was known at some point of a history of unit writes (creations and state
    changes), the known units + the units written after that point = every unit as it is now, in
    creation order; a read that could not use what was known (all units sent) gives the same."""
    cut = data.draw(st.integers(0, len(writes)), label="known after this many writes")
    created: dict[int, int] = {}  # unit -> creation seq

    def state_after(n: int) -> dict[int, tuple[int, UnitView]]:
        out: dict[int, tuple[int, UnitView]] = {}
        for step, (i, s) in enumerate(writes[:n]):
            created.setdefault(i, step)
            out[i] = (created[i], unit(i, s, attempt=step))
        return out

    known_rows = sorted(state_after(cut).values(), key=lambda r: r[0])
    now = state_after(len(writes))
    written_since = {i for i, _ in writes[cut:]}
    rows = sorted((now[i] for i in written_since), key=lambda r: r[0])
    known = KnownUnits(tuple(known_rows), "snapshot", "mark")
    everything = sorted(now.values(), key=lambda r: r[0])
    assert merge_units(known, True, rows) == everything
    assert merge_units(known, False, everything) == everything


def test_the_process_units_are_bounded_and_a_read_replaces_them() -> None:
    cache = UnitsCache(max_units=5)
    cache.remember("a", False, [(1, unit(1, "prepared")), (2, unit(2, "prepared"))], "s1", "m")
    cache.remember("b", False, [(1, unit(1, "prepared")), (2, unit(2, "claimed"))], "s1", "m")
    cache.remember("a", True, [(1, unit(1, "committed")), (2, unit(2, "prepared")), (3, unit(3, "prepared"))],
                   "s2", "m")
    assert cache.known("a").snapshot == "s2" and len(cache.known("a").units) == 3
    cache.remember("c", False, [(1, unit(1, "prepared"))], "s3", "m")  # 3 + 2 + 1 > 5: b goes
    assert cache.known("b").units == () and cache.known("c").snapshot == "s3"
    assert (cache.full_reads, cache.partial_reads) == (3, 1)


def test_a_unit_created_before_a_known_one_but_seen_after_it_is_placed_by_creation() -> None:
    """Creation seqs are given at INSERT, visibility at COMMIT: a read may know unit 3 but not
    unit 2 yet. Unit 2 arriving later (with unit 3 changed) lands between 1 and 3, and 3 is
    replaced, not duplicated (the known units are searched by bisection on `created_seq`)."""
    known = KnownUnits(((1, unit(1, "committed")), (3, unit(3, "prepared"))), "s", "m")
    rows = [(2, unit(2, "committed")), (3, unit(3, "claimed")), (4, unit(4, "prepared"))]
    assert merge_units(known, True, rows) == [
        (1, unit(1, "committed")), (2, unit(2, "committed")), (3, unit(3, "claimed")), (4, unit(4, "prepared"))]


def test_units_numbered_otherwise_are_merged_by_id() -> None:
    """A row whose `created_seq` names another known unit (not this store's numbering) is not
    taken for it: the merge falls back to matching units by id."""
    known = KnownUnits(((1, unit(1, "committed")), (2, unit(2, "prepared"))), "s", "m")
    merged = merge_units(known, True, [(2, unit(5, "prepared"))])
    assert [u.unit_id for _, u in merged] == ["u1", "u2", "u5"]  # u2 is kept, u5 is added


def facts_of(commit_id: str, n: int) -> list[CanonChange]:
    return [CanonChange(kind="relation", summary=f"{commit_id} {i}", sources=[f"{commit_id}#0"]) for i in range(n)]


@given(sizes=st.lists(st.integers(0, 3), max_size=30), data=st.data())
def test_known_facts_and_the_commits_extracted_since_are_all_facts(sizes: list[int], data: st.DataObject) -> None:
    """ROLE-3 / PERF-2: whatever subset of the extracted commits a process knew, adding those
    extracted since gives every commit's facts, as a whole read does; a read that could not use
    what was known gives exactly what it read."""
    everything = {f"commit-{i}": tuple(facts_of(f"commit-{i}", n)) for i, n in enumerate(sizes)}
    ids = list(everything)
    known_ids = data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set()))
    since = [c for c in ids if c not in known_ids or data.draw(st.booleans())]  # a known one may come again
    known = KnownExtracted({c: everything[c] for c in known_ids}, "snapshot", "mark")
    rows = [(c, list(everything[c])) for c in since]
    assert merge_extracted(known, True, rows) == everything
    assert merge_extracted(known, False, [(c, list(f)) for c, f in everything.items()]) == everything


def test_the_process_facts_are_bounded_and_counted_by_fact() -> None:
    cache = ExtractedCache(max_facts=5)
    cache.read("a", KnownExtracted({}), False, [("c1", facts_of("c1", 2))], "s1", "m")
    cache.read("b", KnownExtracted({}), False, [("c1", facts_of("c1", 2))], "s1", "m")
    a = cache.known("a")
    assert cache.read("a", a, True, [], "s2", "m") is a.facts  # nothing extracted since: shared, not copied
    cache.read("a", cache.known("a"), True, [("c2", facts_of("c2", 1)), ("c1", facts_of("c1", 2))], "s3", "m")
    assert cache.known("a").count == 3 and cache.known("a").snapshot == "s3"
    cache.read("c", KnownExtracted({}), False, [("c1", facts_of("c1", 1))], "s4", "m")  # 3 + 2 + 1 > 5: b goes
    assert cache.known("b").facts == {} and cache.known("c").snapshot == "s4"
    assert (cache.full_reads, cache.partial_reads) == (3, 2)
