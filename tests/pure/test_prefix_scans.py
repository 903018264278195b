"""SERVE-8 (PERF-2): the scans that resume after the commits they saw last give what a scan of
the whole list gives, whatever the reads before them were: lists that grow, shrink, or hold a
new object for a commit (a merged view once its extraction lands, a superseded unit left out)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, SceneCompletion
from novelbus.novel.context._request import newest_facts, participant_facts
from novelbus.novel.next_work import PrefixScan
from novelbus.novel.snapshot import CommitView
from novelbus.store.snapshots import merged_view, with_extracted

CHARACTERS = ("c1", "c2", "c3")
KINDS = ("state", "relationship", "foreshadowing")


def _commit(seq: int, changes: list[CanonChange]) -> CommitView:
    return CommitView(commit_id=f"commit-{seq}", seq=seq, unit_id=f"u{seq}", chapter_id="k1", scene_id="s1",
                      paragraphs=[], scene_completion=SceneCompletion(completed=False, basis="why"),
                      canon_changes=changes, effective_characters=10, body_hash=f"h{seq}", paragraph_count=1)


changes = st.builds(
    lambda kind, who, n: CanonChange(kind=kind, summary=f"fact {n}", sources=[], character_ids=list(who)),
    st.sampled_from(KINDS), st.lists(st.sampled_from(CHARACTERS), max_size=2, unique=True), st.integers(0, 9))


# A read: the book's first `n` commits, those at `fresh` positions as new objects (equal or not)
reads = st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(0, 11), max_size=3),
                           st.lists(changes, max_size=3)), min_size=1, max_size=8)


def _books(draw_reads: list[tuple[int, list[int], list[CanonChange]]],
           base: list[CommitView]) -> list[list[CommitView]]:
    book = list(base)
    out = []
    for n, fresh, new_changes in draw_reads:
        for i in fresh:
            if i < len(book):  # the same commit as a new object, its canon possibly merged anew
                book[i] = msgspec.structs.replace(book[i], canon_changes=[*book[i].canon_changes, *new_changes])
        out.append(book[:n])
    return out


class _Plan(msgspec.Struct):
    request: Any
    participants: list[str]
    canon_kinds: list[str]


class _Request(msgspec.Struct):
    novel_id: str


def _reference(plan: _Plan, commits: list[CommitView]) -> list[tuple[CommitView, int, CanonChange]]:
    wanted, kinds = set(plan.participants), set(plan.canon_kinds)
    return [(c, i, ch) for c in commits for i, ch in enumerate(c.canon_changes)
            if ch.kind in kinds and wanted.intersection(ch.character_ids)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(changes, max_size=4), min_size=12, max_size=12), reads,
       st.lists(st.sampled_from(CHARACTERS), min_size=1, max_size=2, unique=True), st.integers(0, 10**9))
def test_participant_facts_equal_a_full_scan_after_any_reads(
        canon: list[list[CanonChange]], draw_reads: list[tuple[int, list[int], list[CanonChange]]],
        participants: list[str], novel: int) -> None:
    """SERVE-8: participant_facts and newest_facts (a resumed scan) equal the definition over
    the whole list, read after read."""
    plan = _Plan(_Request(f"n-{novel}"), participants, ["state", "relationship"])
    for commits in _books(draw_reads, [_commit(i + 1, c) for i, c in enumerate(canon)]):
        expected = _reference(plan, commits)
        got = participant_facts(plan, commits)  # type: ignore[arg-type]
        assert [(f[0] is e[0], f[1], f[2]) for f, e in zip(got, expected, strict=True)] == \
            [(True, e[1], e[2]) for e in expected]
        newest = newest_facts(plan, commits)  # type: ignore[arg-type]
        assert newest == sorted(expected, key=lambda f: -(f[0].seq * 1000 + f[1]))


def test_newest_facts_sort_by_score_when_a_commit_holds_a_thousand_facts() -> None:
    """SERVE-8 (CTX-5): with a fact index of 1000 or more, two commits' scores can meet, and the
    order is the score's (a stable sort), not the reversed list's."""
    fact = CanonChange(kind="state", summary="s", sources=[], character_ids=["c1"])
    commits = [_commit(1, [fact] * 1001), _commit(2, [fact])]
    plan = _Plan(_Request("n-crowded"), ["c1"], ["state"])
    newest = newest_facts(plan, commits)  # type: ignore[arg-type]
    scores = [f[0].seq * 1000 + f[1] for f in newest]
    assert scores == sorted(scores, reverse=True)
    assert [f[0].seq for f in newest[:3]] == [1, 2, 1]  # 1·1000+1000 = 2000 before 2·1000+0 = 2000


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(changes, max_size=3), min_size=12, max_size=12), reads)
def test_prefix_scan_equals_a_full_scan_after_any_reads(
        canon: list[list[CanonChange]], draw_reads: list[tuple[int, list[int], list[CanonChange]]]) -> None:
    """SERVE-8: a PrefixScan gives every commit's items, in list order, whatever it saw before."""
    scan = PrefixScan(lambda _, c: [(c.seq, ch.summary) for ch in c.canon_changes])
    for commits in _books(draw_reads, [_commit(i + 1, c) for i, c in enumerate(canon)]):
        assert scan("novel", commits) == [(c.seq, ch.summary) for c in commits for ch in c.canon_changes]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(changes, max_size=2), min_size=10, max_size=10),
       st.lists(st.tuples(st.integers(0, 10), st.dictionaries(st.integers(0, 9), st.lists(changes, max_size=2),
                                                              max_size=4)), min_size=1, max_size=6),
       st.sampled_from(["both", "extractor"]), st.integers(0, 10**9))
