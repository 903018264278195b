"""A command's process always exits (OPS-5): `asyncio.run` cancels what a command left running
once, then waits for it forever, so a task whose cancel got lost (Python 3.11's wait_for, as in
nats-py's fetch) would keep it from exiting. `run` cancels again until it ends."""

from __future__ import annotations

import asyncio

import pytest

from novelbus.cli.common import run


@pytest.mark.timeout(60)
def test_a_command_leaving_a_task_deaf_to_one_cancel_still_returns() -> None:
    """OPS-5"""
    ended: list[str] = []

    async def deaf_once() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # the lost cancel
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("ended")

    async def command() -> int:
        asyncio.create_task(deaf_once(), name="deaf-once")
        await asyncio.sleep(0)
        return 7

    assert run(command()) == 7
    assert ended == ["ended"]
