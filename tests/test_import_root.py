"""ARCH-6: `novelbus` is the only import root; the design's top-level folders stay where they are."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import novelbus

REPO = Path(__file__).resolve().parents[1]


def _python_files() -> list[Path]:
    return [p for room in novelbus.ROOMS for p in (REPO / room).rglob("*.py")]


def test_rooms_are_top_level_folders_linked_under_the_root() -> None:
    """ARCH-6"""
    for room in novelbus.ROOMS:
        assert (REPO / room / "__init__.py").is_file(), room
        link = REPO / "novelbus" / room
        assert link.is_symlink() and link.resolve() == (REPO / room).resolve(), room


def test_no_module_imports_a_room_outside_the_root() -> None:
    """ARCH-6"""
    bare = set(novelbus.ROOMS)
    offenders = []
    for path in [*_python_files(), *(REPO / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in bare]
    assert not offenders, offenders


def test_loggers_are_named_by_module() -> None:
    """ARCH-6 (OPS-8: the logging setup alone names loggers, those a setting gives a level)"""
    for path in _python_files():
        if path == REPO / "bus" / "logs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger" and node.args:
                arg = node.args[0]
                assert isinstance(arg, ast.Name) and arg.id == "__name__", f"{path.relative_to(REPO)}"


@pytest.mark.timeout(600)
def test_wheel_installs_only_novelbus_and_runs_from_elsewhere(tmp_path: Path) -> None:
    """ARCH-6: A non-editable wheel: top-level names are exactly `novelbus`; the command runs from another
    directory (the sample novel and migrations come from the installed package, not the checkout)."""
    # Built from a copy of the tree without build leftovers: a stale build/ would leak modules that
    # no longer exist into the wheel.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".wheels", ".novelbus", "build", "out", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis", "docs"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("novelbus-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = next(n for n in names if n.endswith("top_level.txt"))
        assert z.read(top_level).decode().split() == ["novelbus"]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"novelbus"}
    assert "novelbus/store/migrations/001_init.sql" in names or any(
        n.startswith("novelbus/store/migrations/") and n.endswith(".sql") for n in names)
    assert "novelbus/novel/samples/sample.json" in names
    # Install the wheel's files into a private target (no dependencies: they are in this venv already)
    # and run from a directory that holds no checkout, with the checkout off the path.
    target = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONSAFEPATH": "1"}
    code = "import novelbus; print(novelbus.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith(str(target)), out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "novelbus", "demo", "--home", str(elsewhere / "home")],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished" in out.stdout and (elsewhere / "home").is_dir(), out.stdout
