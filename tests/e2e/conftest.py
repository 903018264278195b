"""An in-process stack (all six actors) on the session's NATS, a fresh database and a private namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from novelbus.actors.runtime import Runtime, running
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from tests.waiting import drive, settled_usage


@pytest.fixture
async def stack(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        yield rt


async def run_novel(rt: Runtime, nf: NovelFile, *, timeout: float = 120.0) -> tuple[str, list[Any]]:
    """Create a novel, run it to its end (`tests.waiting.drive`), and wait for its usage samples."""
    driven = await drive(rt, nf, timeout=timeout)
    assert isinstance(driven.final, ev.NovelFinished), f"novel did not finish: {driven.final}"
    await settled_usage(rt)
    return driven.novel_id, driven.events


