"""HOUSE-2: every requirement id the code, the tests and the docs cite is defined in docs/spec.md.

A requirement id is a family of capitals, a hyphen and a number (`REL-7`, `CTX-4`); ranges
(`CTX-1..9`) and lists (`MODEL-2/3`) cite every id they span. Names of that shape that are not
requirements (`SHA-256`, `UTF-8`, `ISO-8859-1`, …) are listed in NOT_REQUIREMENTS.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "spec.md"

# Families of the form `XXX-n` that are standards or other projects' numbers, not ours.
NOT_REQUIREMENTS = frozenset({"SHA", "UTF", "ISO", "AVX", "ADR", "CVE", "RFC", "PEP", "UA"})

CITED = re.compile(r"\b([A-Z]{2,6})-(\d+)((?:\s?(?:\.\.|/)\s?\d+)*)\b")
DEFINED = re.compile(r"^- \*\*([A-Z]{2,6}-\d+)\*\*", re.M)

TEXT_SUFFIXES = {".py", ".sql", ".md", ".toml", ".yml", ".yaml", ".conf", ".sh", ".js", ".css",
                 ".html", ".txt", ".cfg", ".ini"}
TEXT_NAMES = {"Makefile", "Procfile", "Dockerfile", "run"}
SKIPPED_DIRS = {"site", "build", "out", "ab-runs", "node_modules", "__pycache__", "screenshots"}


def cited_ids(text: str) -> set[str]:
    """The requirement ids a text cites, ranges and lists expanded."""
    found: set[str] = set()
    for family, first, rest in CITED.findall(text):
        if family in NOT_REQUIREMENTS:
            continue
        found.add(f"{family}-{first}")
        for separator, number in re.findall(r"(\.\.|/)\s?(\d+)", rest):
            start = int(first) if separator == ".." else int(number)
            found.update(f"{family}-{n}" for n in range(start, int(number) + 1))
    return found


def defined_ids(spec_text: str) -> list[str]:
    return DEFINED.findall(spec_text)


def project_texts() -> list[Path]:
    """The repository's own text files: sources, tests, docs, deployment, build files. Hidden
    folders (the venv, caches) and generated output are skipped, and symlinks are not followed
    (novelbus/<room> points at the rooms themselves)."""
    paths = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if (not d.startswith(".") or d == ".ci") and d not in SKIPPED_DIRS
                   and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder, name)
            if path.suffix in TEXT_SUFFIXES or name in TEXT_NAMES:
                paths.append(path)
    return paths


def test_ranges_and_lists_cite_every_id_they_span() -> None:
    """HOUSE-2: the scanner reads `CTX-1..3`, `MODEL-2/3` and skips standards' numbers."""
    assert cited_ids("CTX-1..3, MODEL-2/3; REL-7") == {"CTX-1", "CTX-2", "CTX-3", "MODEL-2",
                                                       "MODEL-3", "REL-7"}
    assert cited_ids("SHA-256 of UTF-8 text, ISO-8859-1, AVX-512") == set()
    assert cited_ids("USE-1/2 and PLAN-3..5") == {"USE-1", "USE-2", "PLAN-3", "PLAN-4", "PLAN-5"}


def test_every_cited_requirement_id_is_defined_in_the_spec() -> None:
    """HOUSE-2: a requirement id cited anywhere in the project is defined in docs/spec.md."""
    defined = set(defined_ids(SPEC.read_text(encoding="utf-8")))
    where: dict[str, list[str]] = defaultdict(list)
    this_file = Path(__file__).resolve()
    for path in project_texts():
        if path.resolve() == this_file:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for rid in cited_ids(line) - defined:
                where[rid].append(f"{path.relative_to(ROOT)}:{n}")
    assert not where, "requirement ids cited but not defined in docs/spec.md:\n" + "\n".join(
        f"  {rid}: {', '.join(places[:3])}{' …' if len(places) > 3 else ''}"
        for rid, places in sorted(where.items()))


def test_each_requirement_id_is_defined_once() -> None:
    """HOUSE-2: docs/spec.md defines each id once, so a citation means one thing."""
    ids = defined_ids(SPEC.read_text(encoding="utf-8"))
    twice = sorted({rid for rid in ids if ids.count(rid) > 1})
    assert not twice, f"defined more than once in docs/spec.md: {twice}"
