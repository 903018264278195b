"""PERF-2: a snapshot's (or an outline's) scene progress is computed once per object and
shared by the decisions that ask for it (`novel.next_work.per_object`)."""

from __future__ import annotations

from novelbus.novel.next_work import per_object


class Frozen:
    def __init__(self, value: int) -> None:
        self.value = value


def test_once_per_object_by_identity_and_bounded() -> None:
    """PERF-2"""
    calls: list[int] = []

    @per_object
    def double(x: Frozen) -> list[int]:
        calls.append(x.value)
        return [x.value * 2]

    a, b = Frozen(1), Frozen(1)
    first = double(a)
    assert double(a) is first and calls == [1]  # the same object: computed once, shared
    assert double(b) == first and double(b) is not first and calls == [1, 1]  # equal is not the same
    others = [Frozen(i) for i in range(70)]
    for o in others:
        double(o)
    assert len(calls) == 72
    double(a)  # pushed out by the 64 objects read since: computed again
    assert calls[-1] == 1 and len(calls) == 73
    double(others[-1])  # still held
    assert len(calls) == 73


def test_scene_progress_once_per_snapshot() -> None:
    """PERF-2: The driver's and the tools' questions about one snapshot share one pass over its commits:
    the same snapshot gives the same (immutable) answers, a new one is computed afresh."""
    from novelbus.novel.next_work import completed_chapters, finished_scenes, live_commits
    from tests.pure.test_next_work import done, fresh, write

    s = write(fresh(), done())
    assert live_commits(s) is live_commits(s)
    assert finished_scenes(s) is finished_scenes(s) and isinstance(finished_scenes(s), frozenset)
    assert completed_chapters(s) is completed_chapters(s) and isinstance(completed_chapters(s), tuple)
    t = write(s, done())
    assert len(live_commits(t)) == len(live_commits(s)) + 1
    assert finished_scenes(t) > finished_scenes(s)