def test_with_extracted_equals_merging_every_commit(
        canon: list[list[CanonChange]], steps: list[tuple[int, dict[int, list[CanonChange]]]], source: str,
        novel: int) -> None:
    """SERVE-8 (ROLE-3): the merged views of a read equal each commit merged with its facts,
    read after read, as extractions land (new facts objects), or none do (the same object), and
    the book grows or a read ends earlier."""
    book = [_commit(i + 1, c) for i, c in enumerate(canon)]
    facts: dict[str, tuple[CanonChange, ...]] = {}
    for n, landed in steps:
        if landed:  # as EXTRACTED merges: a new mapping when something landed, else the same one
            facts = {**facts, **{f"commit-{i + 1}": tuple(f) for i, f in landed.items()}}
        commits = book[:n]
        got = with_extracted(f"n-{novel}", commits, facts, source)
        assert got == [merged_view(c, facts.get(c.commit_id, ()), source) for c in commits]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(changes, max_size=3), min_size=12, max_size=12), reads, reads,
       st.lists(st.booleans(), min_size=1, max_size=16))
def test_prefix_scan_equals_a_full_scan_when_reads_of_other_objects_interleave(
        canon: list[list[CanonChange]], first: list[tuple[int, list[int], list[CanonChange]]],
        second: list[tuple[int, list[int], list[CanonChange]]], order: list[bool]) -> None:
    """SERVE-8: reads that hold other objects for the same commits (merged views beside raw
    ones) interleave under one key, and each still gets every commit's items in list order."""
    base = [_commit(i + 1, c) for i, c in enumerate(canon)]
    books = (_books(first, base), _books(second, [msgspec.structs.replace(c) for c in base]))
    scan = PrefixScan(lambda _, c: [(c.seq, ch.summary) for ch in c.canon_changes])
    at = [0, 0]
    for which in order:
        book = books[which]
        commits = book[at[which] % len(book)]
        at[which] += 1
        assert scan("novel", commits) == [(c.seq, ch.summary) for c in commits for ch in c.canon_changes]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(changes, max_size=1), min_size=12, max_size=12), reads,
       st.lists(st.tuples(st.booleans(), st.randoms(use_true_random=False)), min_size=1, max_size=8),
       st.integers(0, 10**9))
def test_seq_order_of_any_reads_equals_sorting(
        canon: list[list[CanonChange]], draw_reads: list[tuple[int, list[int], list[CanonChange]]],
        shuffles: list[tuple[bool, Any]], novel: int) -> None:
    """SERVE-8: the seq order of a read (longer, shorter, other objects, out of order) is the
    sort's, however it relates to the lists ordered before it."""
    from novelbus.novel.next_work import _in_seq_order

    books = _books(draw_reads, [_commit(i + 1, c) for i, c in enumerate(canon)])
    for i, (shuffle, rng) in enumerate(shuffles):
        commits = list(books[i % len(books)])
        if shuffle:  # a read that starts as an ordered one and goes on out of order
            cut = rng.randrange(len(commits) + 1)
            tail = commits[cut:]
            rng.shuffle(tail)
            commits[cut:] = tail
        got = _in_seq_order(f"n-{novel}", commits)
        assert got == sorted(commits, key=lambda c: c.seq)


