"""REL-6, REL-7: a unit committed although its writer's reply failed is accounted before its novel
moves on — never left to the sweep while the novel goes on (or finishes).

The window, as the rare flake of `test_recovery_outages` showed it (writer_runs 8, commits 9, read
right after `novel.finished`): the database stopped just after a unit's commit, so the writer
could not close its run and replied with an error; the driver's settle (which finds the commit and
accounts the turn) then met asyncpg's `InternalClientError` on a connection the server had dropped,
gave up, and the retried notice moved on past the committed unit. Its turn was accounted by the
REL-7 sweep only after the lease lapsed — after the novel had finished.

Here the window is forced on the third unit, every time: the writer's run close fails as with the
database gone, and the settle's first read of the commit fails."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel

NOT_SETTLED = "interrupted (internal) and not settled"


class Window:
    """The third writer run's close fails (its commit landed); then the next read of a unit's
    commit — the driver's settle — fails once with `settle_error`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, settle_error: Exception) -> None:
        self.closes = 0
        self.settle_error: Exception | None = None
        self.forced = False
        real_close, real_read = store.finish_writer_run_with_event, store.get_commit_for_unit

        async def close(*args: Any, **kwargs: Any) -> Any:
            self.closes += 1
            if self.closes == 3:
                self.settle_error = settle_error
                raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
            return await real_close(*args, **kwargs)

        async def read(*args: Any, **kwargs: Any) -> Any:
            if self.settle_error is not None:
                error, self.settle_error, self.forced = self.settle_error, None, True
                raise error
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(store, "finish_writer_run_with_event", close)
        monkeypatch.setattr(store, "get_commit_for_unit", read)


async def accounted_in_commit_order(rt: Runtime, novel_id: str) -> None:
    """Every commit has its turn, each counted as a writer run, and the turns follow the commits:
    a turn accounted late (after later units) would carry a later turn number than its commit's."""
    pool = rt.ctx.pool
    rows = await pool.fetch(
        "SELECT c.seq, t.turn, t.outcome FROM commits c LEFT JOIN turn_ledger t"
        " ON t.novel_id = c.novel_id AND t.turn_key = c.claim_id WHERE c.novel_id = $1 ORDER BY c.seq", novel_id)
    novel = await store.get_novel(pool, novel_id)
    assert len(rows) == 9
    assert [(r["seq"], r["turn"], r["outcome"]) for r in rows] == [(r["seq"], r["seq"], "committed") for r in rows]
    assert novel.writer_runs == len(rows) == novel.turns


async def test_a_committed_unit_whose_settle_meets_a_dropped_connection_is_accounted_by_its_flow(
        stack: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """REL-7: The observed cause: `InternalClientError` is the database going away (REL-6), so the flow
    waits it out and accounts its own turn; the novel never sees the window."""
    window = Window(monkeypatch, asyncpg.InternalClientError("cannot switch to state 11; another operation (2)"
                                                             " is in progress"))
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    assert window.forced  # the window was hit
    await accounted_in_commit_order(stack, novel_id)  # right at novel.finished, no sweep needed
    assert not [r for r in caplog.records if NOT_SETTLED in r.getMessage()]


async def test_a_committed_unit_whose_settle_fails_is_accounted_before_its_novel_moves_on(
        stack: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """REL-7: Whatever makes the settle fail, the driver does not move past a unit it saw claimed: the
    novel's next step settles that flow first, so the turn is accounted before the next unit."""
    caplog.set_level(logging.WARNING, logger="novelbus.actors.driver")
    window = Window(monkeypatch, RuntimeError("settle failed (injected)"))
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    assert window.forced
    assert [r for r in caplog.records if NOT_SETTLED in r.getMessage()]  # the flow itself gave up
    await accounted_in_commit_order(stack, novel_id)
