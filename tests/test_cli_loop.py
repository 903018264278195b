"""PERF-2: every `novelbus` command runs on uvloop unless NOVELBUS_LOOP=asyncio; a bad choice is
refused before anything starts, naming the variable (OPS-5 exit code 2)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import uvloop

from novelbus.cli.common import loop_factory, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_perf2_the_default_loop_is_uvloop_and_asyncio_can_be_chosen() -> None:
    assert loop_factory(None) is uvloop.new_event_loop
    assert loop_factory("") is uvloop.new_event_loop
    assert loop_factory(" UVLOOP ") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None


def test_perf2_an_unknown_loop_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"NOVELBUS_LOOP='trio': expected one of uvloop, asyncio"):
        loop_factory("trio")


def test_perf2_run_uses_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOVELBUS_LOOP", raising=False)
    assert run(_loop_module()).startswith("uvloop")
    monkeypatch.setenv("NOVELBUS_LOOP", "asyncio")
    assert run(_loop_module()).startswith("asyncio")


def test_perf2_a_command_with_a_bad_loop_exits_2_before_starting_anything(tmp_path: object) -> None:
    env = {**os.environ, "NOVELBUS_LOOP": "bogus", "NOVELBUS_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "novelbus.cli.main", "status", "n-1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "NOVELBUS_LOOP='bogus'" in done.stderr
    assert not list(os.scandir(str(tmp_path)))  # no server was started, nothing written