def _placed(commit: CommitView, place: tuple[int, int, bool, int, int]) -> CommitView:
    """`commit` in one of two chapters and two scenes, with its own completion claim, paragraph
    count and length."""
    chapter, scene, completed, paragraphs, chars = place
    return msgspec.structs.replace(commit, chapter_id=f"k{chapter}", scene_id=f"s{scene}",
                                   scene_completion=SceneCompletion(completed=completed, basis="why"),
                                   paragraph_count=paragraphs, effective_characters=chars)


places = st.lists(st.tuples(st.integers(1, 2), st.integers(1, 2), st.booleans(), st.integers(0, 4),
                            st.integers(0, 50)), min_size=12, max_size=12)


def _expected_totals(commits: list[CommitView]) -> dict[str, Any]:
    by_chapter: dict[str, list[str]] = {}
    completion: dict[tuple[str, str], bool] = {}
    for c in commits:
        by_chapter.setdefault(c.chapter_id, []).append(c.commit_id)
        completion[(c.chapter_id, c.scene_id)] = c.scene_completion.completed
    return {"seqs": {c.commit_id: c.seq for c in commits}, "counts": {c.commit_id: c.paragraph_count for c in commits},
            "by_chapter": by_chapter, "completion": completion, "max_seq": max((c.seq for c in commits), default=0),
            "chars": sum(c.effective_characters for c in commits),
            "canon": sum(len(c.canon_changes) for c in commits),
            "done": frozenset(k for k, v in completion.items() if v)}


def _got_totals(totals: Any, commits: list[CommitView]) -> dict[str, Any]:
    assert totals.commits == tuple(commits)
    assert all(totals.by_id[c.commit_id] is c for c in commits) and len(totals.by_id) == len(commits)
    return {"seqs": totals.seqs, "counts": totals.counts, "completion": totals.completion,
            "by_chapter": {k: [c.commit_id for c in v] for k, v in totals.by_chapter.items()},
            "max_seq": totals.max_seq, "chars": totals.chars, "canon": totals.canon, "done": totals.done}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(changes, max_size=3), min_size=12, max_size=12), places, reads, reads,
       st.lists(st.booleans(), min_size=1, max_size=16), st.integers(0, 10**9))
def test_commit_totals_equal_a_full_pass_whatever_the_reads_before(
        canon: list[list[CanonChange]], placed: list[tuple[int, int, bool, int, int]],
        first: list[tuple[int, list[int], list[CanonChange]]], second: list[tuple[int, list[int], list[CanonChange]]],
        order: list[bool], novel: int) -> None:
    """SERVE-8: the totals of a read (rebased on those of a list it shares a first part with:
    longer, shorter, new objects for some commits, another family of objects interleaved) equal
    a pass over the whole list; and the totals returned before are never changed by later reads."""
    from novelbus.novel.next_work import commit_totals

    base = [_placed(_commit(i + 1, c), p) for i, (c, p) in enumerate(zip(canon, placed, strict=True))]
    books = (_books(first, base), _books(second, [msgspec.structs.replace(c) for c in base]))
    at, returned = [0, 0], []
    for which in order:
        book = books[which]
        commits = book[at[which] % len(book)]
        at[which] += 1
        totals = commit_totals(f"n-{novel}", commits)
        assert _got_totals(totals, commits) == _expected_totals(commits)
        returned.append((totals, commits, _expected_totals(commits)))
    for totals, commits, expected in returned:
        assert _got_totals(totals, commits) == expected


def test_commit_totals_of_a_shorter_read_take_the_claim_of_the_last_commit_left() -> None:
    """SERVE-8: a read that ends before the last one's last commit (the extractor's, at the
    commit before) gets each scene's claim from the last commit it holds, not from a commit
    taken off, nor from the scene's first."""
    from novelbus.novel.next_work import commit_totals

    claims = (True, False, False, True)
    book = [_placed(_commit(i + 1, []), (1, 1, done, 1, 10)) for i, done in enumerate(claims)]
    assert commit_totals("n-shorter", book).completion == {("k1", "s1"): True}
    shorter = commit_totals("n-shorter", book[:3])
    assert shorter.completion == {("k1", "s1"): False}
    assert (shorter.max_seq, shorter.chars, list(shorter.seqs)) == (3, 30, ["commit-1", "commit-2", "commit-3"])
    assert commit_totals("n-shorter", book[:1]).completion == {("k1", "s1"): True}
