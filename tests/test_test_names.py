"""HOUSE-5: test names say the behaviour they hold; a requirement id goes at the start of the
docstring (`\"\"\"OPS-1: …\"\"\"`), never into the name (`test_ops1_…`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ID = re.compile(r"\b([A-Z]+)-(\d+)\b")


def defined_ids() -> set[str]:
    """Lower-cased ids as a name would spell them (`OPS-1` -> `ops1`), from docs/spec.md."""
    return {f"{m.group(1).lower()}{m.group(2)}" for m in ID.finditer((REPO / "docs" / "spec.md").read_text())}


def test_no_test_name_starts_with_a_requirement_id() -> None:
    ids = defined_ids() | {"issue14"}
    named: list[str] = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                first = node.name.removeprefix("test_").split("_")[0]
                if first in ids or re.fullmatch(r"issue\d+|spec\d+", first):
                    named.append(f"{path.relative_to(REPO)}::{node.name}")
    assert not named, ("name the behaviour; put the id at the start of the docstring: " + ", ".join(named))
