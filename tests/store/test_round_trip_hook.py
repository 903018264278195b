"""PERF-1, HOUSE-3: the store counts its round trips through a hook whoever measures installs
(`set_round_trip_hook`); it imports nothing of the bus, and with no hook it counts nothing."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import asyncpg

from novelbus import store
from novelbus.bus import tally


class Recorder:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.spans: list[str] = []

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    @contextlib.contextmanager
    def span(self, label: str) -> Iterator[None]:
        self.spans.append(label)
        yield


async def test_an_installed_hook_counts_the_stores_transactions_and_statements(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """One store call in one transaction: the hook sees the transaction and each statement, with
    a `db` span around every statement; uninstalled, nothing is counted."""
    recorder = Recorder()
    store.set_round_trip_hook(recorder)
    try:
        await store.get_novel(pool, novel_id)
    finally:
        store.set_round_trip_hook(tally)  # the suite's own hook (tests/conftest.py)
    assert recorder.counts["db_round_trips"] >= 1
    assert recorder.spans == ["db"] * recorder.counts["db_round_trips"]
    store.set_round_trip_hook(None)
    try:
        before = tally.snapshot()
        await store.get_novel(pool, novel_id)
        assert tally.snapshot() == before
    finally:
        store.set_round_trip_hook(tally)
