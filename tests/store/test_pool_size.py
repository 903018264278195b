"""PERF-2: a process's database pool holds 2 × cores + 1 connections unless
`NOVELBUS_DB_POOL_SIZE` says otherwise; a malformed value is refused naming the variable, before
anything connects (the CLI's exit 2 for it: tests/test_settings.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from novelbus.actors.runtime import connected
from novelbus.messages.subjects import Subjects
from novelbus.store.pool import ENV_POOL_SIZE, cores, pool_size

REPO = Path(__file__).resolve().parents[2]


def test_the_pool_is_twice_the_cores_plus_one_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """PERF-2"""
    monkeypatch.delenv(ENV_POOL_SIZE, raising=False)
    assert cores() >= 1
    assert pool_size() == 2 * cores() + 1
    monkeypatch.setenv(ENV_POOL_SIZE, " ")  # blank: the default
    assert pool_size() == 2 * cores() + 1


@pytest.mark.parametrize("value", ["1", "7", "200"])
def test_the_pool_size_setting_wins(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """PERF-2"""
    monkeypatch.setenv(ENV_POOL_SIZE, value)
    assert pool_size() == int(value)


@pytest.mark.parametrize("value", ["0", "201", "-3", "4.5", "five", "1e3"])
def test_a_malformed_pool_size_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """PERF-2"""
    monkeypatch.setenv(ENV_POOL_SIZE, value)
    with pytest.raises(ValueError, match=rf"^{ENV_POOL_SIZE} must be a whole number from 1 to 200, got '"):
        pool_size()


async def test_a_process_connects_with_that_many(dsn: str, nats_url: str, namespace: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """PERF-2"""
    monkeypatch.delenv(ENV_POOL_SIZE, raising=False)
    async with connected(nats_url, dsn, subjects=Subjects(namespace)) as ctx:
        assert ctx.pool.get_max_size() == 2 * cores() + 1
    monkeypatch.setenv(ENV_POOL_SIZE, "3")
    async with connected(nats_url, dsn, subjects=Subjects(namespace)) as ctx:
        assert ctx.pool.get_max_size() == 3
        # more statements at once than connections: they queue in the process and all complete
        assert await asyncio.gather(*(ctx.pool.fetchval("SELECT $1::int FROM pg_sleep(0.05)", i)
                                      for i in range(12))) == list(range(12))
