"""ARCH-1, ARCH-3, ARCH-5: the layout shows the architecture, and the boundaries hold."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ACTOR_MODULES = ["driver", "claims", "packer", "writer", "verifier", "usage"]


def _imports(path: Path) -> set[str]:
    """Imported module names, with the `novelbus.` root taken off (ARCH-6: every room is under it)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "novelbus":
                out.update(a.name for a in node.names)
            else:
                out.add(node.module)
    return {m.removeprefix("novelbus.") for m in out}


def test_arch5_top_level_layout() -> None:
    for name in ("pyproject.toml", "actors", "messages", "bus", "tests", "deploy", "store", "novel", "cli"):
        assert (REPO / name).exists(), name
    for actor in ACTOR_MODULES:  # one file per actor
        assert (REPO / "actors" / f"{actor}.py").is_file(), actor


def test_arch1_no_actor_imports_another_actors_internals() -> None:
    for actor in ACTOR_MODULES:
        imported = _imports(REPO / "actors" / f"{actor}.py")
        others = {f"actors.{o}" for o in ACTOR_MODULES if o != actor}
        assert not (imported & others), (actor, imported & others)


def test_arch3_pure_domain_does_no_io() -> None:
    """novel/ is pure: no database, bus, network, clock or randomness imports."""
    banned = {"asyncpg", "nats", "socket", "random", "time", "datetime", "asyncio", "os", "subprocess",
              "store", "bus", "actors", "openai"}
    for path in (REPO / "novel").glob("*.py"):
        roots = {m.split(".")[0] for m in _imports(path)}
        if path.name == "generate.py":  # test/bench data: random.Random(seed), the seed an argument
            roots.discard("random")
            assert "random.Random(seed)" in path.read_text()
        assert not (roots & banned), (path.name, roots & banned)


def test_bus1_messages_are_data_only() -> None:
    """messages/ imports nothing but msgspec, typing and other message/body modules."""
    allowed = {"__future__", "typing", "msgspec", "messages", "novel", "re", "dataclasses"}
    for path in (REPO / "messages").glob("*.py"):
        roots = {m.split(".")[0] for m in _imports(path)}
        assert roots <= allowed, (path.name, roots - allowed)
