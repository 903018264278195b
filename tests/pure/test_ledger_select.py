"""CTX-5 (SERVE-8): selecting under a cap records the same manifest as omitting every candidate
past the cap one by one, however many there are and whatever the ledger listed before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.context._ledger import OMISSIONS_LISTED, Candidate, Ledger, select_ranked

candidates = st.lists(st.builds(lambda score, version, source, offset: Candidate(
    "foreshadowing", "L2", score, version, f"fs{source}", offset, 10),
    st.integers(0, 5), st.integers(0, 3), st.integers(0, 40), st.integers(0, 3)), max_size=40)


def _one_by_one(items: list[Candidate], cap: int, ledger: Ledger, reason: str) -> list[Candidate]:
    ordered = sorted(items, key=Candidate.key)
    for c in ordered[cap:]:
        ledger.omit(c, reason)
    for c in ordered[:cap]:
        ledger.take(c)
    return ordered[:cap]


@settings(max_examples=300, deadline=None)
@given(candidates, st.integers(0, 12), st.integers(0, OMISSIONS_LISTED + 2))
def test_select_ranked_records_what_omitting_each_in_order_records(
        items: list[Candidate], cap: int, before: int) -> None:
    """The kept candidates, the sources and every omission entry (listed ones and the folded
    count) equal those of omitting each candidate past the cap in CTX-5 order."""
    got, expected = Ledger(), Ledger()
    for ledger in (got, expected):  # earlier omissions of the same kind and reason
        for i in range(before):
            ledger.omit(Candidate("foreshadowing", "L2", 0, 0, f"earlier{i}", 0, 1), f"cap:{cap}")
    kept = select_ranked(list(items), cap, got, f"cap:{cap}")
    assert kept == _one_by_one(list(items), cap, expected, f"cap:{cap}")
    assert (got.sources, got.omitted) == (expected.sources, expected.omitted)
