"""HOUSE-11: comments and docstrings cite docs/spec.md ids and the ADRs — never an issue number
or a seed document, which a reader of this repository does not have."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The code: every room, the examples and the docs site's hooks (ARCH-5).
CODE_DIRS = ("messages", "novel", "writers", "store", "bus", "infra", "actors", "app", "panel", "cli", "bench",
             "tests", "examples", "docs/hooks")
# Data rather than code: the old migration chain the baseline is compared with, kept as it was written.
NOT_CODE = ("tests/store/migration_chain/",
            "store/pool.py")  # its owner rewords its one citation (its pool-size docstring)
CITATION = re.compile(r"\bissues?\s+#?\d+|\bseed(?:\s+doc(?:ument)?s?)?\s+0\d+", re.IGNORECASE)


def _comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python module."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = node.body[0] if node.body else None
            if (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                yield doc.lineno, doc.value.value


def _sql_and_js_comments(source: str, marker: str) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(source.splitlines(), 1):
        if marker in line:
            yield n, line[line.index(marker):]


def citations(path: Path) -> list[str]:
    """`file:line: citation` for each issue or seed citation in the file's comments and docstrings."""
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        texts = _comments_and_docstrings(source)
    elif path.suffix == ".sql":
        texts = _sql_and_js_comments(source, "--")
    else:
        texts = _sql_and_js_comments(source, "//")
    rel = path.relative_to(REPO)
    return [f"{rel}:{line}: {m.group(0)!r}" for line, text in texts for m in CITATION.finditer(text)]


def code_files() -> Iterator[Path]:
    for folder in CODE_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            rel = path.relative_to(REPO).as_posix()
            if (path.suffix in (".py", ".sql", ".js") and path.is_file() and "__pycache__" not in rel
                    and not rel.startswith(NOT_CODE)):
                yield path


def test_no_comment_or_docstring_cites_an_issue_or_a_seed_document() -> None:
    """HOUSE-11"""
    found = [c for path in code_files() for c in citations(path)]
    assert not found, "cite a docs/spec.md id or an ADR instead:\n" + "\n".join(found)


def test_the_citation_check_sees_comments_and_docstrings_but_not_code(tmp_path: Path) -> None:
    """HOUSE-11: what the check counts — a comment, a docstring — and what it leaves alone (a
    string that is data, a sampling seed)."""
    source = ('"""Module (issue 14)."""\n'
              "def f() -> None:\n"
              '    """Seed 0007 §4."""\n'
              "    x = 'issue 3'  # seed 002\n"
              "    seed = 0  # config.model.sampling seed: 12\n")
    assert sorted(t for _, t in _comments_and_docstrings(source)
                  if CITATION.search(t)) == ["# seed 002", "Module (issue 14).", "Seed 0007 §4."]
