"""STYLE: `mypy --strict` holds on the wire contract, the pure domain and the store; ruff is clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_mypy_strict_on_messages_novel_store() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "-p", "novelbus.messages", "-p", "novelbus.novel",
                          "-p", "novelbus.store"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_lint_is_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
