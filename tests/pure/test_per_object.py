"""Issue 14: a snapshot's (or an outline's) scene progress is computed once per object and
shared by the decisions that ask for it (`novel.next_work.per_object`)."""

from __future__ import annotations

from novelbus.novel.next_work import per_object


class Frozen:
    def __init__(self, value: int) -> None:
        self.value = value


def test_perf2_once_per_object_by_identity_and_bounded() -> None:
    calls: list[int] = []

    @per_object
    def double(x: Frozen) -> list[int]:
        calls.append(x.value)
        return [x.value * 2]

    a, b = Frozen(1), Frozen(1)
    first = double(a)
    assert double(a) is first and calls == [1]  # the same object: computed once, shared
    assert double(b) == first and double(b) is not first and calls == [1, 1]  # equal is not the same
    others = [Frozen(i) for i in range(10)]
    for o in others:
        double(o)
    assert len(calls) == 12
    double(a)  # pushed out by the eight objects read since: computed again
    assert calls[-1] == 1 and len(calls) == 13
    double(others[-1])  # still held
    assert len(calls) == 13
