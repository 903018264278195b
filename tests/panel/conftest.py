"""The web panel (OPS-2) served in-process beside all six actors, on the session's NATS and a fresh
database; and a real headless Chromium (Debian's `chromium`, driven by the playwright wheel)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from novelbus.actors.runtime import Runtime, running
from novelbus.messages.subjects import Subjects
from novelbus.panel.serve import PanelOptions, panel_server

CHROMIUM = Path(os.environ.get("NOVELBUS_CHROMIUM", "/usr/bin/chromium"))
# Its own browser download cannot work here: the system Chromium, with no network side-traffic.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]  # containers often have a tiny /dev/shm


@dataclass
class Panel:
    rt: Runtime
    url: str


@pytest.fixture
async def panel(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Panel]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as rt:
        async with panel_server(rt.ctx, PanelOptions(port=0)) as url:
            yield Panel(rt, url)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Headless Chromium; `make test` installs it, so there a missing browser fails the test."""
    if not CHROMIUM.exists():
        if os.environ.get("NOVELBUS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing: install Debian's `chromium` (make test does)")
        pytest.skip(f"{CHROMIUM} is missing: install Debian's `chromium` (make test does)")
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the test run saves its screenshots: $NOVELBUS_SCREENSHOTS, else a temporary folder."""
    path = Path(os.environ.get("NOVELBUS_SCREENSHOTS") or tmp_path / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
