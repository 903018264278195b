"""STYLE: `mypy --strict` holds on every room but cli/ (and tests/); ruff is clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


STRICT_ROOMS = ("messages", "novel", "store", "bus", "infra", "actors", "writers")


def test_mypy_strict_on_every_room_but_cli() -> None:
    packages = [arg for room in STRICT_ROOMS for arg in ("-p", f"novelbus.{room}")]
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", *packages], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_lint_is_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
